"""The compiled lvmd protocol matches upstream lvmd.proto (spec §2.1, §2.2), on the wire too."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor

import topolvm.proto.lvmd_pb2 as pb
import topolvm.proto.lvmd_pb2_grpc as pb_grpc

STRING = FieldDescriptor.TYPE_STRING
UINT32 = FieldDescriptor.TYPE_UINT32
INT64 = FieldDescriptor.TYPE_INT64
UINT64 = FieldDescriptor.TYPE_UINT64
DOUBLE = FieldDescriptor.TYPE_DOUBLE
MESSAGE = FieldDescriptor.TYPE_MESSAGE


class F(NamedTuple):
    name: str
    number: int
    type: int
    repeated: bool = False
    message: str | None = None  # full name of the message type


def rep(name: str, number: int, type_: int, message: str | None = None) -> F:
    return F(name, number, type_, True, message)


# Spec §2.1, message by message.
SPEC: dict[str, list[F]] = {
    "Empty": [],
    "LogicalVolume": [
        F("name", 1, STRING),
        F("dev_major", 3, UINT32),
        F("dev_minor", 4, UINT32),
        rep("tags", 5, STRING),
        F("size_bytes", 6, INT64),
        F("path", 7, STRING),
        F("attr", 8, STRING),
    ],
    "CreateLVRequest": [
        F("name", 1, STRING),
        rep("tags", 3, STRING),
        F("device_class", 4, STRING),
        F("lvcreate_option_class", 5, STRING),
        F("size_bytes", 6, INT64),
    ],
    "CreateLVResponse": [F("volume", 1, MESSAGE, message="proto.LogicalVolume")],
    "RemoveLVRequest": [F("name", 1, STRING), F("device_class", 2, STRING)],
    "CreateLVSnapshotRequest": [
        F("name", 1, STRING),
        rep("tags", 2, STRING),
        F("device_class", 3, STRING),
        F("source_volume", 4, STRING),
        F("access_type", 6, STRING),
        F("size_bytes", 7, INT64),
    ],
    "CreateLVSnapshotResponse": [F("snapshot", 1, MESSAGE, message="proto.LogicalVolume")],
    "ResizeLVRequest": [
        F("name", 1, STRING),
        F("size_bytes", 7, INT64),
        F("device_class", 3, STRING),
    ],
    "ResizeLVResponse": [F("size_bytes", 1, INT64)],
    "GetLVListRequest": [F("device_class", 1, STRING)],
    "GetLVListResponse": [rep("volumes", 1, MESSAGE, "proto.LogicalVolume")],
    "GetFreeBytesRequest": [F("device_class", 1, STRING)],
    "GetFreeBytesResponse": [F("free_bytes", 1, UINT64)],
    "WatchResponse": [F("free_bytes", 1, UINT64), rep("items", 2, MESSAGE, "proto.WatchItem")],
    "ThinPoolItem": [
        F("data_percent", 1, DOUBLE),
        F("metadata_percent", 2, DOUBLE),
        F("overprovision_bytes", 3, UINT64),
        F("size_bytes", 4, UINT64),
    ],
    "WatchItem": [
        F("free_bytes", 1, UINT64),
        F("device_class", 2, STRING),
        F("size_bytes", 3, UINT64),
        F("thin_pool", 4, MESSAGE, message="proto.ThinPoolItem"),
    ],
}

RESERVED: dict[str, list[int]] = {
    "LogicalVolume": [2],
    "CreateLVRequest": [2],
    "CreateLVSnapshotRequest": [5],
    "ResizeLVRequest": [2],
}


class M(NamedTuple):
    service: str
    name: str
    input: str
    output: str
    server_streaming: bool = False


# Spec §2.2
METHODS = [
    M("LVService", "CreateLV", "CreateLVRequest", "CreateLVResponse"),
    M("LVService", "RemoveLV", "RemoveLVRequest", "Empty"),
    M("LVService", "ResizeLV", "ResizeLVRequest", "ResizeLVResponse"),
    M("LVService", "CreateLVSnapshot", "CreateLVSnapshotRequest", "CreateLVSnapshotResponse"),
    M("VGService", "GetLVList", "GetLVListRequest", "GetLVListResponse"),
    M("VGService", "GetFreeBytes", "GetFreeBytesRequest", "GetFreeBytesResponse"),
    M("VGService", "Watch", "Empty", "WatchResponse", server_streaming=True),
]

SPEC_FIELDS = [(msg, f) for msg, fields in SPEC.items() for f in fields]


def file_proto() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(proto)
    return proto


def message_proto(name: str) -> descriptor_pb2.DescriptorProto:
    (found,) = [m for m in file_proto().message_type if m.name == name]
    return found


def message(name: str) -> Descriptor:
    return pb.DESCRIPTOR.message_types_by_name[name]


# --- descriptors -------------------------------------------------------------------------------


def test_package_and_syntax() -> None:
    assert pb.DESCRIPTOR.package == "proto"
    proto = file_proto()
    assert proto.package == "proto"
    assert proto.syntax == "proto3"
    assert proto.options.go_package == "github.com/topolvm/topolvm/pkg/lvmd/proto"


def test_exactly_the_spec_messages() -> None:
    assert set(pb.DESCRIPTOR.message_types_by_name) == set(SPEC)
    for name in SPEC:
        assert message(name).full_name == f"proto.{name}"


@pytest.mark.parametrize(
    ("msg", "spec"), SPEC_FIELDS, ids=[f"{m}.{f.name}" for m, f in SPEC_FIELDS]
)
def test_field(msg: str, spec: F) -> None:
    field = message(msg).fields_by_name[spec.name]
    assert field.number == spec.number
    assert field.type == spec.type
    assert field.is_repeated is spec.repeated
    if spec.message is None:
        assert field.message_type is None
    else:
        assert field.message_type is not None
        assert field.message_type.full_name == spec.message
    # The same from the serialized descriptor: label and type name as protoc wrote them.
    (raw,) = [f for f in message_proto(msg).field if f.name == spec.name]
    assert raw.number == spec.number
    assert raw.type == spec.type
    expected_label = (
        descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
        if spec.repeated
        else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    )
    assert raw.label == expected_label
    assert raw.type_name == (f".{spec.message}" if spec.message else "")
    assert not raw.HasField("oneof_index")
    assert not raw.proto3_optional


@pytest.mark.parametrize("msg", list(SPEC))
def test_no_fields_beyond_the_spec(msg: str) -> None:
    fields = {(f.name, f.number) for f in message(msg).fields}
    assert fields == {(f.name, f.number) for f in SPEC[msg]}
    assert len(message_proto(msg).field) == len(SPEC[msg])
    assert not message(msg).nested_types
    assert not message(msg).enum_types
    assert not message(msg).oneofs


@pytest.mark.parametrize("msg", list(SPEC))
def test_reserved_numbers(msg: str) -> None:
    proto = message_proto(msg)
    reserved = [n for r in proto.reserved_range for n in range(r.start, r.end)]
    assert reserved == RESERVED.get(msg, [])
    assert list(proto.reserved_name) == []


def test_no_enums_or_extensions() -> None:
    proto = file_proto()
    assert len(proto.enum_type) == 0
    assert len(proto.extension) == 0
    assert list(proto.dependency) == []


def test_exactly_the_spec_services() -> None:
    services = pb.DESCRIPTOR.services_by_name
    assert set(services) == {"LVService", "VGService"}
    for name, service in services.items():
        assert service.full_name == f"proto.{name}"
        assert [m.name for m in service.methods] == [x.name for x in METHODS if x.service == name]


@pytest.mark.parametrize("spec", METHODS, ids=[f"{m.service}.{m.name}" for m in METHODS])
def test_method(spec: M) -> None:
    method = pb.DESCRIPTOR.services_by_name[spec.service].methods_by_name[spec.name]
    assert method.full_name == f"proto.{spec.service}.{spec.name}"
    assert method.input_type.full_name == f"proto.{spec.input}"
    assert method.output_type.full_name == f"proto.{spec.output}"
    (service,) = [s for s in file_proto().service if s.name == spec.service]
    (raw,) = [m for m in service.method if m.name == spec.name]
    assert raw.input_type == f".proto.{spec.input}"
    assert raw.output_type == f".proto.{spec.output}"
    assert raw.server_streaming is spec.server_streaming
    assert raw.client_streaming is False


class _Recorder:
    """Stands in for a grpc.Channel and records the method paths a stub registers."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}

    def _record(self, kind: str) -> Callable[..., object]:
        def register(path: str, *args: Any, **kwargs: Any) -> object:
            self.paths[path] = kind
            return object()

        return register

    def __getattr__(self, kind: str) -> Callable[..., object]:
        return self._record(kind)


def test_stub_method_paths() -> None:
    recorder = _Recorder()
    channel = cast(grpc.Channel, recorder)
    pb_grpc.LVServiceStub(channel)
    pb_grpc.VGServiceStub(channel)
    expected = {
        f"/proto.{m.service}/{m.name}": "unary_stream" if m.server_streaming else "unary_unary"
        for m in METHODS
    }
    assert recorder.paths == expected


# --- wire format: bytes as upstream's Go implementation writes them ----------------------------


def varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 negatives are 10-byte two's complement varints
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def vint(number: int, value: int) -> bytes:
    return key(number, 0) + varint(value)


def ld(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return key(number, 2) + varint(len(data)) + data


def f64(number: int, value: float) -> bytes:
    return key(number, 1) + struct.pack("<d", value)


def test_varint_helper() -> None:
    assert varint(0) == b"\x00"
    assert varint(1) == b"\x01"
    assert varint(300) == b"\xac\x02"
    assert varint(-1) == b"\xff" * 9 + b"\x01"


CREATE_LV = (
    ld(1, "pvc-uid")
    + ld(3, "a")
    + ld(3, "b=c")
    + ld(4, "ssd")
    + ld(5, "raid1")
    + vint(6, 1073741824)
)


def test_create_lv_request_from_wire() -> None:
    request = pb.CreateLVRequest.FromString(CREATE_LV)
    assert request.name == "pvc-uid"
    assert list(request.tags) == ["a", "b=c"]
    assert request.device_class == "ssd"
    assert request.lvcreate_option_class == "raid1"
    assert request.size_bytes == 1073741824


def test_create_lv_request_to_wire() -> None:
    request = pb.CreateLVRequest(
        name="pvc-uid",
        tags=["a", "b=c"],
        device_class="ssd",
        lvcreate_option_class="raid1",
        size_bytes=1073741824,
    )
    assert request.SerializeToString(deterministic=True) == CREATE_LV


def test_old_size_gb_field_is_ignored() -> None:
    # A pre-size_bytes client sends the retired `uint64 size_gb = 2`: it must not land in a field.
    request = pb.CreateLVRequest.FromString(vint(2, 5) + ld(1, "x") + vint(6, 4096))
    assert request.name == "x"
    assert request.size_bytes == 4096
    assert list(request.tags) == []
    assert request.device_class == ""


def test_field_order_on_the_wire_does_not_matter() -> None:
    request = pb.CreateLVRequest.FromString(vint(6, 8192) + ld(4, "thin") + ld(1, "n"))
    assert (request.name, request.device_class, request.size_bytes) == ("n", "thin", 8192)


def test_default_values_are_not_written() -> None:
    assert pb.CreateLVRequest().SerializeToString() == b""
    assert pb.Empty().SerializeToString() == b""
    assert pb.CreateLVRequest.FromString(b"") == pb.CreateLVRequest()


def test_snapshot_request_from_wire() -> None:
    data = (
        ld(1, "snap")
        + ld(2, "t")
        + ld(3, "thin")
        + ld(4, "src-uid")
        + vint(5, 1)  # retired size_gb
        + ld(6, "ro")
        + vint(7, 2 << 30)
    )
    request = pb.CreateLVSnapshotRequest.FromString(data)
    assert request.name == "snap"
    assert list(request.tags) == ["t"]
    assert request.device_class == "thin"
    assert request.source_volume == "src-uid"
    assert request.access_type == "ro"
    assert request.size_bytes == 2 << 30


def test_resize_request_from_wire() -> None:
    data = ld(1, "lv") + vint(2, 3) + ld(3, "ssd") + vint(7, 3 << 30)
    request = pb.ResizeLVRequest.FromString(data)
    assert (request.name, request.device_class, request.size_bytes) == ("lv", "ssd", 3 << 30)


def test_remove_request_from_wire() -> None:
    request = pb.RemoveLVRequest.FromString(ld(1, "lv") + ld(2, "ssd"))
    assert (request.name, request.device_class) == ("lv", "ssd")


def test_int64_size_is_plain_varint() -> None:
    # int64, not sint64: -1 is ten bytes, 1 GiB is the plain varint.
    assert pb.ResizeLVResponse(size_bytes=-1).SerializeToString() == vint(1, -1)
    assert pb.ResizeLVResponse.FromString(vint(1, -1)).size_bytes == -1
    assert pb.ResizeLVResponse(size_bytes=1 << 30).SerializeToString() == vint(1, 1 << 30)


def test_create_lv_response_to_wire() -> None:
    response = pb.CreateLVResponse(
        volume=pb.LogicalVolume(name="lv", size_bytes=1 << 30, dev_major=254, dev_minor=3)
    )
    volume = ld(1, "lv") + vint(3, 254) + vint(4, 3) + vint(6, 1 << 30)
    assert response.SerializeToString(deterministic=True) == ld(1, volume)


def test_lv_list_from_wire() -> None:
    lv1 = (
        ld(1, "thick1")
        + vint(3, 254)
        + vint(4, 3)
        + ld(5, "bar")
        + ld(5, "foo")
        + vint(6, 1 << 30)
        + ld(7, "/dev/myvg1/thick1")
        + ld(8, "owi-a-s---")
    )
    lv2 = ld(1, "inactive1") + ld(5, "") + vint(6, 8 << 20) + ld(8, "-wi-------")
    response = pb.GetLVListResponse.FromString(ld(1, lv1) + ld(1, lv2))
    first, second = response.volumes
    assert first.name == "thick1"
    assert (first.dev_major, first.dev_minor) == (254, 3)
    assert list(first.tags) == ["bar", "foo"]
    assert first.size_bytes == 1 << 30
    assert first.path == "/dev/myvg1/thick1"
    assert first.attr == "owi-a-s---"
    assert second.name == "inactive1"
    assert (second.dev_major, second.dev_minor) == (0, 0)
    assert list(second.tags) == [""]
    # Our encoding of the same list is byte-identical.
    assert response.SerializeToString(deterministic=True) == ld(1, lv1) + ld(1, lv2)


def test_free_bytes_is_unsigned_64_bit() -> None:
    big = (1 << 64) - 1
    assert pb.GetFreeBytesResponse.FromString(vint(1, big)).free_bytes == big
    assert pb.GetFreeBytesResponse(free_bytes=big).SerializeToString() == vint(1, big)


def test_watch_response_from_wire() -> None:
    pool = f64(1, 12.5) + f64(2, 11.33) + vint(3, 21474836480) + vint(4, 4294967296)
    thin_item = vint(1, 11685330944) + ld(2, "ssd-thin") + vint(3, 17175674880) + ld(4, pool)
    thick_item = vint(1, 947912704) + ld(2, "ssd") + vint(3, 17175674880)
    data = vint(1, 947912704) + ld(2, thin_item) + ld(2, thick_item)
    response = pb.WatchResponse.FromString(data)
    assert response.free_bytes == 947912704
    thin, thick = response.items
    assert thin.device_class == "ssd-thin"
    assert thin.free_bytes == 11685330944
    assert thin.size_bytes == 17175674880
    assert thin.HasField("thin_pool")
    assert thin.thin_pool.data_percent == 12.5
    assert thin.thin_pool.metadata_percent == 11.33
    assert thin.thin_pool.overprovision_bytes == 21474836480
    assert thin.thin_pool.size_bytes == 4294967296
    assert thick.device_class == "ssd"
    assert thick.free_bytes == 947912704
    assert not thick.HasField("thin_pool")
    assert response.SerializeToString(deterministic=True) == data

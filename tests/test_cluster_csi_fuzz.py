"""Seeded fuzzing (hypothesis) of the CSI requests, against the real topolvm-controller (the
session's, on the real API server) and a real topolvm-node on real LVM (a UML node): volume
and snapshot ids, names, paths, parameters, capabilities, capacity ranges, topologies and
content sources of any shape. The property: every answer is a success or one of the codes the
CSI spec gives for a bad or impossible request, and neither daemon logs an unexpected
exception. What a valid request happens to create is deleted again.

Paths reach the node's mount code; they are kept under a scratch folder of the guest or made
invalid (relative, with '..' or NUL), so that no fuzzed unpublish unmounts the guest's own
filesystems (it would: an unpublish unmounts what is mounted at its target, as upstream's)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.umlnode import UmlNode
from tests.fuzz_helpers import fuzz as fuzz_settings
from tests.lvm_fixtures import THICK, THIN
from tests.provisioning import shared_nodes
from topolvm.constants import NORMAL
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import csi_pb2_grpc as csi_grpc

pytestmark = pytest.mark.cluster
fuzz = fuzz_settings(int(os.environ.get("TOPOLVM_CSI_FUZZ_EXAMPLES", "60")))
C = grpc.StatusCode
ALLOWED = {C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND, C.ALREADY_EXISTS, C.RESOURCE_EXHAUSTED,
           C.OUT_OF_RANGE, C.FAILED_PRECONDITION, C.UNAVAILABLE, C.DEADLINE_EXCEEDED,
           C.UNIMPLEMENTED, C.ABORTED}  # fmt: skip
SCRATCH = "/run/tmp/csi-fuzz"
Mode = csi.VolumeCapability.AccessMode


def _pool(node: UmlNode) -> None:
    node.lvm("lvcreate", "-T", "vg1/pool0", "-L", "1g")


@pytest.fixture(scope="module")
def fuzz_node(
    control_plane: ControlPlane, driver: DriverStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[UmlNode]:
    with shared_nodes(control_plane, tmp_path_factory.mktemp("csifuzz"), "csifuzz", [4],
                      [THICK, THIN], prepare=_pool, kubelet=False) as [node]:  # fmt: skip
        node.exec("mkdir", "-p", SCRATCH)
        yield node
        control_plane.kubectl("delete", "logicalvolumes.topolvm.io", "--all", "--wait=false",
                              check=False)  # fmt: skip


def _call(target: str, stub: str, method: str, request: Any) -> C:
    with grpc.insecure_channel(target) as channel:
        service = getattr(csi_grpc, stub)(channel)
        try:
            getattr(service, method)(request, timeout=5)
        except grpc.RpcError as e:
            return e.code()
    return C.OK


texts = st.text(max_size=40) | st.sampled_from(["", "pvc-x", "-rf", "a" * 300, "a/../b", "\x00"])
ids = texts | st.uuids().map(str)
sizes = st.integers(-(2**63), 2**63 - 1) | st.integers(0, 256 << 20)
params = st.dictionaries(
    st.sampled_from([NORMAL.device_class_param, NORMAL.lvcreate_option_class_param,
                     NORMAL.snapshot_placement_param, NORMAL.snapshot_node_selector_param,
                     "topolvm.io/restore-placement", "csi.storage.k8s.io/fstype",
                     "csi.storage.k8s.io/pvc/name", "csi.storage.k8s.io/pvc/namespace"])
    | st.text(max_size=20),
    st.sampled_from(["ssd", "thin", "", "other-node", "source-node", "anywhere", "a=b", "x,,=",
                     "nope"])
    | st.text(max_size=20),
    max_size=4,
)  # fmt: skip
# a VolumeAttributesClass's parameters (docs/qos.md): our keys, OpenEBS's, and anything
mutable = st.dictionaries(
    st.sampled_from(["topolvm.io/write-bytes-per-second", "topolvm.io/iops-per-gib",
                     "topolvm.io/read-iops", "qosIopsLimit", "qosBandwithPerSec"])
    | st.text(max_size=20),
    st.sampled_from(["20Mi", "max", "0", "1", "1.5", "-3", "1e40", "500m", "2", "7000Mi", ""])
    | st.integers(-(2**70), 2**70).map(str) | st.text(max_size=12),
    max_size=4,
)  # fmt: skip
capabilities = st.lists(
    st.builds(
        lambda block, fs, flags, mode: csi.VolumeCapability(
            block=csi.VolumeCapability.BlockVolume() if block else None,
            mount=None if block else csi.VolumeCapability.MountVolume(fs_type=fs,
                                                                        mount_flags=flags),
            access_mode=Mode(mode=mode),
        ),
        st.booleans(), st.sampled_from(["xfs", "ext4", "btrfs", "", "vfat", "-o"]) | texts,
        st.lists(st.sampled_from(["noatime", "rw", "bind", "remount", "x=y,z"]) | texts,
                 max_size=3),
        st.integers(0, 8),
    ),
    max_size=3,
)  # fmt: skip


def _topologies(node: str) -> Any:
    segment = st.dictionaries(st.sampled_from([NORMAL.topology_key, "zone"]),
                              st.sampled_from([node, "nowhere", ""]), max_size=2)  # fmt: skip
    return st.lists(segment.map(lambda s: csi.Topology(segments=s)), max_size=2)


def _sources(existing: list[str]) -> Any:
    known = st.sampled_from(existing) if existing else ids
    return st.one_of(
        st.none(),
        st.builds(lambda i: csi.VolumeContentSource(
            snapshot=csi.VolumeContentSource.SnapshotSource(snapshot_id=i)), ids | known),
        st.builds(lambda i: csi.VolumeContentSource(
            volume=csi.VolumeContentSource.VolumeSource(volume_id=i)), ids | known),
        st.just(csi.VolumeContentSource()),
    )  # fmt: skip


def test_the_controller_answers_any_request_with_a_csi_code(
    fuzz_node: UmlNode, driver: DriverStack
) -> None:
    target = f"unix://{driver.socket}"
    made: list[str] = []
    node = fuzz_node.name

    @fuzz
    @given(texts, sizes, sizes, capabilities, params, _topologies(node), _topologies(node),
           _sources(made), mutable)  # fmt: skip
    def create(name: str, required: int, limit: int, caps: Any, parameters: Any,
               requisite: Any, preferred: Any, source: Any, attributes: Any) -> None:  # fmt: skip
        request = csi.CreateVolumeRequest(
            name=name, capacity_range=csi.CapacityRange(required_bytes=required,
                                                        limit_bytes=limit),
            volume_capabilities=caps, parameters=parameters, mutable_parameters=attributes,
            accessibility_requirements=csi.TopologyRequirement(requisite=requisite,
                                                                preferred=preferred),
        )  # fmt: skip
        if source is not None:
            request.volume_content_source.CopyFrom(source)
        with grpc.insecure_channel(target) as channel:
            try:
                reply = csi_grpc.ControllerStub(channel).CreateVolume(request, timeout=5)
            except grpc.RpcError as e:
                assert e.code() in ALLOWED, (e.code(), e.details(), request)
                return
        made.append(reply.volume.volume_id)

    @fuzz
    @given(ids, texts, params)
    def snapshot(source: str, name: str, parameters: Any) -> None:
        pick = made[hash(source) % len(made)] if made and len(source) % 2 else source
        request = csi.CreateSnapshotRequest(source_volume_id=pick, name=name,
                                            parameters=parameters)  # fmt: skip
        code = _call(target, "ControllerStub", "CreateSnapshot", request)
        assert code in ALLOWED, (code, request)

    @fuzz
    @given(ids, sizes, sizes, capabilities, mutable)
    def others(volume_id: str, required: int, limit: int, caps: Any, attributes: Any) -> None:
        if made and len(volume_id) % 2:
            volume_id = made[hash(volume_id) % len(made)]  # a volume that exists, half the time
        for method, request in (
            ("ControllerModifyVolume", csi.ControllerModifyVolumeRequest(
                volume_id=volume_id, mutable_parameters=attributes)),
            ("ControllerExpandVolume", csi.ControllerExpandVolumeRequest(
                volume_id=volume_id,
                capacity_range=csi.CapacityRange(required_bytes=required, limit_bytes=limit),
                volume_capability=caps[0] if caps else None)),
            ("ValidateVolumeCapabilities", csi.ValidateVolumeCapabilitiesRequest(
                volume_id=volume_id, volume_capabilities=caps)),
            ("DeleteSnapshot", csi.DeleteSnapshotRequest(snapshot_id=volume_id)),
            ("GetCapacity", csi.GetCapacityRequest(volume_capabilities=caps)),
        ):  # fmt: skip
            code = _call(target, "ControllerStub", method, request)
            assert code in ALLOWED, (method, code, request)

    create()
    snapshot()
    others()
    for volume_id in made:  # snapshots first: a volume a copy reads is not deleted
        _call(target, "ControllerStub", "DeleteSnapshot", csi.DeleteSnapshotRequest(
            snapshot_id=volume_id))  # fmt: skip
    log = (driver.workdir / "logs" / "topolvm-controller.log").read_text()
    assert "rpc failed unexpectedly" not in log, log[log.find("rpc failed unexpectedly") - 2000 :]


paths = st.one_of(
    st.text(max_size=30).map(lambda t: f"{SCRATCH}/{t}"),
    st.sampled_from([f"{SCRATCH}/a/../../etc", "relative/path", "", f"{SCRATCH}/\x00x"]),
)


def test_the_node_answers_any_request_with_a_csi_code(fuzz_node: UmlNode) -> None:
    target = fuzz_node.csi_target

    @fuzz
    @given(ids, paths, capabilities, st.booleans(), sizes)
    def node_calls(volume_id: str, path: str, caps: Any, readonly: bool, size: int) -> None:
        cap = caps[0] if caps else None
        for method, request in (
            ("NodePublishVolume", csi.NodePublishVolumeRequest(
                volume_id=volume_id, target_path=path, volume_capability=cap,
                readonly=readonly)),
            ("NodeGetVolumeStats", csi.NodeGetVolumeStatsRequest(
                volume_id=volume_id, volume_path=path)),
            ("NodeExpandVolume", csi.NodeExpandVolumeRequest(
                volume_id=volume_id, volume_path=path, volume_capability=cap,
                capacity_range=csi.CapacityRange(required_bytes=size))),
            ("NodeUnpublishVolume", csi.NodeUnpublishVolumeRequest(
                volume_id=volume_id, target_path=path)),
            ("NodeStageVolume", csi.NodeStageVolumeRequest(
                volume_id=volume_id, staging_target_path=path, volume_capability=cap)),
        ):  # fmt: skip
            code = _call(target, "NodeStub", method, request)
            # INTERNAL: an unpublish that found a file where no mount is (the node says so)
            assert code in ALLOWED | {C.INTERNAL}, (method, code, request)

    node_calls()
    log = fuzz_node.node_log(lines=0)
    assert "rpc failed unexpectedly" not in log
    assert fuzz_node.exec("mountpoint", "-q", "/proc").rc == 0  # the guest's own mounts stay

"""Host unit tests of the gRPC call plumbing (topolvm/rpc/status.py) over a real gRPC server on a
UNIX socket: streams and unimplemented methods are logged and counted by their real names."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from topolvm.controller.csi_controller import ControllerService
from topolvm.lvm.errors import LvmError
from topolvm.lvmd.service import translate
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import csi_pb2_grpc as csi_grpc
from topolvm.proto import lvmd_pb2 as pb
from topolvm.proto import lvmd_pb2_grpc as pb_grpc
from topolvm.rpc import status
from topolvm.rpc.server import start_unix_server, stop_unix_server
from topolvm.rpc.transport import Service

VG = pb.DESCRIPTOR.services_by_name["VGService"]
CONTROLLER = csi.DESCRIPTOR.services_by_name["Controller"]


class Stream:
    """A Watch that sends ``count`` messages, then fails with an LVM error if ``fail``."""

    def __init__(self, registry: CollectorRegistry, count: int, fail: bool) -> None:
        self.grpc_metrics = status.GrpcMetrics(registry)
        self.count, self.fail = count, fail

    @status.stream_rpc("proto.VGService", translate)
    async def Watch(self, request: pb.Empty, context: Any) -> AsyncIterator[pb.WatchResponse]:
        for i in range(self.count):
            yield pb.WatchResponse(free_bytes=i)
        if self.fail:
            raise LvmError(["vgs"], 5, "device-mapper gone")


def rpc(fn: Any) -> Any:
    return status.rpc("csi.v1.Controller", lambda r: {})(fn)


class Unoffered:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.grpc_metrics = status.GrpcMetrics(registry)

    ListVolumes = status.unimplemented(rpc, "ListVolumes", "not offered here")


def handled(registry: CollectorRegistry, service: str, method: str, code: str) -> float:
    labels = {"grpc_service": service, "grpc_method": method, "grpc_code": code}
    return registry.get_sample_value("grpc_server_handled_total", labels) or 0.0


@pytest.mark.parametrize("fail", [False, True])
async def test_a_stream_is_logged_and_counted_by_its_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fail: bool
) -> None:
    registry = CollectorRegistry()
    servicer = Stream(registry, 3, fail)
    path = str(tmp_path / "s.sock")
    server = await start_unix_server(path, [Service(VG, servicer)])
    try:
        async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
            got: list[int] = []
            with caplog.at_level(logging.INFO, logger="topolvm.rpc.status"):
                try:
                    async for msg in pb_grpc.VGServiceStub(channel).Watch(pb.Empty()):
                        got.append(msg.free_bytes)
                    code = grpc.StatusCode.OK
                except grpc.aio.AioRpcError as e:
                    code = e.code()
                    assert e.details() == "vgs: exit status 5: device-mapper gone"
    finally:
        await stop_unix_server(server, path, 1)
    assert got == [0, 1, 2]
    want = grpc.StatusCode.INTERNAL if fail else grpc.StatusCode.OK
    assert code == want
    assert handled(registry, "proto.VGService", "Watch", want.name) == 1
    records = [r for r in caplog.records if getattr(r, "rpc", None) == "Watch"]
    assert [getattr(r, "code", None) for r in records] == [want.name]


async def test_unimplemented_methods_are_counted_by_their_own_names(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    servicer = Unoffered(registry)
    path = str(tmp_path / "c.sock")
    server = await start_unix_server(path, [Service(CONTROLLER, servicer)])
    try:
        async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await csi_grpc.ControllerStub(channel).ListVolumes(csi.ListVolumesRequest())
    finally:
        await stop_unix_server(server, path, 1)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert e.value.details() == "not offered here"
    assert handled(registry, "csi.v1.Controller", "ListVolumes", "UNIMPLEMENTED") == 1


def test_the_controller_names_each_method_it_does_not_offer() -> None:
    for method in (
        "ControllerPublishVolume", "ControllerUnpublishVolume", "ListVolumes", "ListSnapshots",
        "ControllerGetVolume", "GetSnapshot",
    ):  # fmt: skip
        assert getattr(ControllerService, method).__name__ == method

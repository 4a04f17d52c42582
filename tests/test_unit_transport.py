"""rpc/transport.py: servicers served by grpclib answer grpcio (and so Go) clients as before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from topolvm.constants import names
from topolvm.csi.identity import IdentityService
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import csi_pb2_grpc as csi_grpc
from topolvm.proto import lvmd_pb2 as pb
from topolvm.proto import lvmd_pb2_grpc as pb_grpc
from topolvm.rpc.transport import Service, Status, UnixServer

CSI = csi.DESCRIPTOR.services_by_name
LVMD = pb.DESCRIPTOR.services_by_name


class SlowVG:
    """A VGService whose GetFreeBytes takes its time and whose Watch streams three replies."""

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def GetFreeBytes(self, request: pb.GetFreeBytesRequest, context: Any) -> Any:
        if request.device_class == "missing":
            await context.abort(Status.NOT_FOUND, "device class missing not found")
        self.started.set()
        await asyncio.sleep(0.3)
        return pb.GetFreeBytesResponse(free_bytes=42)

    async def Watch(self, request: pb.Empty, context: Any) -> AsyncIterator[pb.WatchResponse]:
        for n in range(3):
            yield pb.WatchResponse(free_bytes=n)


async def test_identity_answers_and_errors_keep_their_codes(tmp_path: Path) -> None:
    sock = str(tmp_path / "csi.sock")
    server = UnixServer([Service(CSI["Identity"], IdentityService(names(False)))])
    await server.start(sock)
    try:
        async with grpc.aio.insecure_channel(f"unix:{sock}") as ch:
            ids = csi_grpc.IdentityStub(ch)
            assert (await ids.GetPluginInfo(csi.GetPluginInfoRequest())).name == "topolvm.io"
            probe = await ids.Probe(csi.ProbeRequest())
            assert probe.HasField("ready") and probe.ready.value is False
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await csi_grpc.NodeStub(ch).NodeGetInfo(csi.NodeGetInfoRequest())
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(sock, grace=1)
    assert not Path(sock).exists()


async def test_abort_streams_and_a_graceful_stop(tmp_path: Path) -> None:
    sock = str(tmp_path / "lvmd.sock")
    vg = SlowVG()
    server = UnixServer([Service(LVMD["VGService"], vg)])
    await server.start(sock)
    async with grpc.aio.insecure_channel(f"unix:{sock}") as ch:
        stub = pb_grpc.VGServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetFreeBytes(pb.GetFreeBytesRequest(device_class="missing"))
        assert (err.value.code(), err.value.details()) == (
            grpc.StatusCode.NOT_FOUND,
            "device class missing not found",
        )
        assert [m.free_bytes async for m in stub.Watch(pb.Empty())] == [0, 1, 2]
        call = asyncio.ensure_future(stub.GetFreeBytes(pb.GetFreeBytesRequest(device_class="x")))
        await vg.started.wait()
        await server.stop(sock, grace=5)  # the call in flight finishes first
        assert (await call).free_bytes == 42
    assert not Path(sock).exists()

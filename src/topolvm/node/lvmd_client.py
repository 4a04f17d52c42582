"""How topolvm-node talks to lvmd: over its UNIX socket, or in-process (``--embed-lvmd``).

Both implementations expose the same small async API and raise :class:`LvmdCallError` with the
gRPC status code lvmd chose, so callers never care which mode is in use.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, NoReturn, Protocol

from grpc_health.v1 import health_pb2

from topolvm.config.lvmd import LvmdConfig
from topolvm.daemon import Parts
from topolvm.lvmd.server import LvmdServer, Options
from topolvm.proto import lvmd_pb2 as pb
from topolvm.proto import volumedata_pb2 as vd
from topolvm.rpc.transport import GRPCError, Status, UnixClient


class LvmdCallError(Exception):
    """An lvmd call failed; ``code`` is the gRPC status lvmd returned."""

    def __init__(self, code: Status, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class LvmdClient(Protocol):
    async def create_lv(self, request: pb.CreateLVRequest) -> pb.CreateLVResponse: ...
    async def remove_lv(self, request: pb.RemoveLVRequest) -> None: ...
    async def resize_lv(self, request: pb.ResizeLVRequest) -> pb.ResizeLVResponse: ...
    async def create_lv_snapshot(
        self, request: pb.CreateLVSnapshotRequest
    ) -> pb.CreateLVSnapshotResponse: ...
    async def get_lv_list(self, device_class: str) -> list[pb.LogicalVolume]: ...
    async def get_free_bytes(self, device_class: str) -> int: ...
    def watch(self) -> AsyncIterator[pb.WatchResponse]: ...
    async def describe_lv(
        self, name: str, device_class: str, with_uuid: bool = False, check_snapshot: bool = False
    ) -> vd.DescribeLVResponse: ...
    async def create_cut(self, request: vd.CreateCutRequest) -> vd.CreateCutResponse: ...
    async def open_state(self, name: str, device_class: str) -> vd.OpenStateResponse: ...
    def thin_mappings(self, name: str, device_class: str) -> AsyncIterator[tuple[int, int]]: ...
    def thin_delta(
        self, name: str, base: str, device_class: str
    ) -> AsyncIterator[tuple[int, int]]: ...
    def cow_delta(
        self, name: str, base: str, device_class: str
    ) -> AsyncIterator[tuple[int, int]]: ...
    async def check_health(self) -> None:
        """Raise :class:`LvmdCallError` unless lvmd answers SERVING."""

    async def close(self) -> None: ...


def _from_rpc_error(e: GRPCError) -> LvmdCallError:
    return LvmdCallError(e.status, e.message or "")


_LV = pb.DESCRIPTOR.services_by_name["LVService"]
_VG = pb.DESCRIPTOR.services_by_name["VGService"]
_HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]
_DATA = vd.DESCRIPTOR.services_by_name["VolumeData"]


def _ranges(msg: vd.ThinMappingsResponse) -> list[tuple[int, int]]:
    return list(zip(msg.offsets, msg.lengths, strict=True))


async def _flat(
    stream: AsyncIterator[vd.ThinMappingsResponse],
) -> AsyncIterator[tuple[int, int]]:
    """The byte ranges of a VolumeData stream's messages, in order."""
    async for msg in stream:
        for r in _ranges(msg):
            yield r


class SocketLvmd:
    """lvmd reached over ``unix:<socket>`` (the chart's DaemonSet or a systemd unit). After lvmd
    restarts, the next call connects again at once (grpcio's backoff once left every call
    failing for up to 2 minutes although lvmd was back: found by the chaos campaign)."""

    def __init__(self, socket_path: str, timeout: float = 120.0):
        self.socket_path = socket_path
        self.timeout = timeout
        self._client = UnixClient(socket_path)

    async def _call(self, service: Any, method: str, request: Any, timeout: float) -> Any:
        try:
            return await self._client.unary(service, method, request, timeout)
        except GRPCError as e:
            raise _from_rpc_error(e) from None

    async def create_lv(self, request: pb.CreateLVRequest) -> pb.CreateLVResponse:
        reply: pb.CreateLVResponse = await self._call(_LV, "CreateLV", request, self.timeout)
        return reply

    async def remove_lv(self, request: pb.RemoveLVRequest) -> None:
        await self._call(_LV, "RemoveLV", request, self.timeout)

    async def resize_lv(self, request: pb.ResizeLVRequest) -> pb.ResizeLVResponse:
        reply: pb.ResizeLVResponse = await self._call(_LV, "ResizeLV", request, self.timeout)
        return reply

    async def create_lv_snapshot(
        self, request: pb.CreateLVSnapshotRequest
    ) -> pb.CreateLVSnapshotResponse:
        reply: pb.CreateLVSnapshotResponse = await self._call(
            _LV, "CreateLVSnapshot", request, self.timeout
        )
        return reply

    async def get_lv_list(self, device_class: str) -> list[pb.LogicalVolume]:
        req = pb.GetLVListRequest(device_class=device_class)
        return list((await self._call(_VG, "GetLVList", req, self.timeout)).volumes)

    async def get_free_bytes(self, device_class: str) -> int:
        req = pb.GetFreeBytesRequest(device_class=device_class)
        return int((await self._call(_VG, "GetFreeBytes", req, self.timeout)).free_bytes)

    async def watch(self) -> AsyncIterator[pb.WatchResponse]:
        try:
            async for msg in self._client.stream(_VG, "Watch", pb.Empty()):
                yield msg
        except GRPCError as e:
            raise _from_rpc_error(e) from None

    async def describe_lv(
        self, name: str, device_class: str, with_uuid: bool = False, check_snapshot: bool = False
    ) -> vd.DescribeLVResponse:
        req = vd.DescribeLVRequest(name=name, device_class=device_class, with_uuid=with_uuid,
                                   check_snapshot=check_snapshot)  # fmt: skip
        reply: vd.DescribeLVResponse = await self._call(_DATA, "DescribeLV", req, self.timeout)
        return reply

    async def create_cut(self, request: vd.CreateCutRequest) -> vd.CreateCutResponse:
        reply: vd.CreateCutResponse = await self._call(_DATA, "CreateCut", request, self.timeout)
        return reply

    async def open_state(self, name: str, device_class: str) -> vd.OpenStateResponse:
        req = vd.OpenStateRequest(name=name, device_class=device_class)
        reply: vd.OpenStateResponse = await self._call(_DATA, "OpenState", req, self.timeout)
        return reply

    async def _range_stream(self, method: str, req: Any) -> AsyncIterator[tuple[int, int]]:
        """The byte ranges a VolumeData stream of ``method`` sends, as they come."""
        try:
            async for r in _flat(self._client.stream(_DATA, method, req)):
                yield r
        except GRPCError as e:
            raise _from_rpc_error(e) from None

    def thin_mappings(self, name: str, device_class: str) -> AsyncIterator[tuple[int, int]]:
        req = vd.ThinMappingsRequest(name=name, device_class=device_class)
        return self._range_stream("ThinMappings", req)

    def thin_delta(self, name: str, base: str, device_class: str) -> AsyncIterator[tuple[int, int]]:
        req = vd.ThinDeltaRequest(name=name, base=base, device_class=device_class)
        return self._range_stream("ThinDelta", req)

    def cow_delta(self, name: str, base: str, device_class: str) -> AsyncIterator[tuple[int, int]]:
        req = vd.CowDeltaRequest(name=name, base=base, device_class=device_class)
        return self._range_stream("CowDelta", req)

    async def check_health(self) -> None:
        req = health_pb2.HealthCheckRequest(service="")
        resp = await self._call(_HEALTH, "Check", req, 10)
        if resp.status != health_pb2.HealthCheckResponse.SERVING:
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            raise LvmdCallError(Status.UNAVAILABLE, f"lvmd is not serving: {status}")

    async def close(self) -> None:
        self._client.close()


class _InProcessContext:
    """What lvmd's servicers use of their context (``rpc.transport.Context``): ``abort`` ends
    the call."""

    async def abort(self, code: Status, details: str = "", *_: Any) -> NoReturn:
        raise LvmdCallError(code, details)


class EmbeddedLvmd:
    """lvmd's service implementation called in-process (``topolvm node --embed-lvmd``).

    Unlike upstream, start-up still checks that every device class's VG and thin pool exist,
    so a wrong config fails fast instead of on the first volume.
    """

    def __init__(
        self, config: LvmdConfig, options: Options | None = None, parts: Parts | None = None
    ):
        self._server = LvmdServer(config, options, parts)
        self._ctx: Any = _InProcessContext()

    async def start(self) -> None:
        await self._server.open()

    async def create_lv(self, request: pb.CreateLVRequest) -> pb.CreateLVResponse:
        return await self._server.lv.CreateLV(request, self._ctx)

    async def remove_lv(self, request: pb.RemoveLVRequest) -> None:
        await self._server.lv.RemoveLV(request, self._ctx)

    async def resize_lv(self, request: pb.ResizeLVRequest) -> pb.ResizeLVResponse:
        return await self._server.lv.ResizeLV(request, self._ctx)

    async def create_lv_snapshot(
        self, request: pb.CreateLVSnapshotRequest
    ) -> pb.CreateLVSnapshotResponse:
        return await self._server.lv.CreateLVSnapshot(request, self._ctx)

    async def get_lv_list(self, device_class: str) -> list[pb.LogicalVolume]:
        req = pb.GetLVListRequest(device_class=device_class)
        return list((await self._server.vg.GetLVList(req, self._ctx)).volumes)

    async def get_free_bytes(self, device_class: str) -> int:
        req = pb.GetFreeBytesRequest(device_class=device_class)
        return int((await self._server.vg.GetFreeBytes(req, self._ctx)).free_bytes)

    async def watch(self) -> AsyncIterator[pb.WatchResponse]:
        async for msg in self._server.vg.Watch(pb.Empty(), self._ctx):
            yield msg

    async def describe_lv(
        self, name: str, device_class: str, with_uuid: bool = False, check_snapshot: bool = False
    ) -> vd.DescribeLVResponse:
        req = vd.DescribeLVRequest(name=name, device_class=device_class, with_uuid=with_uuid,
                                   check_snapshot=check_snapshot)  # fmt: skip
        return await self._server.data.DescribeLV(req, self._ctx)

    async def create_cut(self, request: vd.CreateCutRequest) -> vd.CreateCutResponse:
        return await self._server.data.CreateCut(request, self._ctx)

    async def open_state(self, name: str, device_class: str) -> vd.OpenStateResponse:
        req = vd.OpenStateRequest(name=name, device_class=device_class)
        return await self._server.data.OpenState(req, self._ctx)

    async def thin_mappings(self, name: str, device_class: str) -> AsyncIterator[tuple[int, int]]:
        req = vd.ThinMappingsRequest(name=name, device_class=device_class)
        async for r in _flat(self._server.data.ThinMappings(req, self._ctx)):
            yield r

    async def thin_delta(
        self, name: str, base: str, device_class: str
    ) -> AsyncIterator[tuple[int, int]]:
        req = vd.ThinDeltaRequest(name=name, base=base, device_class=device_class)
        async for r in _flat(self._server.data.ThinDelta(req, self._ctx)):
            yield r

    async def cow_delta(
        self, name: str, base: str, device_class: str
    ) -> AsyncIterator[tuple[int, int]]:
        req = vd.CowDeltaRequest(name=name, base=base, device_class=device_class)
        async for r in _flat(self._server.data.CowDelta(req, self._ctx)):
            yield r

    async def check_health(self) -> None:
        return None  # in-process: lvmd is up as long as this process is

    async def close(self) -> None:
        """End Watch streams; the LVM refresh stops with the parts it was started in."""
        await self._server.end_watches()

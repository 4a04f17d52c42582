"""How topolvm-node talks to lvmd: over its UNIX socket, or in-process (``--embed-lvmd``).

Both implementations expose the same small async API and raise :class:`LvmdCallError` with the
gRPC status code lvmd chose, so callers never care which mode is in use.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any, NoReturn, Protocol, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from topolvm.config.lvmd import LvmdConfig
from topolvm.daemon import Parts
from topolvm.lvmd.server import LvmdServer, Options
from topolvm.proto import lvmd_pb2 as pb
from topolvm.proto import lvmd_pb2_grpc as pb_grpc

T = TypeVar("T")


class LvmdCallError(Exception):
    """An lvmd call failed; ``code`` is the gRPC status lvmd returned."""

    def __init__(self, code: grpc.StatusCode, message: str):
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
    async def check_health(self) -> None:
        """Raise :class:`LvmdCallError` unless lvmd answers SERVING."""

    async def close(self) -> None: ...


def _from_rpc_error(e: grpc.aio.AioRpcError) -> LvmdCallError:
    return LvmdCallError(e.code(), e.details() or "")


# lvmd is local: after it restarts, reconnect within a second. gRPC's default backoff grows to
# 2 minutes, and every call in that time failed at once with "failed to connect" although lvmd
# was back (found by the chaos campaign: NodePublishVolume failed for up to 2 minutes).
RECONNECT = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


class SocketLvmd:
    """lvmd reached over ``unix:<socket>`` (the chart's DaemonSet or a systemd unit)."""

    def __init__(self, socket_path: str, timeout: float = 120.0):
        self.socket_path = socket_path
        self.timeout = timeout
        self._channel = grpc.aio.insecure_channel(f"unix:{socket_path}", options=RECONNECT)
        self._lv = pb_grpc.LVServiceStub(self._channel)
        self._vg = pb_grpc.VGServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    @staticmethod
    async def _call(call: Awaitable[T]) -> T:
        try:
            return await call
        except grpc.aio.AioRpcError as e:
            raise _from_rpc_error(e) from None

    async def create_lv(self, request: pb.CreateLVRequest) -> pb.CreateLVResponse:
        return await self._call(self._lv.CreateLV(request, timeout=self.timeout))

    async def remove_lv(self, request: pb.RemoveLVRequest) -> None:
        await self._call(self._lv.RemoveLV(request, timeout=self.timeout))

    async def resize_lv(self, request: pb.ResizeLVRequest) -> pb.ResizeLVResponse:
        return await self._call(self._lv.ResizeLV(request, timeout=self.timeout))

    async def create_lv_snapshot(
        self, request: pb.CreateLVSnapshotRequest
    ) -> pb.CreateLVSnapshotResponse:
        return await self._call(self._lv.CreateLVSnapshot(request, timeout=self.timeout))

    async def get_lv_list(self, device_class: str) -> list[pb.LogicalVolume]:
        req = pb.GetLVListRequest(device_class=device_class)
        return list((await self._call(self._vg.GetLVList(req, timeout=self.timeout))).volumes)

    async def get_free_bytes(self, device_class: str) -> int:
        req = pb.GetFreeBytesRequest(device_class=device_class)
        return int((await self._call(self._vg.GetFreeBytes(req, timeout=self.timeout))).free_bytes)

    async def watch(self) -> AsyncIterator[pb.WatchResponse]:
        call = self._vg.Watch(pb.Empty())
        try:
            async for msg in call:
                yield msg
        except grpc.aio.AioRpcError as e:
            raise _from_rpc_error(e) from None
        finally:
            call.cancel()

    async def check_health(self) -> None:
        req = health_pb2.HealthCheckRequest(service="")
        resp = await self._call(self._health.Check(req, timeout=10))
        if resp.status != health_pb2.HealthCheckResponse.SERVING:
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            raise LvmdCallError(grpc.StatusCode.UNAVAILABLE, f"lvmd is not serving: {status}")

    async def close(self) -> None:
        await self._channel.close(None)


class _InProcessContext:
    """The part of a ServicerContext lvmd's servicer uses: ``abort`` ends the call."""

    async def abort(self, code: grpc.StatusCode, details: str = "", *_: Any) -> NoReturn:
        raise LvmdCallError(code, details)

    def cancelled(self) -> bool:
        return False


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

    async def check_health(self) -> None:
        return None  # in-process: lvmd is up as long as this process is

    async def close(self) -> None:
        """End Watch streams; the LVM refresh stops with the parts it was started in."""
        await self._server.end_watches()

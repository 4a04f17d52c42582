"""Running lvmd: start-up checks, the UNIX socket, health service, timers and graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import grpc
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health_pb2, health_pb2_grpc

from topolvm.config.lvmd import LvmdConfig
from topolvm.csi.server import SocketError, start_unix_server, stop_unix_server
from topolvm.lvm.command import LvmRunner
from topolvm.lvm.report import Report
from topolvm.lvmd.capacity import PoolMissing, find_pool
from topolvm.lvmd.service import Lvmd
from topolvm.lvmd.state import DEFAULT_REFRESH_INTERVAL, LvmState
from topolvm.process import until_terminated
from topolvm.proto import lvmd_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 60.0  # seconds in-flight RPCs get to finish on SIGTERM


class StartupError(Exception):
    """lvmd cannot start; the message says why (missing VG, socket in use, ...)."""


def check_device_classes(config: LvmdConfig, report: Report) -> None:
    """Every device class's VG (and thin pool) must exist; name all that are missing."""
    missing = []
    for dc in config.device_classes:
        try:
            find_pool(report, dc)
        except PoolMissing as e:
            missing.append(str(e))
    if missing:
        raise StartupError("; ".join(missing))


@dataclass
class Options:
    refresh_interval: float = DEFAULT_REFRESH_INTERVAL
    watch_interval: float = 600.0
    command_timeout: float = 120.0


class LvmdServer:
    def __init__(self, config: LvmdConfig, options: Options | None = None):
        self.config = config
        self.options = options or Options()
        self.runner = LvmRunner(config.command_prefix, self.options.command_timeout)
        self.state = LvmState(self.runner)
        self.lvmd = Lvmd(config, self.state)
        self.health = health_async.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._timer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        report = await self.state.refresh()
        check_device_classes(self.config, report)
        path = self.config.socket_name
        lvmd, health = self.lvmd, self.health

        def register(server: grpc.aio.Server) -> None:
            pb_grpc.add_LVServiceServicer_to_server(lvmd, server)
            pb_grpc.add_VGServiceServicer_to_server(lvmd, server)
            health_pb2_grpc.add_HealthServicer_to_server(health, server)

        try:  # the socket is 0600 from its creation: only root may drive LVM
            self._server = await start_unix_server(path, register, mode=0o600)
        except SocketError as e:
            raise StartupError(str(e)) from e
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._timer = asyncio.create_task(
            self.state.run_timer(self.options.refresh_interval, self.options.watch_interval)
        )
        classes = [dc.name for dc in self.config.device_classes]
        log.info("lvmd started", extra={"socket": path, "device_classes": classes})

    async def stop(self, grace: float = SHUTDOWN_GRACE) -> None:
        await self.health.enter_graceful_shutdown()
        self.state.close()  # ends Watch streams
        if self._server is not None:  # in-flight RPCs (and their LVM commands) finish
            await stop_unix_server(self._server, self.config.socket_name, grace)
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        log.info("lvmd stopped")


async def serve(config: LvmdConfig, options: Options | None = None) -> None:
    """Run until SIGTERM/SIGINT, then shut down gracefully."""
    server = LvmdServer(config, options)
    await server.start()
    await until_terminated()
    log.info("shutting down: waiting for in-flight requests")
    await server.stop()


async def health_check(socket_name: str, timeout: float = 10.0) -> str:
    """Ask a running lvmd for its health; returns the serving status name."""
    async with grpc.aio.insecure_channel(f"unix:{socket_name}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        resp = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))

"""Running lvmd: start-up checks, the UNIX socket, health service, timers and graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health_pb2, health_pb2_grpc

from topolvm.config.lvmd import LvmdConfig
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


def prepare_socket(path: str) -> None:
    """Make ``path`` free to bind: remove a stale socket, refuse anything else."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = p.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise StartupError(f"socket path {path} exists and is not a socket; refusing to remove it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        p.unlink(missing_ok=True)  # nobody listens: stale socket from an earlier run
        return
    finally:
        probe.close()
    raise StartupError(f"socket {path} is in use by another process (is lvmd already running?)")


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
        prepare_socket(path)
        server = grpc.aio.server()
        pb_grpc.add_LVServiceServicer_to_server(self.lvmd, server)
        pb_grpc.add_VGServiceServicer_to_server(self.lvmd, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        old_umask = os.umask(0o177)  # the socket is created 0600: only root may drive LVM
        try:
            server.add_insecure_port(f"unix:{path}")
            await server.start()
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        self._server = server
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._timer = asyncio.create_task(
            self.state.run_timer(self.options.refresh_interval, self.options.watch_interval)
        )
        classes = [dc.name for dc in self.config.device_classes]
        log.info("lvmd started", extra={"socket": path, "device_classes": classes})

    async def stop(self, grace: float = SHUTDOWN_GRACE) -> None:
        await self.health.enter_graceful_shutdown()
        self.state.close()  # ends Watch streams
        if self._server is not None:
            await self._server.stop(grace)  # in-flight RPCs (and their LVM commands) finish
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        with contextlib.suppress(OSError):
            os.unlink(self.config.socket_name)
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

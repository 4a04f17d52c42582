"""Running lvmd: start-up checks, the UNIX socket, health service, timers and graceful shutdown."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import prometheus_client
from grpc_health.v1 import health_pb2

from topolvm import daemon
from topolvm.config.lvmd import LvmdConfig
from topolvm.daemon import Parts, StartupError, serve_grpc, serve_metrics
from topolvm.lvm.command import LvmRunner
from topolvm.lvm.report import Report
from topolvm.lvmd.capacity import PoolMissing, find_pool
from topolvm.lvmd.devices import DeviceEvents
from topolvm.lvmd.lvservice import LVService
from topolvm.lvmd.state import DEFAULT_REFRESH_INTERVAL, LvmState
from topolvm.lvmd.vgservice import VGService
from topolvm.lvmd.volumedata import VolumeDataService
from topolvm.proto import lvmd_pb2 as pb
from topolvm.proto import volumedata_pb2
from topolvm.rpc.health import SERVING, Health
from topolvm.rpc.transport import Service, UnixClient

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 60.0  # seconds in-flight RPCs get to finish on SIGTERM


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
    # follow the kernel's block-device events (changes made outside lvmd); off: only the
    # periodic refresh sees them
    device_events: bool = True
    command_timeout: float = 120.0
    # process metrics (upstream serves them too); None: not served. Only the lvmd process
    # serves them, not an lvmd embedded in topolvm-node.
    metrics_address: tuple[str, int] | None = None


class LvmdServer:
    """lvmd: its LVM state and services, served on a UNIX socket (:meth:`start`) or called
    in-process by topolvm-node (:meth:`open` only, ``--embed-lvmd``)."""

    def __init__(
        self, config: LvmdConfig, options: Options | None = None, parts: Parts | None = None
    ):
        self.config = config
        self.options = options or Options()
        self.runner = LvmRunner(config.command_prefix, self.options.command_timeout)
        self.state = LvmState(self.runner)
        self.lv = LVService(config, self.state)
        self.vg = VGService(config, self.state)
        self.data = VolumeDataService(config, self.state, self.lv)
        self.health = Health()
        self.parts = parts if parts is not None else Parts("lvmd")
        self.device_events: DeviceEvents | None = None

    async def open(self) -> None:
        """Read LVM, check every device class, and keep the state fresh in the background."""
        report = await self.state.refresh()
        check_device_classes(self.config, report)
        opts = self.options
        self.parts.spawn(
            self.state.run_timer(opts.refresh_interval, opts.watch_interval), "lvm-refresh"
        )
        if opts.device_events:
            self.device_events = DeviceEvents(self.state.check_devices)
            if (failed := self.device_events.open()) is None:
                self.parts.spawn(self.device_events.run(self.state.closing), "device-events")
            else:
                log.warning(
                    "changes made outside lvmd will be seen at the periodic refresh only",
                    extra={"reason": failed, "refresh_interval": opts.refresh_interval},
                )

    async def end_watches(self) -> None:
        """End every Watch stream (they would hold a graceful gRPC stop for its whole grace)."""
        self.state.close()

    async def start(self) -> None:
        await self.open()
        path = self.config.socket_name
        services = pb.DESCRIPTOR.services_by_name
        data = volumedata_pb2.DESCRIPTOR.services_by_name["VolumeData"]
        served = [Service(services["LVService"], self.lv), Service(services["VGService"], self.vg),
                  Service(data, self.data), self.health.service()]  # fmt: skip
        # the socket is 0600 from its creation: only root may drive LVM; in-flight RPCs (and
        # their LVM commands) get SHUTDOWN_GRACE seconds at stop
        await serve_grpc(self.parts, path, served, mode=0o600, grace=SHUTDOWN_GRACE)
        self.parts.on_stop("Watch streams", self.end_watches)
        await serve_metrics(self.parts, prometheus_client.REGISTRY, self.options.metrics_address)
        self.parts.on_stop("health", self.health.enter_graceful_shutdown)
        await self.health.set("", SERVING)
        classes = [dc.name for dc in self.config.device_classes]
        log.info("lvmd started", extra={"socket": path, "device_classes": classes})

    async def stop(self) -> None:
        await self.parts.stop()
        log.info("lvmd stopped")


async def serve(config: LvmdConfig, options: Options | None = None) -> None:
    """Run until SIGTERM/SIGINT, then shut down gracefully."""
    await daemon.serve(LvmdServer(config, options))


async def health_check(socket_name: str, timeout: float = 10.0) -> str:
    """Ask a running lvmd for its health; returns the serving status name."""
    client = UnixClient(socket_name)
    try:
        resp = await client.unary(
            health_pb2.DESCRIPTOR.services_by_name["Health"], "Check",
            health_pb2.HealthCheckRequest(service=""), timeout,
        )  # fmt: skip
    finally:
        client.close()
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))

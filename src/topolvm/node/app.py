"""topolvm-node: CSI Identity + Node services, the LogicalVolume reconciler and capacity export."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
from aiohttp import web
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node
from prometheus_client import CollectorRegistry
from prometheus_client.process_collector import ProcessCollector

from topolvm.config.lvmd import LvmdConfig
from topolvm.constants import Names
from topolvm.csi.identity import IdentityService, csidriver_check
from topolvm.csi.server import SocketError, start_unix_server, stop_unix_server
from topolvm.csi.status import GrpcMetrics
from topolvm.k8s import api
from topolvm.k8s.lvstore import LogicalVolumeStore
from topolvm.k8s.runtime import Controller, Informer
from topolvm.lvmd.server import Options
from topolvm.metrics import MetricsServerError, start_metrics_server
from topolvm.node.csi_node import NodeService
from topolvm.node.exporter import CapacityExporter, NodeMetrics
from topolvm.node.lvmd_client import EmbeddedLvmd, LvmdClient, SocketLvmd
from topolvm.node.reconciler import LogicalVolumeReconciler
from topolvm.process import bounded, until_terminated
from topolvm.proto import csi_pb2_grpc as csi_grpc

log = logging.getLogger("topolvm.node")


class StartupError(Exception):
    """topolvm-node cannot start; the message says why and what to check."""


@dataclass
class NodeOptions:
    node_name: str
    names: Names
    csi_socket: str
    lvmd_socket: str = ""
    embed_lvmd: LvmdConfig | None = None
    metrics_address: tuple[str, int] | None = ("0.0.0.0", 8080)
    resync: float = 600.0
    probe_interval: float = 60.0
    workers: int = 4
    advertise_capacity_resource: bool = True
    lvmd_options: Options = field(default_factory=Options)


class TopolvmNode:
    """All of topolvm-node's parts, started and stopped together."""

    def __init__(self, client: AsyncClient, options: NodeOptions):
        self.client = client
        self.options = options
        self.names = options.names
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.lvmd: LvmdClient
        self._embedded: EmbeddedLvmd | None = None
        if options.embed_lvmd is not None:
            self._embedded = EmbeddedLvmd(options.embed_lvmd, options.lvmd_options)
            self.lvmd = self._embedded
        else:
            self.lvmd = SocketLvmd(options.lvmd_socket)
        lv_res = api.logicalvolume_resource(self.names)
        self.informer = Informer(client, lv_res, resync=options.resync)
        self.reconciler = LogicalVolumeReconciler(client, self.names, options.node_name, self.lvmd)
        self.controller = Controller(
            "logicalvolume", self.reconciler.reconcile, workers=options.workers
        )
        self.reconciler.watch(self.informer, self.controller)
        self.metrics = NodeMetrics(self.registry, options.node_name)
        self.exporter = CapacityExporter(
            client,
            self.names,
            options.node_name,
            self.lvmd,
            self.metrics,
            advertise_resource=options.advertise_capacity_resource,
        )
        checks: list[Callable[[], Awaitable[None]]] = []
        if self._embedded is None:
            checks.append(self.lvmd.check_health)
        checks.append(csidriver_check(client, self.names))
        self.identity = IdentityService(self.names, checks, interval=options.probe_interval)
        self.volumes = LogicalVolumeStore(client, self.names, self.informer)
        self.node_service = NodeService(options.node_name, self.names, self.lvmd, self.volumes)
        self.node_service.grpc_metrics = GrpcMetrics(self.registry)
        self._tasks: list[asyncio.Task[None]] = []
        self._server: grpc.aio.Server | None = None
        self._metrics_runner: web.AppRunner | None = None

    async def check_api(self) -> None:
        """Fail fast, with a clear message, when the API or this node's Node object is missing."""
        try:
            node = await api.get(self.client, Node, self.options.node_name)
        except Exception as e:
            raise StartupError(api.describe(e)) from e
        if node is None:
            raise StartupError(
                f"Node {self.options.node_name!r} does not exist in the API: "
                "check --nodename / NODE_NAME (it must be the Kubernetes node name)"
            )

    async def start(self) -> None:
        await self.check_api()
        if self._embedded is not None:
            await self._embedded.start()
        self._tasks = [
            asyncio.create_task(self.informer.run(), name="informer"),
            asyncio.create_task(self.controller.run(), name="controller"),
            asyncio.create_task(self.exporter.run(), name="exporter"),
        ]
        await self.identity.start()
        identity, node_service = self.identity, self.node_service

        def register(server: grpc.aio.Server) -> None:
            csi_grpc.add_IdentityServicer_to_server(identity, server)
            csi_grpc.add_NodeServicer_to_server(node_service, server)

        try:
            self._server = await start_unix_server(self.options.csi_socket, register)
        except SocketError as e:
            raise StartupError(str(e)) from e
        if self.options.metrics_address is not None:
            try:
                self._metrics_runner = await start_metrics_server(
                    self.registry, *self.options.metrics_address
                )
            except MetricsServerError as e:
                raise StartupError(str(e)) from e
        log.info(
            "topolvm-node started",
            extra={
                "node": self.options.node_name,
                "csi_socket": self.options.csi_socket,
                "embedded_lvmd": self._embedded is not None,
                "plugin": self.names.plugin,
                "advertise_capacity_resource": self.options.advertise_capacity_resource,
            },
        )

    async def stop(self) -> None:
        """Stop every part; each step is bounded so that one stuck part cannot keep the
        process alive (kubelet restarts a stuck node plugin only once it exits)."""
        if self._server is not None:
            server = self._server
            await bounded("CSI server", stop_unix_server(server, self.options.csi_socket, grace=10))
        await bounded("readiness checker", self.identity.stop())
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=15.0)
            for task in pending:  # e.g. an LVM command lvmd lets finish: stop waiting for it
                log.warning(
                    "task did not stop in time; cancelling again", extra={"task": task.get_name()}
                )
                task.cancel()
        if self._metrics_runner is not None:
            await bounded("metrics server", self._metrics_runner.cleanup())
        await bounded("lvmd client", self.lvmd.close())
        log.info("topolvm-node stopped")


async def serve(client: AsyncClient, options: NodeOptions) -> None:
    node = TopolvmNode(client, options)
    try:
        await node.start()
    except BaseException:
        await node.stop()
        raise
    await until_terminated()
    log.info("shutting down")
    await node.stop()

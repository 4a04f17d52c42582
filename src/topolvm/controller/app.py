"""topolvm-controller's wiring: informers, the CSI server, health, metrics, the pod webhook
(every replica) and the reconcilers (the elected leader only)."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import Awaitable, Mapping
from typing import Any

import grpc
from aiohttp import web
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node
from prometheus_client import CollectorRegistry
from prometheus_client.process_collector import ProcessCollector

from topolvm.controller.csi_controller import ControllerService
from topolvm.controller.inflight import InFlight
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.options import ControllerOptions, Part, StartupError
from topolvm.controller.wiring import run_reconcilers, start_webhook
from topolvm.csi.identity import IdentityService, csidriver_check
from topolvm.csi.server import SocketError, start_unix_server, stop_unix_server
from topolvm.csi.status import GrpcMetrics
from topolvm.k8s import api
from topolvm.k8s.leader import LeaderElector, LeadershipLost
from topolvm.k8s.lvstore import LogicalVolumeStore
from topolvm.k8s.runtime import Informer
from topolvm.metrics import MetricsServerError, start_metrics_server
from topolvm.process import bounded, until_terminated
from topolvm.proto import csi_pb2_grpc as csi_grpc

log = logging.getLogger("topolvm.controller")


class InformerNodes:
    """:class:`~topolvm.controller.csi_controller.NodeView` over a Node informer."""

    def __init__(self, informer: Informer):
        self.informer = informer

    def annotations(self, node: str) -> Mapping[str, str] | None:
        obj = self.informer.get(node)
        if obj is None:
            return None
        return dict(obj.get("metadata", {}).get("annotations") or {})

    def by_topology(self, key: str, value: str) -> str | None:
        for obj in self.informer.values():
            meta = obj.get("metadata", {})
            if (meta.get("labels") or {}).get(key) == value:
                return str(meta["name"])
        return None

    def names(self) -> list[str]:
        return sorted(str(o["metadata"]["name"]) for o in self.informer.values())


class TopolvmController:
    """All of topolvm-controller's parts, started and stopped together."""

    def __init__(self, client: AsyncClient, options: ControllerOptions):
        self.client = client
        self.options = options
        self.names = options.names
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.metrics = ControllerMetrics(self.registry)
        self.lv_informer = Informer(
            client, api.logicalvolume_resource(self.names), resync=options.resync
        )
        self.node_informer = Informer(client, Node, resync=options.resync)
        self.store = LogicalVolumeStore(client, self.names, self.lv_informer)
        self.nodes = InformerNodes(self.node_informer)
        self.inflight = InFlight()
        self.service = ControllerService(
            self.names, self.store, self.nodes, self.metrics, options.minimums, self.inflight
        )
        self.service.grpc_metrics = GrpcMetrics(self.registry)
        self.node_informer.add_handler(
            lambda event, obj: self.service.node_changed(str(obj["metadata"]["name"]))
        )
        self.identity = IdentityService(
            self.names, [csidriver_check(client, self.names)], interval=options.probe_interval
        )
        self.identity.grpc_metrics = self.service.grpc_metrics
        self.leading = False
        self._tasks: list[asyncio.Task[None]] = []
        self._server: grpc.aio.Server | None = None
        self._runners: list[web.AppRunner] = []
        self._stoppers: list[tuple[str, Part]] = []
        self.failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    # -- health ----------------------------------------------------------------------------

    def ready(self) -> tuple[bool, str]:
        if not self.lv_informer.synced.is_set() or not self.node_informer.synced.is_set():
            return False, "informer caches are not synced yet"
        if self._server is None:
            return False, "CSI server is not running"
        return True, "ok"

    def _health_app(self) -> web.Application:
        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            ok, why = self.ready()
            return web.Response(text=why, status=200 if ok else 503)

        app = web.Application()
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        return app

    async def _serve_http(self, app: web.Application, address: tuple[str, int], what: str) -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, *address).start()
        except OSError as e:
            await runner.cleanup()
            where = f"{address[0]}:{address[1]}"
            raise StartupError(f"cannot listen for {what} on {where}: {e}") from e
        self._runners.append(runner)

    # -- start / stop ----------------------------------------------------------------------

    async def check_api(self, attempts: int = 30) -> None:
        """Fail fast, with a clear message, when the CRD is missing or unreadable; wait out
        an API server that is still starting (transient errors)."""
        for attempt in range(1, attempts + 1):
            try:
                await api.list_all(self.client, api.logicalvolume_resource(self.names))
                return
            except Exception as e:
                if api.is_transient(e) and attempt < attempts:
                    log.info(f"waiting for the API server: {api.describe(e)}")
                    await asyncio.sleep(1.0)
                    continue
                raise StartupError(
                    f"cannot list LogicalVolumes of {self.names.group}: {api.describe(e)} "
                    "(is the CRD installed and the controller allowed to read it?)"
                ) from e

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except BaseException as e:
                log.exception(f"{name} failed")
                if not self.failed.done():
                    self.failed.set_result(e)

        self._tasks.append(asyncio.create_task(guarded(), name=name))

    async def start(self) -> None:
        await self.check_api()
        self._spawn(self.lv_informer.run(), "logicalvolume-informer")
        self._spawn(self.node_informer.run(), "node-informer")
        await self.identity.start()
        identity, service = self.identity, self.service

        def register(server: grpc.aio.Server) -> None:
            csi_grpc.add_IdentityServicer_to_server(identity, server)
            csi_grpc.add_ControllerServicer_to_server(service, server)

        try:
            self._server = await start_unix_server(self.options.csi_socket, register)
        except SocketError as e:
            raise StartupError(str(e)) from e
        if self.options.health_address is not None:
            await self._serve_http(self._health_app(), self.options.health_address, "health")
        if self.options.metrics_address is not None:
            try:
                self._runners.append(
                    await start_metrics_server(self.registry, *self.options.metrics_address)
                )
            except MetricsServerError as e:
                raise StartupError(str(e)) from e
        await self._start_webhook()
        self._spawn(self._lead(), "leader-election")
        log.info(
            "topolvm-controller started",
            extra={"csi_socket": self.options.csi_socket, "plugin": self.names.plugin,
                   "webhook": self.options.webhook_address is not None,
                   "leader_election": self.options.leader is not None},
        )  # fmt: skip

    async def _start_webhook(self) -> None:
        """The pod webhook and its certificates (every replica)."""
        if self.options.webhook_address is None:
            return
        self._stoppers.extend(
            await start_webhook(self.options, self.client, self.names, self.metrics)
        )

    async def _run_reconcilers(self) -> None:
        self.leading = True
        self.metrics.leader.set(1)
        try:
            await run_reconcilers(self.options, self.client, self.names, self.store, self.metrics)
        finally:
            self.leading = False
            self.metrics.leader.set(0)

    async def _lead(self) -> None:
        leader = self.options.leader
        if leader is None:
            await self._run_reconcilers()
            return
        identity = f"{socket.gethostname()}_{uuid.uuid4()}"
        elector = LeaderElector(
            self.client, name=leader.name, namespace=leader.namespace, identity=identity,
            lease_duration=leader.lease_duration, renew_deadline=leader.renew_deadline,
            retry_period=leader.retry_period,
        )  # fmt: skip
        try:
            await elector.run(self._run_reconcilers)
        except LeadershipLost as e:
            # as upstream (controller-runtime): a replica that lost the lease exits, so that a
            # restarted process cannot act on a stale view
            raise StartupError(f"leader election lost: {e}") from e

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await bounded("CSI server", stop_unix_server(server, self.options.csi_socket, 10))
        await bounded("readiness checker", self.identity.stop())
        for what, stop in reversed(self._stoppers):
            await bounded(what, stop())
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=15.0)
        for runner in self._runners:
            await bounded("HTTP server", runner.cleanup())
        log.info("topolvm-controller stopped")


async def serve(client: AsyncClient, options: ControllerOptions) -> None:
    controller = TopolvmController(client, options)
    try:
        await controller.start()
    except BaseException:
        await controller.stop()
        raise
    terminated = asyncio.ensure_future(until_terminated())
    failed = controller.failed
    either: list[asyncio.Future[Any]] = [terminated, failed]
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    terminated.cancel()
    log.info("shutting down")
    await controller.stop()
    if failed.done():
        error = failed.result()
        raise StartupError(f"a part of topolvm-controller failed: {error}") from error

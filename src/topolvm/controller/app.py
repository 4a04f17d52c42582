"""topolvm-controller assembled: informers, the CSI server, health, metrics, the pod webhook
(every replica) and the reconcilers (the elected leader only)."""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Mapping

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node
from prometheus_client import CollectorRegistry
from prometheus_client.process_collector import ProcessCollector

from topolvm import daemon
from topolvm.controller.csi_controller import ControllerService
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.options import ControllerOptions
from topolvm.controller.parts import run_reconcilers, start_webhook
from topolvm.csi.identity import IdentityService, csidriver_check
from topolvm.daemon import Parts, StartupError, serve_grpc, serve_health, serve_metrics
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.leader import LeaderElector, LeadershipLost
from topolvm.k8s.lvstore import LogicalVolumeStore
from topolvm.k8s.runtime import Informer
from topolvm.proto import csi_pb2 as csi
from topolvm.rpc.status import GrpcMetrics
from topolvm.rpc.transport import Service

log = logging.getLogger("topolvm.controller")


class InformerNodes:
    """:class:`~topolvm.controller.ledger.NodeView` over a Node informer."""

    def __init__(self, informer: Informer):
        self.informer = informer

    def annotations(self, node: str) -> Mapping[str, str] | None:
        obj = self.informer.get(node)
        if obj is None:
            return None
        return dict(obj.get("metadata", {}).get("annotations") or {})

    def labels(self, node: str) -> Mapping[str, str] | None:
        obj = self.informer.get(node)
        if obj is None:
            return None
        return dict(obj.get("metadata", {}).get("labels") or {})

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
        self.service = ControllerService(
            self.names, self.store, self.nodes, self.metrics, options.minimums
        )
        self.service.grpc_metrics = GrpcMetrics(self.registry)
        self.node_informer.add_handler(
            lambda event, obj: self.service.ledger.node_changed(str(obj["metadata"]["name"]))
        )
        self.identity = IdentityService(
            self.names, [csidriver_check(client, self.names)], interval=options.probe_interval
        )
        self.identity.grpc_metrics = self.service.grpc_metrics
        self.leading = False
        self._serving = False
        self.parts = Parts("topolvm-controller")

    # -- health ----------------------------------------------------------------------------

    def ready(self) -> tuple[bool, str]:
        if not self.lv_informer.synced.is_set() or not self.node_informer.synced.is_set():
            return False, "informer caches are not synced yet"
        if not self._serving:
            return False, "CSI server is not running"
        return True, "ok"

    # -- start / stop ----------------------------------------------------------------------

    async def check_api(self, attempts: int = 30) -> None:
        """Fail fast, with a clear message, when the CRD is missing or unreadable; wait out
        an API server that is still starting or throttles (transient errors)."""
        lvs = api.logicalvolume_resource(self.names)
        try:
            await api.retry_transient(lambda: api.list_all(self.client, lvs),
                                      "waiting for the API server", first=1.0, most=1.0,
                                      attempts=attempts)  # fmt: skip
        except Exception as e:
            raise StartupError(
                f"cannot list LogicalVolumes of {self.names.group}: {kube.describe(e)} "
                "(is the CRD installed and the controller allowed to read it?)"
            ) from e

    async def start(self) -> None:
        # Health first: kubelet's liveness probe asks whether the process is alive, and a start
        # that waits for the API server (check_api) must not look like a dead one. /readyz says
        # whether it can serve. Stopped last (listeners stop last first).
        health = {"/healthz": daemon.alive, "/readyz": self.ready}
        await serve_health(self.parts, self.options.health_address, health)
        await self.check_api()
        self.parts.spawn(self.lv_informer.run(), "logicalvolume-informer")
        self.parts.spawn(self.node_informer.run(), "node-informer")
        await self.identity.start()
        self.parts.on_stop("readiness checker", self.identity.stop)
        services = csi.DESCRIPTOR.services_by_name
        served = [Service(services["Identity"], self.identity),
                  Service(services["Controller"], self.service)]  # fmt: skip

        # Listeners in this order so that stop (last first) runs: readiness false, the CSI
        # server, the webhook, metrics, then health (kubelet's probes answer until the end).
        await serve_metrics(self.parts, self.registry, self.options.metrics_address)
        if self.options.webhook_address is not None:  # every replica serves the pod webhook
            await start_webhook(self.parts, self.options, self.client, self.names, self.metrics,
                                self.store)  # fmt: skip
        await serve_grpc(self.parts, self.options.csi_socket, served)
        self._serving = True
        self.parts.on_stop("readiness", self._not_serving)
        self.parts.spawn(self._lead(), "leader-election")
        log.info(
            "topolvm-controller started",
            extra={"csi_socket": self.options.csi_socket, "plugin": self.names.plugin,
                   "webhook": self.options.webhook_address is not None,
                   "leader_election": self.options.leader is not None},
        )  # fmt: skip

    async def _not_serving(self) -> None:
        self._serving = False

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
        await self.parts.stop()
        log.info("topolvm-controller stopped")


async def serve(client: AsyncClient, options: ControllerOptions) -> None:
    await daemon.serve(TopolvmController(client, options))

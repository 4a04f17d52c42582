"""topolvm-node: CSI Identity + Node services, the LogicalVolume reconciler and capacity export."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node
from prometheus_client import CollectorRegistry
from prometheus_client.process_collector import ProcessCollector

from topolvm import daemon
from topolvm.config.lvmd import LvmdConfig
from topolvm.constants import DEFAULT_TRANSFER_PORT, Names
from topolvm.csi.identity import IdentityService, csidriver_check
from topolvm.daemon import Parts, StartupError, serve_grpc, serve_health, serve_metrics
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.lvstore import LogicalVolumeStore
from topolvm.k8s.runtime import Controller, Informer
from topolvm.lvmd.server import Options
from topolvm.node.copies import CopyJobs, CopyOptions
from topolvm.node.csi_node import NodeService
from topolvm.node.exporter import CapacityExporter, NodeMetrics
from topolvm.node.finalcut import FinalCutHooks
from topolvm.node.iolimiter import CGROUP_ROOT, IoLimiter
from topolvm.node.iometrics import IoLimitCollector
from topolvm.node.lvmd_client import EmbeddedLvmd, LvmdClient, SocketLvmd
from topolvm.node.orphans import LvAccounting
from topolvm.node.reconciler import LogicalVolumeReconciler
from topolvm.node.registration import Registration, serve_registration
from topolvm.node.transfer import TransferService
from topolvm.node.verify import VerifyJobs
from topolvm.node.volumes import Cuts, LvmdVolumes
from topolvm.process import bounded
from topolvm.proto import csi_pb2 as csi
from topolvm.rpc.status import GrpcMetrics
from topolvm.rpc.transport import Service
from topolvm.transfer.jobs import Limits
from topolvm.transfer.metrics import TransferMetrics
from topolvm.transfer.tokens import TOKEN_SECONDS, Bearer, TransferTokens

log = logging.getLogger("topolvm.node")


@dataclass(frozen=True)
class TransferOptions:
    """The node-to-node copy (docs/mobility.md)."""

    address: tuple[str, int] | None = ("0.0.0.0", DEFAULT_TRANSFER_PORT)  # None: no port
    advertise: str = ""  # how other nodes reach the port; "" leaves it unserved
    peers: tuple[str, ...] = ()  # ServiceAccount usernames accepted on the port
    bearer: Bearer | None = None  # whose tokens this node shows a source (None: none known)
    token_seconds: int = TOKEN_SECONDS
    legacy_token_file: str = ""  # --transfer-token-file: ignored, with a warning
    limits: Limits = field(default_factory=Limits)
    sweep_interval: float = 600.0


@dataclass
class NodeOptions:
    node_name: str
    names: Names
    csi_socket: str
    lvmd_socket: str = ""
    embed_lvmd: LvmdConfig | None = None
    metrics_address: tuple[str, int] | None = ("0.0.0.0", 8080)
    health_address: tuple[str, int] | None = None  # /healthz: what the CSI Probe answers
    registration: Registration | None = None  # built-in kubelet plugin registration
    resync: float = 600.0
    lv_accounting_interval: float = 60.0  # topolvm.node.orphans
    cgroup_root: str = CGROUP_ROOT  # topolvm.node.iolimiter
    probe_interval: float = 60.0
    workers: int = 4
    advertise_capacity_resource: bool = True
    lvmd_options: Options = field(default_factory=Options)
    transfer: TransferOptions = field(default_factory=TransferOptions)


class TopolvmNode:
    """All of topolvm-node's parts, started and stopped together."""

    def __init__(self, client: AsyncClient, options: NodeOptions):
        self.client = client
        self.options = options
        self.names = options.names
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.parts = Parts("topolvm-node")
        self.lvmd: LvmdClient
        self._embedded: EmbeddedLvmd | None = None
        if options.embed_lvmd is not None:  # its LVM refresh is one of this daemon's parts
            self._embedded = EmbeddedLvmd(options.embed_lvmd, options.lvmd_options, self.parts)
            self.lvmd = self._embedded
        else:
            self.lvmd = SocketLvmd(options.lvmd_socket)
        lv_res = api.logicalvolume_resource(self.names)
        self.informer = Informer(client, lv_res, resync=options.resync)
        t = options.transfer
        self.transfer_metrics = TransferMetrics(self.registry, options.node_name)
        volumes, cuts = LvmdVolumes(self.lvmd), Cuts(self.lvmd)
        self.copies = CopyJobs(
            client, self.names, options.node_name, volumes, cuts,
            CopyOptions(t.limits), self.transfer_metrics,
            TransferTokens(client, t.bearer, t.token_seconds),
        )  # fmt: skip
        self.transfer = TransferService(client, self.names, options.node_name, volumes, cuts,
                                        t.limits, self.transfer_metrics, t.peers)  # fmt: skip
        self.transfer.watch(self.informer)
        self.verifier = VerifyJobs(client, self.names, options.node_name, self.lvmd,
                                   t.limits.bandwidth)  # fmt: skip
        self.reconciler = LogicalVolumeReconciler(
            client, self.names, options.node_name, self.lvmd, self.copies, self.verifier
        )
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
        # LVs no LogicalVolume accounts for: logged, counted, listed on the Node, never removed
        self.accounting = LvAccounting(client, self.names, options.node_name, self.lvmd,
                                       self.informer, self.metrics, cuts,
                                       options.lv_accounting_interval)  # fmt: skip
        checks: list[Callable[[], Awaitable[None]]] = []
        if self._embedded is None:
            checks.append(self.lvmd.check_health)
        checks.append(csidriver_check(client, self.names))
        self.identity = IdentityService(self.names, checks, interval=options.probe_interval)
        self.volumes = LogicalVolumeStore(client, self.names, self.informer)
        # each volume's IO limits in the cgroups of the pods that mount it (docs/qos.md)
        self.io_limits = IoLimiter(client, self.names, options.node_name, self.volumes, volumes,
                                   options.cgroup_root)  # fmt: skip
        self.io_limits.watch(self.informer)
        self.registry.register(IoLimitCollector(options.node_name, lambda: self.io_limits.in_force))
        # a move's final cut is made as soon as its source is unmounted here (finalcut.py)
        final = FinalCutHooks(self.volumes, self.transfer.final, options.node_name)
        self.node_service = NodeService(options.node_name, self.names, self.lvmd, self.volumes,
                                        (final, self.io_limits))  # fmt: skip
        self.node_service.grpc_metrics = GrpcMetrics(self.registry)

    async def check_api(self, attempts: int = 30) -> None:
        """Fail fast, with a clear message, when the API or this node's Node object is missing;
        wait out an API server that is still starting or throttles (transient errors)."""
        try:
            node = await api.retry_transient(
                lambda: api.get(self.client, Node, self.options.node_name),
                "waiting for the API server", first=1.0, most=1.0, attempts=attempts,
            )  # fmt: skip
        except Exception as e:
            raise StartupError(kube.describe(e)) from e
        if node is None:
            raise StartupError(
                f"Node {self.options.node_name!r} does not exist in the API: "
                "check --nodename / NODE_NAME (it must be the Kubernetes node name)"
            )

    async def start(self) -> None:
        await self.check_api()
        if self._embedded is not None:
            await self._embedded.start()
        self.parts.spawn(self.informer.run(), "informer")
        self.parts.spawn(self.controller.run(), "controller")
        self.parts.spawn(self.exporter.run(), "exporter")
        self.parts.spawn(self.accounting.run(), "lv-accounting")
        self.parts.on_stop("copies", self.copies.stop)
        self.parts.on_stop("verifications", self.verifier.stop)
        self.parts.on_stop("io-limits", self.io_limits.stop)
        self.parts.spawn(self.io_limits.condition.start(), "io-limits-node-condition")
        self.parts.spawn(self._verify_sweeps(), "verification-cut-sweep")
        await self._serve_transfer()
        await serve_listeners(self.parts, self.options, self.identity, self.node_service,
                              self.registry)  # fmt: skip
        log.info(
            "topolvm-node started",
            extra={
                "node": self.options.node_name,
                "csi_socket": self.options.csi_socket,
                "embedded_lvmd": self._embedded is not None,
                "plugin": self.names.plugin,
                "advertise_capacity_resource": self.options.advertise_capacity_resource,
                "kubelet_registration": self.options.registration is not None,
                "health_probes": self.options.health_address is not None,
            },
        )

    async def _verify_sweeps(self) -> None:
        """Verification cuts whose verification is over (a node down when it ended)."""
        await self.informer.synced.wait()
        node = self.options.node_name
        await self.verifier.sweeps(lambda: {lv.device_class for lv in self.volumes.on_node(node)},
                                   self.options.transfer.sweep_interval)  # fmt: skip

    async def _serve_transfer(self) -> None:
        t = self.options.transfer
        if t.legacy_token_file:
            log.warning("--transfer-token-file is ignored: this node obtains a token per source "
                        "node (TokenRequest), which is all this release's ports accept",
                        extra={"path": t.legacy_token_file})  # fmt: skip
        if t.address is None:
            return
        if not t.advertise or not t.peers:
            missing = "an address to advertise (--transfer-advertise-address, $POD_IP)"
            if t.advertise:
                missing = "a ServiceAccount to accept (--transfer-peer)"
            log.warning(f"transfer port not served: no {missing}; other nodes cannot copy "
                        "volumes from this one")  # fmt: skip
            return
        # in the background: making its key takes a moment, which the CSI socket need not wait
        self.parts.spawn(self._transfer_port(t), "transfer-port")

    async def _transfer_port(self, t: TransferOptions) -> None:
        assert t.address is not None
        # before it starts: a stop while it waits out the API server still closes the port
        self.parts.on_stop("transfer port", self.transfer.stop)
        await self.transfer.start(*t.address, t.advertise)
        await self._check_advertised(t.advertise)
        while True:  # cuts whose job ended while this node was down
            await asyncio.sleep(t.sweep_interval)
            classes = {lv.device_class for lv in self.volumes.on_node(self.options.node_name)}
            await self.transfer.sweep(classes)

    async def _check_advertised(self, advertise: str) -> None:
        """Warn when the port is advertised on an address of the Node (topolvm-node outside a
        pod, say): its peers then likely connect from their nodes' addresses too, which every
        pod there whose traffic leaves with its node's address shares (docs/security.md)."""
        try:
            node = await api.get(self.client, Node, self.options.node_name)
        except kube.KubeError as e:
            ctx = {"node": self.options.node_name, "error": kube.describe(e)}
            log.warning("cannot read this Node to check the transfer port's address", extra=ctx)
            return
        if node_address(node, advertise.strip("[]")):
            log.warning(
                "the transfer port is advertised on this Node's own address: its peers' "
                "addresses are then likely their nodes', shared by every pod of theirs whose "
                "traffic leaves with that address, which can hold a receiver's share of the "
                "port's per-address limits (delay its copies, not read them); the chart's "
                "NetworkPolicy does not cover this mode: run topolvm-node in its pod (the "
                "chart), or keep pods off the port with the host's firewall",
                extra={"advertised": advertise, "node": self.options.node_name},
            )

    async def stop(self) -> None:
        """Stop every part, the kubelet registration and the CSI server first; each step is
        bounded so that one stuck part cannot keep the process alive (kubelet restarts a stuck
        node plugin only once it exits)."""
        await self.parts.stop()
        await bounded("lvmd client", self.lvmd.close())  # after the parts that call lvmd
        log.info("topolvm-node stopped")


def node_address(node: api.Obj | None, address: str) -> bool:
    """Whether ``address`` is one of the Node object's ``status.addresses``."""
    status = (node or {}).get("status") or {}
    listed = status.get("addresses") if isinstance(status, dict) else None
    return any(isinstance(a, dict) and a.get("address") == address for a in listed or [])


async def serve_listeners(
    parts: Parts, options: NodeOptions, identity: IdentityService, node_service: NodeService,
    registry: CollectorRegistry,
) -> None:  # fmt: skip
    """What the kubelet and Prometheus reach: the readiness checks, ``/healthz`` (what the CSI
    Probe answers), ``/metrics``, the CSI socket and, once that serves, the kubelet plugin
    registration socket. In this order so that stop (last first) runs: the registration socket
    goes (the kubelet unregisters the driver), the CSI server, metrics, health, the checks."""
    await identity.start()
    parts.on_stop("readiness checker", identity.stop)

    services = csi.DESCRIPTOR.services_by_name
    served = [Service(services["Identity"], identity), Service(services["Node"], node_service)]
    await serve_health(parts, options.health_address, {"/healthz": identity.checker.status})
    await serve_metrics(parts, registry, options.metrics_address)
    await serve_grpc(parts, options.csi_socket, served)
    if options.registration is not None:
        await serve_registration(
            parts, options.registration, options.csi_socket, node_service.grpc_metrics
        )


async def serve(client: AsyncClient, options: NodeOptions) -> None:
    await daemon.serve(TopolvmNode(client, options))

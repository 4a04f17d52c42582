"""Publishes this node's free capacity: Node annotations and Prometheus gauges (spec §9.1, §9.2).

Every message of lvmd's Watch stream (at start, after each LV change, at least every 10 minutes)
updates the gauges and merge-patches the Node: one ``capacity.<p>/<device-class>`` annotation
per class (``00default`` for the default class), and the ``<p>/node`` finalizer when the Node
lacks it. It also keeps ``<plugin>/capacity`` advertised as an extended resource of the Node (or
removed, with ``--advertise-capacity-resource=false``; see :mod:`topolvm.node.extresource`): at
start and on every message, so a count that something removed or zeroed comes back with the
next capacity refresh.

The first message after start (or after a failed update) reads the Node first, and a Node that
is being deleted is not written at all. After that the annotation patch comes first and its
answer, the Node as stored, is what the rest reads: one request per message in the steady
state, not a GET and a patch. Once the Node has a deletionTimestamp, the exporter writes nothing
after the annotation patch whose answer shows it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from grpclib.const import Status
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node
from prometheus_client import CollectorRegistry, Gauge

from topolvm import capacity_annotations
from topolvm.constants import Names
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.orphanlvs import OrphanLv
from topolvm.node import extresource
from topolvm.node.lvmd_client import LvmdCallError, LvmdClient
from topolvm.proto import lvmd_pb2 as pb

log = logging.getLogger(__name__)


class NodeMetrics:
    """The six upstream gauges and two of orphan LVs, namespace ``topolvm``, labels ``node``
    and ``device_class``."""

    def __init__(self, registry: CollectorRegistry, node_name: str):
        self.node_name = node_name
        labels = ["node", "device_class"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, namespace="topolvm", registry=registry)

        self.available = gauge(
            "volumegroup_available_bytes", "LVM VG available bytes under lvmd management"
        )
        self.size = gauge("volumegroup_size_bytes", "LVM VG size bytes under lvmd management")
        self.pool_size = gauge("thinpool_size_bytes", "LVM VG Thin Pool raw size bytes")
        self.pool_data = gauge("thinpool_data_percent", "LVM VG Thin Pool data usage percent")
        self.pool_meta = gauge(
            "thinpool_metadata_percent", "LVM VG Thin Pool metadata usage percent"
        )
        self.pool_over = gauge(
            "thinpool_overprovisioned_available",
            "LVM VG Thin Pool bytes available with overprovisioning",
        )
        # not upstream's: LVs no LogicalVolume claims (topolvm.node.orphans)
        self.orphan_count = gauge(
            "orphan_logical_volumes", "LVs on the node that no LogicalVolume claims"
        )
        self.orphan_bytes = gauge(
            "orphan_logical_volume_bytes", "Bytes of the LVs that no LogicalVolume claims"
        )

    def orphans(self, device_classes: Iterable[str], found: Iterable[OrphanLv]) -> None:
        """Count ``found`` per device class (0 for each of ``device_classes`` without one)."""
        counts = dict.fromkeys(device_classes, 0)
        sizes = dict.fromkeys(device_classes, 0)
        for o in found:
            counts[o.device_class] = counts.get(o.device_class, 0) + 1
            sizes[o.device_class] = sizes.get(o.device_class, 0) + o.size_bytes
        for dc, n in counts.items():
            self.orphan_count.labels(self.node_name, dc).set(n)
            self.orphan_bytes.labels(self.node_name, dc).set(sizes[dc])

    def update(self, msg: pb.WatchResponse) -> None:
        for item in msg.items:
            labels = (self.node_name, item.device_class)
            self.available.labels(*labels).set(item.free_bytes)
            self.size.labels(*labels).set(item.size_bytes)
            if item.HasField("thin_pool"):
                tp = item.thin_pool
                self.pool_size.labels(*labels).set(tp.size_bytes)
                self.pool_data.labels(*labels).set(tp.data_percent)
                self.pool_meta.labels(*labels).set(tp.metadata_percent)
                self.pool_over.labels(*labels).set(tp.overprovision_bytes)


def node_annotations(names: Names, msg: pb.WatchResponse) -> dict[str, str]:
    """``capacity.<p>/<dc>`` → decimal bytes: thin classes report overprovisioned free bytes."""
    by_class = {
        item.device_class: (
            item.thin_pool.overprovision_bytes if item.HasField("thin_pool") else item.free_bytes
        )
        for item in msg.items
    }
    return capacity_annotations.encode_node(names, msg.free_bytes, by_class)


class CapacityExporter:
    def __init__(
        self,
        client: AsyncClient,
        names: Names,
        node_name: str,
        lvmd: LvmdClient,
        metrics: NodeMetrics,
        *,
        max_backoff: float = 30.0,
        advertise_resource: bool = True,
    ):
        self.client = client
        self.names = names
        self.node_name = node_name
        self.lvmd = lvmd
        self.metrics = metrics
        self.max_backoff = max_backoff
        self.advertise_resource = advertise_resource
        self.updates = 0  # Node patches sent, for diagnostics and tests
        self.stopped = asyncio.Event()  # set once the Node is being deleted
        self._published = False  # the last message went through: no read before the next

    async def publish(self, msg: pb.WatchResponse) -> bool:
        """Update gauges and the Node; False once the Node is being deleted."""
        self.metrics.update(msg)
        published, self._published = self._published, False  # again once every step succeeded
        if not published:
            known = await api.get(self.client, Node, self.node_name)
            if known is None:
                return self._missing()
            if self._deleting(known):
                return False
            await self._ensure_finalizer(known)  # before the annotations: never one without it
        patch = {"metadata": {"annotations": node_annotations(self.names, msg)}}
        try:
            node = await api.patch_merge(self.client, Node, self.node_name, patch)
        except kube.NotFound:
            return self._missing()
        self.updates += 1
        if self._deleting(node):
            return False
        node = await self._ensure_finalizer(node)
        await self.sync_resource(node)
        self._published = True
        return True

    async def _ensure_finalizer(self, node: api.Obj) -> api.Obj:
        """Add the ``<p>/node`` finalizer if ``node`` (as just read or written) lacks it."""
        if self.names.node_finalizer in api.finalizers(node):
            return node
        stored = await api.set_finalizer(
            self.client, Node, self.node_name, self.names.node_finalizer, True, known=node
        )
        return stored or node

    def _missing(self) -> bool:
        log.warning("Node object not found; capacity not published", extra={"node": self.node_name})
        return True

    def _deleting(self, node: api.Obj) -> bool:
        if not node.get("metadata", {}).get("deletionTimestamp"):
            return False
        log.info("Node is being deleted; no more capacity updates", extra={"node": self.node_name})
        return True

    async def sync_resource(self, node: api.Obj | None = None) -> None:
        """Advertise (or remove) the extended resource on the Node, as read (``node``) or read
        now. Best effort: a failure is logged and retried with the next capacity refresh; it
        never holds up the capacity annotations."""
        resource = self.names.capacity_resource
        try:
            if node is None:
                node = await api.get(self.client, Node, self.node_name)
            if node is None or node.get("metadata", {}).get("deletionTimestamp"):
                return
            await extresource.sync(
                self.client, self.node_name, resource, self.advertise_resource, node
            )
        except Exception as e:
            hint = (
                " (topolvm-node needs RBAC 'patch' on nodes/status)"
                if isinstance(e, kube.Forbidden)
                else ""
            )
            log.warning(
                f"cannot update extended resource {resource} on the Node: {kube.describe(e)}{hint}",
                extra={"node": self.node_name, "advertise": self.advertise_resource},
            )

    async def run(self) -> None:
        """Follow lvmd's Watch stream until cancelled or the Node is deleted; reconnects."""
        await self.sync_resource()  # at once, even while lvmd is not reachable yet
        failures = 0
        while True:
            try:
                async for msg in self.lvmd.watch():
                    failures = 0
                    if not await self.publish(msg):
                        self.stopped.set()
                        return
                raise LvmdCallError(Status.UNAVAILABLE, "lvmd closed the Watch stream")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                failures += 1
                delay = min(self.max_backoff, 0.5 * 2 ** min(failures, 8))
                log.warning(
                    f"capacity export interrupted: {kube.describe(e)}",
                    extra={"node": self.node_name, "retry_in": delay},
                )
                await asyncio.sleep(delay)

"""The free bytes topolvm-controller offers per node and device class: the Node's capacity
annotation minus the volumes in flight there (:mod:`.inflight`). Every reservation's start and
end is logged with the annotation it was measured against, and the totals are exported as the
``in_flight_bytes`` metric."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from topolvm import capacity_annotations
from topolvm.constants import Names
from topolvm.controller.inflight import Ended, InFlight
from topolvm.controller.metrics import ControllerMetrics
from topolvm.k8s.lvstore import LogicalVolumeStore, VolumeRequest

log = logging.getLogger(__name__)


class NodeView(Protocol):
    """The controller's view of Nodes (an informer cache)."""

    def annotations(self, node: str) -> Mapping[str, str] | None:
        """The Node's annotations; None if there is no such Node."""

    def by_topology(self, key: str, value: str) -> str | None:
        """Name of the Node whose label ``key`` is ``value``."""

    def names(self) -> list[str]: ...

    def labels(self, node: str) -> Mapping[str, str] | None:
        """The Node's labels; None if there is no such Node."""


class CapacityLedger:
    def __init__(
        self,
        names: Names,
        nodes: NodeView,
        store: LogicalVolumeStore,
        metrics: ControllerMetrics,
        inflight: InFlight | None = None,
    ):
        self.names = names
        self.nodes = nodes
        self.store = store
        self.metrics = metrics
        self.inflight = inflight or InFlight()

    def annotation(self, node: str, device_class: str) -> str | None:
        ann = self.nodes.annotations(node) or {}
        return ann.get(self.names.capacity_annotation(device_class))

    def free_bytes(self, node: str, device_class: str) -> int:
        """The node's annotated free bytes minus what volumes in flight there have taken."""
        free = capacity_annotations.node_free(
            self.names, self.nodes.annotations(node), device_class
        )
        self._ended(self.inflight.observe(node, lambda dc: self.annotation(node, dc)))
        self._ended(self.inflight.expire())
        creating = [
            (lv.name, lv.size)
            for lv in self.store.on_node(node)
            if lv.device_class == device_class and not lv.volume_id and not lv.code
        ]
        return max(0, free - self.inflight.taken(node, device_class, creating))

    def node_changed(self, node: str) -> None:
        """Called on every new version of a Node: reservations it now shows end."""
        self._ended(self.inflight.observe(node, lambda dc: self.annotation(node, dc)))
        self._export()

    def reserve(self, req: VolumeRequest, *, made: bool) -> None:
        """Before the create's first await, so that the caller's capacity check and this are
        one step for the event loop. ``made``: see :meth:`.InFlight.reserve`."""
        annotation = self.annotation(req.node_name, req.device_class)
        self.inflight.reserve(req.name, req.node_name, req.device_class, req.size, annotation,
                              made=made)  # fmt: skip
        log.info(
            "capacity reserved",
            extra={"volume": req.name, "node": req.node_name, "device_class": req.device_class,
                   "bytes": req.size, "annotation": annotation, "made": made},
        )  # fmt: skip
        self._export()

    def abandon(self, name: str) -> None:
        """The caller gave up (its deadline) while the node goes on making the LV."""
        self.inflight.abandon(name)
        self._export()

    def release(self, name: str) -> None:
        self.inflight.release(name)
        self._export()

    def settle(self, name: str) -> None:
        """The LV exists; its bytes count until the Node's annotation shows them."""
        self.inflight.settle(name)
        self._export()

    def _ended(self, ended: list[Ended]) -> None:
        for e in ended:
            r = e.reservation
            log.info(
                "capacity reservation ended",
                extra={"volume": r.name, "node": r.node, "device_class": r.device_class,
                       "bytes": r.size, "why": e.why, "after": round(e.after, 1),
                       "annotation": self.annotation(r.node, r.device_class)},
            )  # fmt: skip

    def _export(self) -> None:
        self.metrics.in_flight_bytes.clear()
        for (node, dc), size in self.inflight.totals().items():
            self.metrics.in_flight_bytes.labels(node, capacity_annotations.class_key(dc)).set(size)

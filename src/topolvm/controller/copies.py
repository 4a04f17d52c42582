"""Where a restore, a clone or a snapshot gets its data from, and where it lives (pure rules of
the node-to-node copy, docs/mobility.md).

- A restore or clone goes to the node kube-scheduler chose (external-provisioner's first
  preferred segment, with WaitForFirstConsumer). With Immediate binding no one chose: it stays on
  its source's node when the topology allows (as upstream's), else goes to the first allowed
  node. On the source's own node the node makes it as before (a thin snapshot, or for a thick
  volume a copy within the node); elsewhere it is a copy target, filled from the source's
  node.
- A snapshot stays on its source's node unless its VolumeSnapshotClass asks otherwise:
  ``<plugin>/snapshot-placement: other-node`` keeps it on the node with the most room in the
  device class (not the source's), ``<plugin>/snapshot-node-selector`` on such a node with the
  given labels. Such a snapshot survives its source's node.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from topolvm.constants import Names
from topolvm.controller.sizing import node_from_topology
from topolvm.k8s.lvobject import LogicalVolumeObject
from topolvm.placement import placement_error

SOURCE_NODE, OTHER_NODE = "source-node", "other-node"
PVC_NAME, PVC_NAMESPACE = "csi.storage.k8s.io/pvc/name", "csi.storage.k8s.io/pvc/namespace"
SNAPSHOT_NAME = "csi.storage.k8s.io/volumesnapshot/name"
SNAPSHOT_NAMESPACE = "csi.storage.k8s.io/volumesnapshot/namespace"
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class PlacementError(ValueError):
    """A VolumeSnapshotClass parameter that makes no sense (INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class Placement:
    off_node: bool
    selector: tuple[tuple[str, str | None], ...] = ()  # (key, value); None: the key exists

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(
            key in labels if value is None else labels.get(key) == value
            for key, value in self.selector
        )

    def describe(self) -> str:
        if not self.selector:
            return "another node"
        terms = ",".join(k if v is None else f"{k}={v}" for k, v in self.selector)
        return f"another node labelled {terms}"


def placement(params: Mapping[str, str], names: Names) -> Placement:
    """Where a snapshot goes, from its VolumeSnapshotClass's ``params`` (which also say where
    its restores go: checked here, read by the pod webhook)."""
    if bad := placement_error(params, names, "VolumeSnapshotClass parameters"):
        raise PlacementError(bad)
    where = params.get(names.snapshot_placement_param, "") or SOURCE_NODE
    if where not in (SOURCE_NODE, OTHER_NODE):
        raise PlacementError(
            f"{names.snapshot_placement_param} must be {SOURCE_NODE} or {OTHER_NODE}, got {where!r}"
        )
    text = params.get(names.snapshot_node_selector_param, "").strip()
    selector: list[tuple[str, str | None]] = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        key, eq, value = term.partition("=")
        key, value = key.strip(), value.strip()
        if not _LABEL_KEY.match(key) or len(key) > 317 or (eq and not _LABEL_VALUE.match(value)):
            raise PlacementError(
                f"{names.snapshot_node_selector_param}: {term!r} is not key=value or key "
                "(a label selector of equalities)"
            )
        selector.append((key, value if eq else None))
    if where == SOURCE_NODE and selector and names.snapshot_placement_param in params:
        raise PlacementError(
            f"{names.snapshot_node_selector_param} chooses another node, but "
            f"{names.snapshot_placement_param} says {SOURCE_NODE}"
        )
    return Placement(off_node=where == OTHER_NODE or bool(selector), selector=tuple(selector))


def snapshot_node(
    where: Placement, source_node: str, free: Mapping[str, int],
    labels: Mapping[str, Mapping[str, str]], size: int,
) -> str | None:  # fmt: skip
    """The node with the most free bytes (ties: the name) among those ``where`` allows, other
    than the source's, with room for ``size``; None when there is none."""
    candidates = [
        (bytes_free, node) for node, bytes_free in free.items()
        if node != source_node and bytes_free >= size and where.matches(labels.get(node) or {})
    ]  # fmt: skip
    if not candidates:
        return None
    return min(candidates, key=lambda c: (-c[0], c[1]))[1]


def restore_node(
    source_node: str, preferred: Sequence[Mapping[str, str]],
    requisite: Sequence[Mapping[str, str]], key: str, scheduled: bool | None,
) -> str:  # fmt: skip
    """Where a restore or clone goes. ``scheduled``: the claim has kube-scheduler's
    selected-node (True), has none (False: Immediate binding), or is unknown (None: no claim
    name came with the request; the first preferred segment is followed)."""
    allowed = {s.get(key) for s in requisite}
    if scheduled is False and (not requisite or source_node in allowed):
        return source_node
    return node_from_topology(preferred, requisite, key) or source_node


def waiting_object(params: Mapping[str, str], name: str, namespace: str) -> str | None:
    """``<namespace>/<name>`` of the claim or VolumeSnapshot that waits for a volume (from
    the sidecars' ``--extra-create-metadata``), for the copy's Events."""
    n, ns = params.get(name, ""), params.get(namespace, "")
    return f"{ns}/{n}" if n and ns else None


def readers(lv: LogicalVolumeObject, everything: Iterable[LogicalVolumeObject]) -> list[str]:
    """Copies in progress that read ``lv`` (to fill another volume, here or elsewhere)."""
    found = []
    for other in everything:
        reads = other.copy_source == lv.name or (other.source == lv.name and other.copy)
        if reads and not other.copy_done and not other.deleting and not other.code:
            done = ""
            if other.copy is not None and other.copy.total_bytes:
                done = f", {other.copy.done_bytes * 100 // other.copy.total_bytes}% done"
            found.append(f"{other.name} on node {other.node_name}{done}")
    return found

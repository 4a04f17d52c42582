"""A restore or clone stays on its source's node when it can (docs/mobility.md, "A restore
stays local when it can").

A claim restored from a VolumeSnapshot or cloned from another claim is filled on the node
kube-scheduler picks for its pod. On the source's node that is a local snapshot or clone, at
once; anywhere else a node-to-node copy fills it first. kube-scheduler knows nothing of that, so
the pod webhook tells it: a pod that mounts such a claim (Pending, of a TopoLVM StorageClass)
gets a *preferred* node affinity for the source's node (``matchFields`` on ``metadata.name``,
weight 100). Preferred, not required: where the pod cannot run there (no room, a taint, its own
affinity), kube-scheduler places it elsewhere and the copy happens as before. This works in
every scheduling mode, capacity tracking (the chart's default) included, since it only adds a
score.

``<plugin>/restore-placement: anywhere`` in the claim's StorageClass, or in the snapshot's
VolumeSnapshotClass, turns it off; ``source-node`` (the default) keeps it.

The preference is a courtesy: a source that cannot be found (a snapshot not ready yet, a read
that fails) leaves the pod as it is, with a warning, and never refuses it.

Pure rules here; the reads go through the webhook's :class:`Sources` reader.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from topolvm.constants import Names
from topolvm.placement import prefers_source

Obj = dict[str, Any]

WEIGHT = 100  # the most a preferred term can weigh
SNAPSHOT_GROUP = "snapshot.storage.k8s.io"


class Sources(Protocol):
    """The reads that find a source's node; each returns None when the object is missing."""

    async def get_pvc(self, namespace: str, name: str) -> Obj | None: ...

    async def get_pv(self, name: str) -> Obj | None: ...

    async def get_volumesnapshot(self, namespace: str, name: str) -> Obj | None: ...

    async def get_volumesnapshotcontent(self, name: str) -> Obj | None: ...

    async def get_volumesnapshotclass(self, name: str) -> Obj | None: ...

    async def node_of_volume(self, volume_id: str) -> str | None:
        """The node of the LogicalVolume whose ``status.volumeID`` is ``volume_id``."""
        ...


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def data_source(pvc: Obj) -> tuple[str, str] | None:
    """``("VolumeSnapshot" | "PersistentVolumeClaim", name)`` a claim is filled from (its
    ``dataSourceRef``, else ``dataSource``; in the claim's namespace); None for none or any
    other kind (a volume populator's)."""
    spec = _map(pvc.get("spec"))
    ref = _map(spec.get("dataSourceRef")) or _map(spec.get("dataSource"))
    if ref.get("namespace") not in (None, "", _map(pvc.get("metadata")).get("namespace")):
        return None  # a cross-namespace source: not ours to follow
    kind, group, name = ref.get("kind"), ref.get("apiGroup") or "", ref.get("name")
    if not isinstance(name, str) or not name:
        return None
    if kind == "VolumeSnapshot" and group == SNAPSHOT_GROUP:
        return "VolumeSnapshot", name
    if kind == "PersistentVolumeClaim" and group == "":
        return "PersistentVolumeClaim", name
    return None


def _refers_to(ref: Any, namespace: str, name: str, uid: str) -> bool:
    """A back-reference (a PV's ``claimRef``, a content's ``volumeSnapshotRef``) names the
    object read: a user can write the forward one (a claim's ``volumeName``), never this."""
    r = _map(ref)
    return (r.get("namespace"), r.get("name"), r.get("uid")) == (namespace, name, uid) and bool(uid)


async def _clone_source(namespace: str, name: str, sources: Sources, names: Names) -> Any:
    claim = _map(await sources.get_pvc(namespace, name))
    meta, spec = _map(claim.get("metadata")), _map(claim.get("spec"))
    volume = spec.get("volumeName")
    if _map(claim.get("status")).get("phase") != "Bound" or not isinstance(volume, str):
        return None
    pv = _map(_map(await sources.get_pv(volume)).get("spec"))
    if not _refers_to(pv.get("claimRef"), namespace, name, str(meta.get("uid") or "")):
        return None  # a claim that names a volume bound to another one
    handle = _map(pv.get("csi"))
    return handle.get("volumeHandle") if handle.get("driver") == names.plugin else None


async def _snapshot_source(namespace: str, name: str, sources: Sources, names: Names) -> Any:
    snapshot = _map(await sources.get_volumesnapshot(namespace, name))
    status = _map(snapshot.get("status"))
    if status.get("readyToUse") is not True:
        return None
    class_name = _map(snapshot.get("spec")).get("volumeSnapshotClassName")
    if isinstance(class_name, str) and class_name:
        vsclass = await sources.get_volumesnapshotclass(class_name)
        if vsclass is not None and vsclass.get("driver") != names.plugin:
            return None
        what = f"VolumeSnapshotClass {class_name}"
        if vsclass is not None and not prefers_source(vsclass.get("parameters"), names, what):
            return None
    content_name = status.get("boundVolumeSnapshotContentName")
    if not isinstance(content_name, str) or not content_name:
        return None
    content = _map(await sources.get_volumesnapshotcontent(content_name))
    spec = _map(content.get("spec"))
    uid = str(_map(snapshot.get("metadata")).get("uid") or "")
    if spec.get("driver") != names.plugin or not _refers_to(
        spec.get("volumeSnapshotRef"), namespace, name, uid
    ):
        return None  # a content of another driver, or bound to another snapshot
    return _map(content.get("status")).get("snapshotHandle") or _map(spec.get("source")).get(
        "snapshotHandle"
    )


async def source_node(pvc: Obj, sources: Sources, names: Names) -> str | None:
    """The node a Pending claim's data source is on, when a restore or clone there is
    preferred; None when it has no such source, the snapshot's class turns the preference off,
    or the source is not ready (or not the one it names: back-references are checked, so no
    claim learns the node of a volume that is not its source's). Read failures and bad
    parameters raise."""
    found = data_source(pvc)
    if found is None:
        return None
    kind, name = found
    namespace = str(_map(pvc.get("metadata")).get("namespace") or "")
    if kind == "PersistentVolumeClaim":
        volume_id = await _clone_source(namespace, name, sources, names)
    else:
        volume_id = await _snapshot_source(namespace, name, sources, names)
    if not isinstance(volume_id, str) or not volume_id:
        return None
    return await sources.node_of_volume(volume_id)


def _term(node: str) -> Obj:
    return {
        "weight": WEIGHT,
        "preference": {
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]
        },
    }


def preferring(pod: Obj, nodes: Sequence[str]) -> Obj:
    """A copy of ``pod`` that prefers each of ``nodes`` (a preferred node affinity term each,
    after the pod's own, none added twice); ``pod`` itself when it is bound to a node."""
    if not nodes or _map(pod.get("spec")).get("nodeName"):
        return pod
    out = copy.deepcopy(pod)
    spec = out["spec"]
    if not isinstance(spec.get("affinity"), dict):
        spec["affinity"] = {}
    if not isinstance(spec["affinity"].get("nodeAffinity"), dict):
        spec["affinity"]["nodeAffinity"] = {}
    affinity = spec["affinity"]["nodeAffinity"]
    key = "preferredDuringSchedulingIgnoredDuringExecution"
    if not isinstance(affinity.get(key), list):
        affinity[key] = []
    for node in dict.fromkeys(nodes):
        if _term(node) not in affinity[key]:
            affinity[key].append(_term(node))
    return out

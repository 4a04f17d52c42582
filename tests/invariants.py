"""What must hold after every chaos scenario, once the cluster has settled: pure rules over one
observation of the cluster (objects from the API server, LVM's own report from each node).
``violations(view)`` names each broken rule; [] means the driver lost nothing and left nothing.
tests/chaos_helpers.py makes the observation; tests/test_unit_invariants.py checks each rule."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from topolvm.constants import NORMAL, Names
from topolvm.k8s.lvobject import parse_quantity

Obj = dict[str, Any]


@dataclass(frozen=True)
class DeviceClass:
    """A device class as the nodes' lvmd config has it."""

    name: str
    vg: str
    spare: int
    thin_pool: str | None = None
    ratio: float = 1.0


@dataclass(frozen=True)
class Lv:
    size: int
    attr: str
    pool: str = ""

    @property
    def is_thin_pool(self) -> bool:
        return self.attr.startswith("t")


@dataclass
class NodeView:
    """One node: its LVs and VG sizes as LVM reports them, and its Node's annotations."""

    name: str
    lvs: dict[str, dict[str, Lv]]  # VG -> LV name -> LV
    vg_free: dict[str, int]  # VG -> free bytes
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass
class ClusterView:
    nodes: dict[str, NodeView]
    classes: list[DeviceClass]
    pvs: list[Obj]
    logical_volumes: list[Obj]
    capacities: list[Obj]  # CSIStorageCapacity objects
    storage_classes: dict[str, str]  # WaitForFirstConsumer class -> device class (tracked ones)
    names: Names = NORMAL


def pv_node(pv: Obj, names: Names = NORMAL) -> str | None:
    """The node a PV of this driver is pinned to by its node affinity."""
    terms = (((pv["spec"].get("nodeAffinity") or {}).get("required") or {})
             .get("nodeSelectorTerms") or [])  # fmt: skip
    for term in terms:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == names.topology_key and expr.get("values"):
                return str(expr["values"][0])
    return None


def expected_capacity(node: NodeView, dc: DeviceClass) -> int:
    """What the node must advertise for ``dc``: VG free minus spare (thick), or the pool's
    overprovisioned size minus what its thin volumes claim (thin: no spare, as upstream's Watch
    reports it); never below 0."""
    if dc.thin_pool is None:
        return max(0, node.vg_free.get(dc.vg, 0) - dc.spare)
    lvs = node.lvs.get(dc.vg, {})
    pool = lvs.get(dc.thin_pool)
    if pool is None:
        return 0
    used = sum(lv.size for lv in lvs.values() if lv.pool == dc.thin_pool)
    return max(0, math.floor(dc.ratio * pool.size) - used)


def _ours(pv: Obj, names: Names) -> bool:
    return bool((pv["spec"].get("csi") or {}).get("driver") == names.plugin)


def _pv_rules(view: ClusterView) -> list[str]:
    out = []
    handles = Counter(pv["spec"]["csi"]["volumeHandle"] for pv in view.pvs
                      if _ours(pv, view.names))  # fmt: skip
    out += [f"{n} PVs share volume {h}" for h, n in handles.items() if n > 1]
    for pv in view.pvs:
        if not _ours(pv, view.names) or (pv.get("status") or {}).get("phase") != "Bound":
            continue
        name, handle = pv["metadata"]["name"], pv["spec"]["csi"]["volumeHandle"]
        node = pv_node(pv, view.names)
        if node not in view.nodes:
            continue
        found = [(vg, lvs[handle]) for n in view.nodes.values() for vg, lvs in n.lvs.items()
                 if handle in lvs]  # fmt: skip
        here = [lv for vg, lv in found if handle in view.nodes[node].lvs.get(vg, {})]
        if len(found) != 1 or not here:
            out.append(f"Bound PV {name} has {len(found)} LVs named {handle} ({len(here)} on "
                       f"its node {node}), not exactly one there")  # fmt: skip
            continue
        size = parse_quantity(pv["spec"]["capacity"]["storage"])
        if here[0].size < size:
            out.append(f"Bound PV {name}: LV {handle} on {node} has {here[0].size} bytes, "
                       f"less than the PV's {size}")  # fmt: skip
    return out


CUT_PREFIX, ROUND_TWO, VERIFY_PREFIX = "cut.", ".r2", "verify."


def _copy_running(o: Obj, second: bool) -> bool:
    """A copy still fills the LogicalVolume ``o``: its first cut (or with ``second``, a move's
    second cut) is still read. A move's first cut is the base of its final copy, so it is kept
    from the pre-copy's end until the final copy is done."""
    spec, status = o.get("spec") or {}, o.get("status") or {}
    copy_spec, copy = spec.get("copy") or {}, status.get("copy") or {}
    if not (copy_spec.get("source") or copy) or o["metadata"].get("deletionTimestamp"):
        return False
    if status.get("code"):
        return False
    want = max(int(copy_spec.get("round") or 1), 1)
    done = copy.get("phase") == "Done" and max(int(copy.get("round") or 1), 1) == want
    if second:
        return want >= 2 and not done
    return not done or (bool(copy_spec.get("keepCut")) and want < 2)


def _verify_running(o: Obj) -> bool:
    """The node of ``o`` has not reported the digest its ``spec.verify.id`` asks for."""
    asked = ((o.get("spec") or {}).get("verify") or {}).get("id")
    told = (o.get("status") or {}).get("verify") or {}
    if not asked or o["metadata"].get("deletionTimestamp"):
        return False
    return told.get("id") != asked or told.get("phase") not in ("Done", "Failed")


def running_cut(lv_name: str, node: str, logical_volumes: list[Obj]) -> bool:
    """``lv_name`` on ``node`` is a cut that a copy still running reads (``cut.<target UID>``,
    a move's second ``cut.<UID>.r2``, on the node of the copy's source), or a verification's
    (``verify.<UID>``, on that volume's node)."""
    by_uid = {str(o["metadata"].get("uid")): o for o in logical_volumes}
    by_name = {str(o["metadata"].get("name")): o for o in logical_volumes}
    if lv_name.startswith(VERIFY_PREFIX):
        o = by_uid.get(lv_name[len(VERIFY_PREFIX) :])
        return o is not None and o["spec"].get("nodeName") == node and _verify_running(o)
    if not lv_name.startswith(CUT_PREFIX):
        return False
    job = lv_name[len(CUT_PREFIX) :]
    second = job.endswith(ROUND_TWO)
    target = by_uid.get(job.removesuffix(ROUND_TWO))
    if target is None or not _copy_running(target, second):
        return False
    spec = target.get("spec") or {}
    source = by_name.get((spec.get("copy") or {}).get("source") or spec.get("source") or "")
    return source is not None and source["spec"].get("nodeName") == node


def unaccounted_lvs(view: ClusterView) -> list[str]:
    """LVs in the device classes' VGs that are neither a LogicalVolume's (its volume id, or
    its UID while its node creates it), a thin pool, nor a cut a running copy reads."""
    out = []
    claimed = {(o["spec"].get("nodeName"), v)
               for o in view.logical_volumes
               for v in ((o.get("status") or {}).get("volumeID"), o["metadata"].get("uid"))
               if v}  # fmt: skip
    vgs = {dc.vg for dc in view.classes}
    for node in view.nodes.values():
        for vg, lvs in node.lvs.items():
            for lv_name, lv in lvs.items():
                if vg not in vgs or lv.is_thin_pool or (node.name, lv_name) in claimed:
                    continue
                if running_cut(lv_name, node.name, view.logical_volumes):
                    continue
                out.append(f"LV {vg}/{lv_name} on {node.name} has no LogicalVolume "
                           f"({lv.size} bytes; not a cut of a copy still running)")  # fmt: skip
    return out


def _lv_object_rules(view: ClusterView) -> list[str]:
    out = []
    mine = [o for o in view.logical_volumes if o["spec"].get("nodeName") in view.nodes]
    names = Counter(o["spec"].get("name") for o in mine)
    out += [f"{n} LogicalVolumes for volume {v}" for v, n in names.items() if n > 1]
    for o in mine:
        name, node = o["metadata"]["name"], o["spec"]["nodeName"]
        if o["metadata"].get("deletionTimestamp"):
            out.append(f"LogicalVolume {name} still being deleted")
        volume_id = (o.get("status") or {}).get("volumeID")
        if not volume_id:
            out.append(f"LogicalVolume {name} on {node} has no LV (status.volumeID unset)")
            continue
        if not any(volume_id in lvs for lvs in view.nodes[node].lvs.values()):
            out.append(f"LogicalVolume {name}: its LV {volume_id} is not on {node}")
    return out + unaccounted_lvs(view)


def _capacity_rules(view: ClusterView) -> list[str]:
    out = []
    prefix = view.names.capacity_prefix
    advertised: dict[tuple[str, str], int] = {}
    for node in view.nodes.values():
        for dc in view.classes:
            raw = node.annotations.get(prefix + dc.name)
            want = expected_capacity(node, dc)
            if raw is None:
                out.append(f"Node {node.name} has no {prefix}{dc.name} annotation")
                continue
            advertised[(node.name, dc.name)] = int(raw)
            if int(raw) != want:
                out.append(f"Node {node.name} advertises {raw} bytes for {dc.name}; LVM says "
                           f"{want}")  # fmt: skip
    seen: set[tuple[str, str]] = set()
    for cap in view.capacities:
        sc = cap.get("storageClassName", "")
        labels = (cap.get("nodeTopology") or {}).get("matchLabels") or {}
        on = labels.get(view.names.topology_key)
        if sc not in view.storage_classes or on not in view.nodes:
            continue
        seen.add((sc, on))
        want_cap = advertised.get((on, view.storage_classes[sc]))
        got = parse_quantity(str(cap.get("capacity", "0")))
        if want_cap is not None and got != want_cap:
            out.append(f"CSIStorageCapacity {cap['metadata']['name']} ({sc} on {on}) says "
                       f"{got} bytes; the Node says {want_cap}")  # fmt: skip
    for sc in view.storage_classes:
        for name in view.nodes:
            if (sc, name) not in seen:
                out.append(f"no CSIStorageCapacity for {sc} on {name}")
    return out


def volume_violations(view: ClusterView) -> list[str]:
    """The rules over LVs and LogicalVolumes alone: each node's LVs are exactly its
    LogicalVolumes' LVs, its thin pools, and the cuts of copies still running."""
    return _lv_object_rules(view)


def violations(view: ClusterView) -> list[str]:
    """Every broken invariant, each in one sentence; [] when all hold."""
    return [*_pv_rules(view), *_lv_object_rules(view), *_capacity_rules(view)]

"""The pre-flight of a move (pure): what the cluster says about one claim (:class:`Facts`)
becomes a :class:`Plan` or a :class:`~topolvm.move.rules.Refused`, by the checks of
:mod:`topolvm.move.rules` that topolvm-controller makes again before it starts the move."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from topolvm.constants import Names
from topolvm.k8s.lvobject import InvalidQuantity, LogicalVolumeObject, parse_quantity
from topolvm.k8s.moveobject import MovePhase, VolumeMoveObject
from topolvm.move import rules
from topolvm.move.rules import Estimate, Refused

Obj = dict[str, Any]


@dataclass(frozen=True)
class Facts:
    """What the pre-flight of one claim reads (the API's JSON)."""

    namespace: str
    claim: str
    pvc: Obj | None
    pv: Obj | None
    pods: list[Obj]  # of the claim's namespace
    replicaset_owner: Mapping[str, tuple[str, str, int]]  # see rules.workload
    device_class: str
    free: Mapping[str, int]  # TopoLVM nodes' free bytes in the device class
    schedulable: frozenset[str]
    lv: Obj | None  # the claim's LogicalVolume
    rates: list[int] = field(default_factory=list)  # status.copy.bytesPerSecond seen
    # (status.downtimeSeconds, status.deltaBytes) of this cluster's finished moves
    downtimes: list[tuple[float, int]] = field(default_factory=list)
    existing: VolumeMoveObject | None = None  # the VolumeMove named after the claim
    # the other claims of the pods that use this one, whose volumes are node-local (TopoLVM)
    local_claims: Mapping[str, str] = field(default_factory=dict)
    # nodes the claim's pods may not run on (taints, selectors: topolvm.move.fits), and why
    unfit: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """A move the pre-flight let through: from where to where, what travels, how long the
    pod is down."""

    namespace: str
    claim: str
    pod: str
    owner: str  # Kind/name
    pod_labels: Mapping[str, str]
    source: str
    target: str
    requested: bool  # the target was asked for (--to); else it has the most free bytes
    target_free: int
    size: int
    device_class: str
    estimate: Estimate  # of this claim's copies
    pod_estimate: Estimate  # of the move of the pod's claims together: its downtime
    replaces: str = ""  # phase of a finished VolumeMove of the claim that is replaced
    together: tuple[str, ...] = ()  # the pod's other node-local claims, which move with it
    keep_source_seconds: int = 0  # --keep-source: the old volume kept after verification

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.claim}"

    @property
    def target_node(self) -> str:
        """The VolumeMove's ``spec.targetNode``: claims that move together name theirs (one
        target for all); else only a requested one (the controller picks by capacity)."""
        return self.target if self.requested or self.together else ""


def copy_rates(lvs: Iterable[Obj]) -> list[int]:
    """``status.copy.bytesPerSecond`` of this cluster's copies (the estimate's measured rates)."""
    rates = []
    for lv in lvs:
        rate = (((lv.get("status") or {}).get("copy") or {}).get("bytesPerSecond")) or 0
        if isinstance(rate, int) and not isinstance(rate, bool) and rate > 0:
            rates.append(rate)
    return rates


def past_downtimes(moves: Iterable[VolumeMoveObject]) -> list[tuple[float, int]]:
    """``(downtime seconds, bytes of the final copies)`` of each pod stop of the moves that ran
    through their downtime (Succeeded or Unverified, a downtime recorded): what the estimate's
    share of the pod's stop and start is measured from. The claims of a pod moved together
    (one stop: its pod, its stop time) count once, with their final copies summed."""
    done = (MovePhase.SUCCEEDED, MovePhase.UNVERIFIED)
    stops: dict[tuple[str, str, str], tuple[float, int]] = {}
    for m in moves:
        st = m.status
        if st.phase not in done or st.downtime_seconds <= 0:
            continue
        key = (m.namespace, st.pod_uid or st.pod or m.name, st.stop_time or m.name)
        down, sent = stops.get(key, (0.0, 0))
        stops[key] = (max(down, float(st.downtime_seconds)), sent + max(st.delta_bytes, 0))
    return list(stops.values())


def find_lv(lvs: Iterable[Obj], pv: Obj | None) -> Obj | None:
    """The LogicalVolume of ``pv``: its ``status.volumeID`` is the PV's CSI volume handle."""
    handle = (((pv or {}).get("spec") or {}).get("csi") or {}).get("volumeHandle")
    if not handle:
        return None
    for lv in lvs:
        if (lv.get("status") or {}).get("volumeID") == handle:
            return lv
    return None


def volume_size(lv: Obj | None, pv: Obj | None) -> int:
    """Bytes of the volume: its LogicalVolume's current size (else its size), as the
    controller reads it; else the PersistentVolume's capacity; 0 when none says."""
    if lv is not None:
        try:
            view = LogicalVolumeObject.from_dict(lv)
            return view.current_size or view.size
        except (InvalidQuantity, KeyError, TypeError, ValueError):
            pass
    storage = (((pv or {}).get("spec") or {}).get("capacity") or {}).get("storage")
    try:
        return parse_quantity(storage) if storage is not None else 0
    except InvalidQuantity:
        return 0


def check_existing(claim: str, existing: VolumeMoveObject | None) -> str:
    """Refuses while a move of ``claim`` goes on; returns the phase of a finished one (which
    a new move replaces: VolumeMoves are named after their claim), or ""."""
    if existing is None:
        return ""
    if existing.deleting:
        raise Refused(
            "MoveInProgress", f"the VolumeMove of claim {claim} is being deleted: try again "
            "once it is gone"
        )  # fmt: skip
    if not existing.done:
        detail = f" ({existing.status.message})" if existing.status.message else ""
        raise Refused(
            "MoveInProgress",
            f"a move of claim {claim} is in progress: phase {existing.status.phase}{detail}",
        )
    return existing.status.phase


def check_volume(lv: Obj | None, pv: Obj) -> None:
    """The claim's LogicalVolume exists and is ready (the controller copies from it)."""
    if lv is None:
        handle = ((pv.get("spec") or {}).get("csi") or {}).get("volumeHandle") or ""
        raise Refused("NoLogicalVolume", f"no LogicalVolume has volume id {handle}")
    try:
        view = LogicalVolumeObject.from_dict(lv)
    except (InvalidQuantity, KeyError, TypeError, ValueError) as e:
        raise Refused("SourceNotReady", f"LogicalVolume is malformed: {e}") from None
    if not view.ready or view.deleting:
        raise Refused("SourceNotReady", f"LogicalVolume {view.name} is not ready")


def preflight(facts: Facts, names: Names, requested: str = "") -> Plan:
    """The move of ``facts.claim`` to ``requested`` (or the node with the most free bytes);
    raises :class:`Refused` as topolvm-controller would. A claim whose pod has other
    node-local claims: see :func:`preflight_together`."""
    return preflight_together([facts], names, requested)[0]


def preflight_together(group: Sequence[Facts], names: Names, requested: str = "") -> list[Plan]:
    """The moves of the claims of ``group`` (the first: the claim asked for; the others: the
    other node-local claims of its pod) to one target node, which has room for all of them."""
    first = group[0]
    checked = [_check(facts, names, tuple(f.claim for f in group)) for facts in group]
    source, work, _ = checked[0]
    for facts, (other_source, other_work, _) in zip(group[1:], checked[1:], strict=True):
        if other_work.pod != work.pod or other_source != source:
            raise Refused(
                "NotTogether", f"claim {facts.claim} (pod {other_work.pod}, node "
                f"{other_source}) does not move with {first.claim} (pod {work.pod}, node "
                f"{source})"
            )  # fmt: skip
    sizes = [volume_size(f.lv, f.pv) for f in group]
    needs: dict[str, int] = {}
    free: dict[str, Mapping[str, int]] = {}
    for facts, size in zip(group, sizes, strict=True):
        needs[facts.device_class] = needs.get(facts.device_class, 0) + size
        free[facts.device_class] = facts.free
    target = rules.group_target(source, needs, free, first.schedulable, requested, first.unfit)
    labels = {}
    for pod in first.pods:
        if (pod.get("metadata") or {}).get("name") == work.pod:
            labels = dict((pod.get("metadata") or {}).get("labels") or {})
    plans = []
    # the pod stops once for all
    pod_estimate = rules.estimate(sum(sizes), first.rates, first.downtimes)
    for facts, size, (_, _, replaces) in zip(group, sizes, checked, strict=True):
        plans.append(Plan(
            namespace=facts.namespace, claim=facts.claim, pod=work.pod,
            owner=f"{work.owner_kind}/{work.owner}", pod_labels=labels, source=source,
            target=target, requested=bool(requested),
            target_free=facts.free.get(target, 0), size=size, device_class=facts.device_class,
            estimate=rules.estimate(size, facts.rates, facts.downtimes),
            pod_estimate=pod_estimate,
            replaces=replaces,
            together=tuple(f.claim for f in group if f.claim != facts.claim),
        ))  # fmt: skip
    return plans


def _check(facts: Facts, names: Names, group: tuple[str, ...]) -> tuple[str, rules.Workload, str]:
    """The checks of one claim of a group: its source node, its pod, and the phase of the
    finished VolumeMove of the claim that a new one replaces ("" if none)."""
    claim = facts.claim
    rules.check_claim(claim, facts.pvc, facts.pv, names.plugin)
    assert facts.pv is not None  # check_claim refuses a claim without one
    replaces = check_existing(claim, facts.existing)
    source = rules.source_node(facts.pv, names.topology_key)
    if not source:
        pv_name = (facts.pv.get("metadata") or {}).get("name")
        raise Refused(
            "NoSourceNode", f"claim {claim}'s volume {pv_name} has no {names.topology_key} "
            "node affinity: its node is unknown"
        )  # fmt: skip
    work = rules.workload(claim, facts.pods, facts.replicaset_owner)
    rules.together(work.pod, claim, facts.local_claims, [c for c in group if c != claim])
    check_volume(facts.lv, facts.pv)
    return source, work, replaces

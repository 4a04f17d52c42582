"""Whether a claim can be moved, and where to (pure; docs/mobility.md, "Move").

The CLI checks these before it creates a VolumeMove, and topolvm-controller again before it
starts one (a VolumeMove may come from ``kubectl apply``): a refused move changes nothing and
says why. Objects are the API's JSON.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topolvm.units import apart, human

Obj = dict[str, Any]
SHARED_MODES = frozenset({"ReadWriteMany", "ReadOnlyMany"})
MOVABLE_OWNERS = ("StatefulSet", "Deployment")


class Refused(Exception):
    """The move cannot start: ``reason`` is a CamelCase word, the message says what to do."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Workload:
    pod: str
    node: str
    owner_kind: str  # StatefulSet or Deployment
    owner: str


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def check_claim(name: str, pvc: Obj | None, pv: Obj | None, driver: str) -> None:
    """The claim exists, is bound to a TopoLVM volume, and is not shared between nodes."""
    if pvc is None:
        raise Refused("ClaimNotFound", f"claim {name} does not exist")
    if _meta(pvc).get("deletionTimestamp"):
        raise Refused("ClaimDeleting", f"claim {name} is being deleted")
    if (pvc.get("status") or {}).get("phase") != "Bound" or pv is None:
        raise Refused("ClaimNotBound", f"claim {name} is not bound to a volume: nothing to move")
    got = ((pv.get("spec") or {}).get("csi") or {}).get("driver", "")
    if got != driver:
        raise Refused(
            "NotTopoLVM", f"claim {name}'s volume is provisioned by {got or 'no CSI driver'}, "
            f"not {driver}"
        )  # fmt: skip
    modes = set((pvc.get("spec") or {}).get("accessModes") or [])
    if modes & SHARED_MODES:
        raise Refused(
            "SharedAccess", f"claim {name} is {'/'.join(sorted(modes & SHARED_MODES))}: a "
            "volume that several nodes may use at once cannot be moved"
        )  # fmt: skip


def source_node(pv: Obj, topology_key: str) -> str:
    """The node a TopoLVM volume is on (its PV's node affinity)."""
    terms = (((pv.get("spec") or {}).get("nodeAffinity") or {}).get("required") or {}).get(
        "nodeSelectorTerms"
    ) or []
    for term in terms:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == topology_key and expr.get("values"):
                return str(expr["values"][0])
    return ""


def uses_claim(pod: Obj, claim: str) -> bool:
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if ((volume or {}).get("persistentVolumeClaim") or {}).get("claimName") == claim:
            return True
    return False


def claims_of(pod: Obj) -> list[str]:
    """The claims a pod mounts (``persistentVolumeClaim`` volumes), in its order."""
    out = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = ((volume or {}).get("persistentVolumeClaim") or {}).get("claimName")
        if name:
            out.append(str(name))
    return out


def together(pod_name: str, claim: str, others: Mapping[str, str], listed: Collection[str]) -> None:
    """The pod's other node-local claims (``others``: claim → its volume's CSI driver, for
    the pod's claims besides ``claim`` that are this driver's) are exactly the claims
    ``listed`` to move with ``claim``: a pod cannot run where only some of its node-local
    claims are."""
    local = sorted(c for c, driver in others.items() if c != claim and driver)
    missing = [c for c in local if c not in listed]
    if missing:
        raise Refused(
            "OtherLocalClaims", f"pod {pod_name} also uses {', '.join(missing)}, node-local "
            f"too: they must move with {claim}, or the pod could not start on the target "
            "(topolvm move moves a pod's claims together; a VolumeMove lists them in "
            "spec.together)"
        )  # fmt: skip
    extra = sorted(set(listed) - set(local) - {claim})
    if extra:
        raise Refused(
            "NotTogether", f"{', '.join(extra)} listed to move with {claim} "
            f"{'is' if len(extra) == 1 else 'are'} not a node-local claim of pod {pod_name}"
        )  # fmt: skip


def _controller(pod: Obj) -> tuple[str, str]:
    for ref in _meta(pod).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind") or ""), str(ref.get("name") or "")
    return "", ""


def workload(
    claim: str, pods: Iterable[Obj], replicaset_owner: Mapping[str, tuple[str, str, int]]
) -> Workload:
    """The one running pod that uses ``claim``, with a controller that re-creates it.
    ``replicaset_owner``: ReplicaSet name → (owner kind, owner name, owner's replicas)."""
    users = [
        p for p in pods
        if uses_claim(p, claim) and (p.get("status") or {}).get("phase") not in
        ("Succeeded", "Failed")
    ]  # fmt: skip
    if not users:
        raise Refused(
            "NoRunningPod", f"no running pod uses claim {claim}: start its workload first "
            "(a move stops and restarts the pod that uses the claim)"
        )  # fmt: skip
    if len(users) > 1:
        names = ", ".join(sorted(str(_meta(p).get("name")) for p in users))
        raise Refused("SharedClaim", f"claim {claim} is used by several pods ({names})")
    pod = users[0]
    name = str(_meta(pod).get("name"))
    if _meta(pod).get("deletionTimestamp") or (pod.get("status") or {}).get("phase") != "Running":
        phase = (pod.get("status") or {}).get("phase") or "unknown"
        raise Refused(
            "PodNotRunning", f"pod {name}, which uses claim {claim}, is not running (phase "
            f"{phase}): a move starts from a running workload"
        )  # fmt: skip
    kind, owner = _controller(pod)
    if kind == "ReplicaSet":
        kind, owner, replicas = replicaset_owner.get(owner, ("ReplicaSet", owner, 0))
        if kind == "Deployment" and replicas != 1:
            raise Refused(
                "ManyReplicas", f"pod {name} belongs to Deployment {owner} with {replicas} "
                "replicas sharing a ReadWriteOnce claim: scale it to 1 first"
            )  # fmt: skip
    if kind not in MOVABLE_OWNERS:
        what = f"is owned by {kind} {owner}" if kind else "has no controller (a bare pod)"
        raise Refused(
            "NoController", f"pod {name} {what}: nothing would start it again on the target "
            "node. Moves work for pods of a StatefulSet or of a one-replica Deployment"
        )  # fmt: skip
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    return Workload(name, node, kind, owner)


def target_node(
    source: str, size: int, free: Mapping[str, int], schedulable: Iterable[str],
    requested: str = "", device_class: str = "", unfit: Mapping[str, str] | None = None,
) -> str:  # fmt: skip
    """``requested`` if it can take the volume; else the schedulable node (not the source)
    with the most free bytes in the device class. ``free``: TopoLVM nodes' free bytes;
    ``unfit``: nodes the pod may not run on, and why (:mod:`.fits`)."""
    dc = device_class or "the default device class"
    unfit = unfit or {}
    ok = set(schedulable) - set(unfit)
    if requested:
        if requested == source:
            raise Refused("SameNode", f"the claim is on node {requested} already")
        if requested not in free:
            raise Refused("UnknownNode", f"node {requested} runs no TopoLVM node for {dc}")
        if requested in unfit:
            raise Refused("PodNotAllowed", f"the pod cannot run on node {requested}: "
                                           f"{unfit[requested]}")  # fmt: skip
        if requested not in ok:
            raise Refused("Unschedulable", f"node {requested} is cordoned or not ready")
        if free[requested] < size:
            has, needs = apart(free[requested], size)
            raise Refused(
                "NoRoom", f"node {requested} has {has} free in {dc}; the volume needs {needs}"
            )  # fmt: skip
        return requested
    fits = [(n, b) for n, b in free.items() if n != source and n in ok and b >= size]
    if not fits:
        others = [b for n, b in free.items() if n != source and n in ok]
        if not others:
            raise Refused(
                "NoRoom", f"no other schedulable node (uncordoned, Ready, one the pod may run "
                f"on) runs TopoLVM for {dc}"
            )  # fmt: skip
        most, needs = apart(max(others), size)
        raise Refused(
            "NoRoom", f"no other schedulable node has {needs} free in {dc} (the most is {most})"
        )  # fmt: skip
    return min(fits, key=lambda nb: (-nb[1], nb[0]))[0]


def group_target(
    source: str, needs: Mapping[str, int], free: Mapping[str, Mapping[str, int]],
    schedulable: Iterable[str], requested: str = "", unfit: Mapping[str, str] | None = None,
) -> str:  # fmt: skip
    """The target of claims that move together: ``needs`` is device class → bytes they take
    there, ``free`` device class → node → free bytes. ``requested`` if it has room in every
    class; else the schedulable node (not the source) with room in all of them and the most
    free bytes. One claim: the same as :func:`target_node`."""
    ok = frozenset(schedulable) - set(unfit or {})
    fits: set[str] | None = None
    for dc, size in sorted(needs.items()):
        chosen = target_node(source, size, free.get(dc, {}), ok, requested, dc, unfit)
        room = {chosen} if requested else {
            n for n, b in free.get(dc, {}).items() if n != source and n in ok and b >= size
        }  # fmt: skip
        fits = room if fits is None else fits & room
    if not fits:
        wanted = ", ".join(f"{human(b)} in {dc or 'the default device class'}"
                           for dc, b in sorted(needs.items()))  # fmt: skip
        raise Refused(
            "NoRoom", f"no other schedulable node has room for all the claims that move "
            f"together ({wanted})"
        )  # fmt: skip
    total = {n: sum(free.get(dc, {}).get(n, 0) for dc in needs) for n in fits}
    return min(fits, key=lambda n: (-total[n], n))


@dataclass(frozen=True)
class Estimate:
    precopy_bytes: int
    delta_bytes: int
    rate: int  # bytes per second the estimate assumes
    measured: bool  # the rate comes from copies this cluster made
    downtime_seconds: float
    restart_seconds: float = 0.0  # the pod's stop, the swap and its start, besides the copy
    restarts_measured: int = 0  # finished moves of this cluster that share comes from (0: assumed)


RESTART_SECONDS = 10.0  # stop, swap and start of the pod, besides the final copy, when unknown
LEAST_RESTART = 1.0  # a measured share is never taken below this
ASSUMED_RATE = 100 << 20
CHANGED_SHARE = 0.1  # of the volume's data written during the pre-copy, for the estimate


def estimate(
    used_bytes: int, rates: Sequence[int], downtimes: Sequence[tuple[float, int]] = ()
) -> Estimate:
    """Bytes the move sends and the downtime to expect: the median of measured copy rates
    (``status.copy.bytesPerSecond`` of this cluster's copies), or an assumed one; and the pod's
    stop and start, the median of what this cluster's finished moves took besides their final
    copy (``downtimes``: their ``(status.downtimeSeconds, status.deltaBytes)``; the copy's share
    at the same rate), or an assumed one."""
    measured = sorted(r for r in rates if r > 0)
    rate = measured[len(measured) // 2] if measured else ASSUMED_RATE
    delta = int(used_bytes * CHANGED_SHARE)
    shares = sorted(max(LEAST_RESTART, down - sent / rate)
                    for down, sent in downtimes if down > 0 and sent >= 0)  # fmt: skip
    restart = shares[len(shares) // 2] if shares else RESTART_SECONDS
    return Estimate(used_bytes, delta, rate, bool(measured), restart + delta / rate,
                    restart, len(shares))  # fmt: skip

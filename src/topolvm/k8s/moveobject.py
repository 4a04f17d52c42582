"""The VolumeMove custom resource as a typed view over its JSON (docs/mobility.md, "Move").

A VolumeMove (namespaced, in its claim's namespace) asks topolvm-controller to move one
PersistentVolumeClaim with its data to another node; a pod's node-local claims move together,
a VolumeMove each, listing the others in ``spec.together``. ``spec`` is what was asked;
``status`` is the controller's record of the move's state machine, written after every step so
that a restarted controller goes on from there:

    Pending → PreCopy → Stopping → FinalCopy → Swapping → Starting → Succeeded
                 └──────────┴──────────┴──→ RollingBack → RolledBack

Up to ``Swapping`` the claim, its PersistentVolume and its LogicalVolume are untouched: a move
that cannot go on rolls back to them. ``Refused`` is a move that never started (its reason says
why). The CLI (``topolvm move``), ``kubectl get volumemoves`` and ``topolvm doctor`` read the
same fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from topolvm.k8s.lvobject import int_or_zero

KIND = "VolumeMove"
GROUP = "topolvm.io"  # this project's own: no legacy group, whatever USE_LEGACY says
PLURAL = "volumemoves"


class MovePhase:
    PENDING = "Pending"
    PRE_COPY = "PreCopy"  # the target fills from a first cut while the pod runs
    STOPPING = "Stopping"  # the pod stops; its re-created pod is held (a scheduling gate)
    FINAL_COPY = "FinalCopy"  # only what changed since the first cut travels
    SWAPPING = "Swapping"  # old PV kept (Retain), the claim re-created bound to the new PV
    STARTING = "Starting"  # the pod is let go onto the target; the old LV goes once it runs
    SUCCEEDED = "Succeeded"
    ROLLING_BACK = "RollingBack"
    ROLLED_BACK = "RolledBack"
    REFUSED = "Refused"

    ORDER = (PENDING, PRE_COPY, STOPPING, FINAL_COPY, SWAPPING, STARTING, SUCCEEDED)
    DONE = frozenset({SUCCEEDED, ROLLED_BACK, REFUSED})
    # while the claim's pod is down (the downtime)
    DOWN = frozenset({STOPPING, FINAL_COPY, SWAPPING, STARTING})


@dataclass(frozen=True)
class MoveStatus:
    phase: str = MovePhase.PENDING
    message: str = ""
    reason: str = ""  # why it was refused or rolled back (a short CamelCase word)
    source_node: str = ""
    target_node: str = ""
    source_volume: str = ""  # the claim's LogicalVolume (and CSI volume) before the move
    target_volume: str = ""  # the new one, on the target node
    old_pv: str = ""
    new_pv: str = ""
    pod: str = ""  # the pod that uses the claim
    pod_uid: str = ""  # that pod before the move (a StatefulSet's comes back with its name)
    owner: str = ""  # its controller, as Kind/name
    claim_uid: str = ""  # the claim before the move (it is re-created under its name)
    claim_template: str = ""  # JSON: the claim's labels, annotations and spec, to re-create it
    reclaim_policy: str = ""  # the old PV's, given to the new one (the old is Retain meanwhile)
    device_class: str = ""
    size_bytes: int = 0
    precopy_bytes: int = 0  # data bytes the pre-copy moved
    delta_bytes: int = 0  # data bytes the final copy moved
    done_bytes: int = 0  # progress of the copy in hand through the volume
    total_bytes: int = 0
    progress: str = ""  # for kubectl get: "PreCopy 42%"
    start_time: str = ""
    stop_time: str = ""  # the pod was stopped: the downtime starts
    swap_time: str = ""
    downtime_seconds: int = 0
    completion_time: str = ""
    together_seen: str = ""  # the claims moved with this one whose VolumeMoves it has seen

    _KEYS: ClassVar[dict[str, str]] = {
        "phase": "phase", "message": "message", "reason": "reason",
        "source_node": "sourceNode", "target_node": "targetNode",
        "source_volume": "sourceVolume", "target_volume": "targetVolume",
        "old_pv": "oldVolumeName", "new_pv": "newVolumeName", "pod": "pod", "owner": "owner",
        "pod_uid": "podUID", "claim_uid": "claimUID", "claim_template": "claimTemplate",
        "reclaim_policy": "reclaimPolicy",
        "device_class": "deviceClass", "size_bytes": "sizeBytes",
        "precopy_bytes": "preCopyBytes", "delta_bytes": "deltaBytes",
        "done_bytes": "doneBytes", "total_bytes": "totalBytes", "progress": "progress",
        "start_time": "startTime", "stop_time": "stopTime", "swap_time": "swapTime",
        "downtime_seconds": "downtimeSeconds", "completion_time": "completionTime",
        "together_seen": "togetherSeen",
    }  # fmt: skip

    @classmethod
    def from_dict(cls, raw: Any) -> MoveStatus:
        if not isinstance(raw, dict):
            return cls()
        values: dict[str, Any] = {}
        for f in fields(cls):
            key = cls._KEYS[f.name]
            value = raw.get(key)
            values[f.name] = int_or_zero(value) if f.type == "int" else str(value or "")
        values["phase"] = values["phase"] or MovePhase.PENDING
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value or f.name == "phase":
                out[self._KEYS[f.name]] = value
        return out


@dataclass
class VolumeMoveObject:
    name: str
    namespace: str
    uid: str
    claim: str
    target_node: str = ""  # spec.targetNode: empty, the controller picks by capacity
    # spec.together: the pod's other node-local claims, moved with this one (their
    # VolumeMoves list this claim, and name the same target node)
    together: tuple[str, ...] = ()
    status: MoveStatus = field(default_factory=MoveStatus)
    created: str = ""
    deleting: bool = False

    @property
    def done(self) -> bool:
        return self.status.phase in MovePhase.DONE

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> VolumeMoveObject:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        return cls(
            name=str(meta["name"]),
            namespace=str(meta.get("namespace") or ""),
            uid=str(meta.get("uid") or ""),
            claim=str(spec.get("claim") or ""),
            target_node=str(spec.get("targetNode") or ""),
            together=tuple(sorted({str(c) for c in spec.get("together") or [] if c})),
            status=MoveStatus.from_dict(obj.get("status")),
            created=str(meta.get("creationTimestamp") or ""),
            deleting=bool(meta.get("deletionTimestamp")),
        )


def manifest(
    group: str, namespace: str, claim: str, target_node: str = "", together: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A new VolumeMove for ``claim`` (named after it: one move per claim at a time), moved
    with the claims ``together`` (each gets its own VolumeMove listing the others)."""
    spec: dict[str, Any] = {"claim": claim}
    if target_node:
        spec["targetNode"] = target_node
    if together:
        spec["together"] = sorted(together)
    return {
        "apiVersion": f"{group}/v1",
        "kind": KIND,
        "metadata": {"name": claim, "namespace": namespace},
        "spec": spec,
    }

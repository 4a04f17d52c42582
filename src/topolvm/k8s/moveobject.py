"""The VolumeMove custom resource as a typed view over its JSON (docs/mobility.md, "Move").

A VolumeMove (namespaced, in its claim's namespace) asks topolvm-controller to move one
PersistentVolumeClaim with its data to another node; a pod's node-local claims move together,
a VolumeMove each, listing the others in ``spec.together``. ``spec`` is what was asked;
``status`` is the controller's record of the move's state machine, written after every step so
that a restarted controller goes on from there:

    Pending → PreCopy → Stopping → FinalCopy → Swapping → Starting → Verifying → Succeeded
                 └──────────┴──────────┴───────────┴──→ RollingBack      └──→ Unverified
                                                            → RolledBack

Up to ``Swapping`` the claim, its PersistentVolume and its LogicalVolume are untouched: a move
that cannot go on rolls back to them. ``Refused`` is a move that never started (its reason says
why). In ``Verifying`` the pod runs on the target while both nodes digest their volume as of
the swap; the old volume goes only once the digests match (``Succeeded``, condition
``Verified`` True; kept ``spec.keepSourceSeconds`` longer if asked); ``Unverified`` (condition
``Verified`` False) keeps it for good. The CLI (``topolvm move``), ``kubectl get volumemoves``
and ``topolvm doctor`` read the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
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
    STARTING = "Starting"  # the pod is let go onto the target once its volume is cut
    VERIFYING = "Verifying"  # the pod runs; both volumes' digests as of the swap are compared
    SUCCEEDED = "Succeeded"  # verified; the old volume removed (or kept until keepSourceUntil)
    UNVERIFIED = "Unverified"  # the digests differ or could not be made: the old volume stays
    ROLLING_BACK = "RollingBack"
    ROLLED_BACK = "RolledBack"
    REFUSED = "Refused"

    ORDER = (PENDING, PRE_COPY, STOPPING, FINAL_COPY, SWAPPING, STARTING, VERIFYING, SUCCEEDED)
    DONE = frozenset({SUCCEEDED, UNVERIFIED, ROLLED_BACK, REFUSED})
    # while the claim's pod is down (the downtime)
    DOWN = frozenset({STOPPING, FINAL_COPY, SWAPPING, STARTING})
    # the claim was swapped (its old claim deleted): the move only goes forward
    SWAPPED = frozenset({STARTING, VERIFYING, SUCCEEDED, UNVERIFIED})
    # the phases a pass may write over each phase it read (besides the same one): once the
    # swap deletes the old claim only forward (:func:`may_write`); a done move never again,
    # but a Succeeded one records the removal of the old volume it kept (``oldVolume``)
    NEXT: ClassVar[dict[str, frozenset[str]]] = {
        PENDING: frozenset({PRE_COPY, REFUSED, ROLLING_BACK}),
        PRE_COPY: frozenset({STOPPING, ROLLING_BACK}),
        STOPPING: frozenset({FINAL_COPY, ROLLING_BACK}),
        FINAL_COPY: frozenset({SWAPPING, ROLLING_BACK}),
        SWAPPING: frozenset({STARTING, ROLLING_BACK}),  # before the group's commit
        STARTING: frozenset({VERIFYING}),
        VERIFYING: frozenset({SUCCEEDED, UNVERIFIED}),
        ROLLING_BACK: frozenset({ROLLED_BACK}),
    }

    @classmethod
    def follows(cls, read: str, written: str) -> bool:
        """Whether a pass that read phase ``read`` may write ``written``."""
        if read == cls.SUCCEEDED:
            return written == read  # only :data:`AFTER_DONE` fields change
        if read in cls.DONE:
            return False
        return written == read or written in cls.NEXT.get(read, frozenset())

    @classmethod
    def rank(cls, phase: str) -> int:
        """How far a phase is along :data:`ORDER` (Unverified as far as Succeeded; a failed
        phase -1)."""
        if phase == cls.UNVERIFIED:
            return cls.ORDER.index(cls.SUCCEEDED)
        return cls.ORDER.index(phase) if phase in cls.ORDER else -1


class OldVolume:
    """``status.oldVolume``: the claim's PV and LV before the move, once the claim is swapped."""

    KEPT = "Kept"  # still there: until keepSourceUntil, or for good (Unverified)
    REMOVED = "Removed"
    LEFT = "Left"  # someone changed the old PV (bound a claim to it, say): left to them


class Verified:
    """The ``Verified`` condition's reasons (``status.conditions``)."""

    TYPE = "Verified"
    MATCH = "DigestMatch"  # True: both volumes' digests as of the swap are equal
    MISMATCH = "DigestMismatch"  # False: they differ
    FAILED = "VerifyFailed"  # False: a digest could not be made (the message says why)


# what a pass may change on a Succeeded move: the old volume it kept, removed or left
AFTER_DONE = frozenset({"message", "old_volume"})


def may_write(read: MoveStatus, written: MoveStatus, *, aborted: bool = False) -> bool:
    """Whether a pass that read ``read`` may write ``written`` over it (compare-and-swap makes
    sure nothing came between): the phase follows; ``commitTime`` is written only in
    Swapping and never removed; a member of a group commit (``commitTime``) never rolls back,
    but when the commit is ``aborted`` (a member of the group rolled back without it, so the
    commit can never be whole and no claim of the group was deleted); on a Succeeded move only
    the old volume's state changes (:data:`AFTER_DONE`)."""
    if read.commit_time and written.commit_time != read.commit_time:
        return False
    if written.commit_time and not read.commit_time and not (
        read.phase == written.phase == MovePhase.SWAPPING
    ):  # fmt: skip
        return False
    rolls_back = written.phase == MovePhase.ROLLING_BACK != read.phase
    if read.commit_time and rolls_back and not aborted:
        return False
    if read.phase == MovePhase.SUCCEEDED:
        changed = {f.name for f in fields(read)
                   if getattr(read, f.name) != getattr(written, f.name)}  # fmt: skip
        if not changed <= AFTER_DONE or read.old_volume not in ("", OldVolume.KEPT):
            return False
    return MovePhase.follows(read.phase, written.phase)


@dataclass(frozen=True)
class Condition:
    """One of ``status.conditions`` (the Kubernetes convention)."""

    type: str
    status: str  # "True" or "False"
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""

    @classmethod
    def from_dict(cls, raw: Any) -> Condition | None:
        if not isinstance(raw, dict) or not raw.get("type"):
            return None
        return cls(str(raw["type"]), str(raw.get("status") or "Unknown"),
                   str(raw.get("reason") or ""), str(raw.get("message") or ""),
                   str(raw.get("lastTransitionTime") or ""))  # fmt: skip

    def to_dict(self) -> dict[str, str]:
        out = {"type": self.type, "status": self.status}
        for key, value in (("reason", self.reason), ("message", self.message),
                           ("lastTransitionTime", self.last_transition_time)):  # fmt: skip
            if value:
                out[key] = value
        return out


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
    # the swap recorded, before it deleted the old claim, that it would: from then on the
    # move only goes forward (a Swapping move without it may still roll back)
    commit_time: str = ""
    downtime_seconds: int = 0
    completion_time: str = ""
    together_seen: str = ""  # the claims moved with this one whose VolumeMoves it has seen
    # the verification (docs/mobility.md, "Verified before the source goes")
    verify_bytes: int = 0  # the bytes both digests cover (the source's size, as copied)
    source_digest: str = ""
    target_digest: str = ""
    verify_time: str = ""  # when both digests were compared
    keep_source_until: str = ""  # a verified move keeps the old volume until then
    old_volume: str = ""  # OldVolume: Kept, Removed, Left (once the claim is swapped)
    conditions: tuple[Condition, ...] = ()

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
        "commit_time": "commitTime",
        "downtime_seconds": "downtimeSeconds", "completion_time": "completionTime",
        "together_seen": "togetherSeen", "verify_bytes": "verifyBytes",
        "source_digest": "sourceDigest", "target_digest": "targetDigest",
        "verify_time": "verifyTime", "keep_source_until": "keepSourceUntil",
        "old_volume": "oldVolume", "conditions": "conditions",
    }  # fmt: skip

    @classmethod
    def from_dict(cls, raw: Any) -> MoveStatus:
        if not isinstance(raw, dict):
            return cls()
        values: dict[str, Any] = {}
        for f in fields(cls):
            key = cls._KEYS[f.name]
            value = raw.get(key)
            if f.name == "conditions":
                found = (Condition.from_dict(c) for c in value or [] if isinstance(value, list))
                values[f.name] = tuple(c for c in found if c is not None)
                continue
            values[f.name] = int_or_zero(value) if f.type == "int" else str(value or "")
        values["phase"] = values["phase"] or MovePhase.PENDING
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "conditions":
                value = [c.to_dict() for c in value]
            if value or f.name == "phase":
                out[self._KEYS[f.name]] = value
        return out

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def with_condition(self, cond: Condition) -> MoveStatus:
        """This status with ``cond`` set (its transition time kept if its status is too)."""
        old = self.condition(cond.type)
        if old is not None and old.status == cond.status and old.last_transition_time:
            cond = replace(cond, last_transition_time=old.last_transition_time)
        rest = tuple(c for c in self.conditions if c.type != cond.type)
        return replace(self, conditions=(*rest, cond))

    @property
    def verified(self) -> bool:
        """The ``Verified`` condition is True: both digests matched."""
        cond = self.condition(Verified.TYPE)
        return cond is not None and cond.status == "True"


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
    # spec.keepSourceSeconds: how long the old volume stays after the move verified (0: it
    # goes at once; an old VolumeMove without the field too)
    keep_source_seconds: int = 0
    status: MoveStatus = field(default_factory=MoveStatus)
    created: str = ""
    deleting: bool = False
    resource_version: str = ""  # as read: a status write is a compare-and-swap against it
    finalizers: tuple[str, ...] = ()

    @property
    def done(self) -> bool:
        return self.status.phase in MovePhase.DONE

    @property
    def made_name(self) -> str:
        """The name of what the move makes, the target LogicalVolume and the new PV: from the
        VolumeMove's own UID, never from its status (whoever may write the status must not
        be able to point the move's deletes at another object)."""
        return made_name(self.uid)

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
            keep_source_seconds=max(int_or_zero(spec.get("keepSourceSeconds")), 0),
            status=MoveStatus.from_dict(obj.get("status")),
            created=str(meta.get("creationTimestamp") or ""),
            deleting=bool(meta.get("deletionTimestamp")),
            resource_version=str(meta.get("resourceVersion") or ""),
            finalizers=tuple(str(f) for f in meta.get("finalizers") or []),
        )


def made_name(uid: str) -> str:
    """``move-<uid>``: the target LogicalVolume and new PV of the VolumeMove of that UID."""
    return f"move-{uid}"


def manifest(
    group: str, namespace: str, claim: str, target_node: str = "", together: tuple[str, ...] = (),
    keep_source_seconds: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """A new VolumeMove for ``claim`` (named after it: one move per claim at a time), moved
    with the claims ``together`` (each gets its own VolumeMove listing the others), its old
    volume kept ``keep_source_seconds`` after the move verified."""
    spec: dict[str, Any] = {"claim": claim}
    if target_node:
        spec["targetNode"] = target_node
    if together:
        spec["together"] = sorted(together)
    if keep_source_seconds:
        spec["keepSourceSeconds"] = keep_source_seconds
    return {
        "apiVersion": f"{group}/v1",
        "kind": KIND,
        "metadata": {"name": claim, "namespace": namespace},
        "spec": spec,
    }

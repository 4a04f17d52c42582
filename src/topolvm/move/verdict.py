"""Whether a move's copy is verified (pure; docs/mobility.md, "Verified before the source goes").

After the final copy, with the pod still down, topolvm-controller asks the nodes of both the
target and the source LogicalVolume for a digest of their volume (``spec.verify``, id: the
VolumeMove's UID, sizeBytes: the bytes the copy went through); each node cuts its volume at
once, says so (``status.verify.phase`` Cut), then reads the cut in the background
(src/topolvm/node/verify.py). The pod may start on the target once the target is cut
(:func:`cut_made`); the old volume may go once both digests are made and equal (:func:`judge`).
"""

from __future__ import annotations

from dataclasses import dataclass

from topolvm.k8s.lvobject import LogicalVolumeObject, VerifyPhase, VerifyStatus
from topolvm.k8s.moveobject import Verified


class Outcome:
    PENDING = "Pending"  # a digest is not made yet
    MATCH = Verified.MATCH
    MISMATCH = Verified.MISMATCH
    FAILED = Verified.FAILED


@dataclass(frozen=True)
class Verdict:
    outcome: str
    message: str
    source_digest: str = ""
    target_digest: str = ""
    size: int = 0

    @property
    def ended(self) -> bool:
        return self.outcome != Outcome.PENDING


def verify_size(target: LogicalVolumeObject, fallback: int) -> int:
    """The bytes both digests cover: those the copy went through (the source's size; the
    target may be larger by extent rounding), else ``fallback`` (the move's sizeBytes)."""
    total = target.copy.total_bytes if target.copy is not None else 0
    return total or fallback


def asked(lv: LogicalVolumeObject, uid: str, size: int) -> bool:
    """``lv``'s ``spec.verify`` asks for the move ``uid``'s digest of ``size`` bytes."""
    return lv.verify_id == uid and lv.verify_size == size


def own(uid: str, lv: LogicalVolumeObject) -> VerifyStatus | None:
    """``lv``'s ``status.verify`` if it answers the move ``uid``."""
    st = lv.verify
    return st if st is not None and st.id == uid else None


def cut_made(uid: str, target: LogicalVolumeObject) -> bool:
    """The target's node has cut it for the move ``uid`` (or already ended its digest): from
    now on the volume may change, the pod may start on it."""
    st = own(uid, target)
    return st is not None and st.phase in (VerifyPhase.CUT, *VerifyPhase.ENDED)


def _where(role: str, lv: LogicalVolumeObject) -> str:
    return f"the {role} volume {lv.name} on node {lv.node_name}"


def judge(
    uid: str, source: LogicalVolumeObject | None, target: LogicalVolumeObject | None,
    missing: str = "",
) -> Verdict:  # fmt: skip
    """The verification of the move ``uid`` from both volumes' ``status.verify`` (``None``: the
    volume is gone; ``missing`` says why the source could not be found)."""
    if target is None:
        return Verdict(Outcome.FAILED, "the target LogicalVolume is gone: nothing to verify")
    if source is None:
        why = f": {missing}" if missing else ""
        return Verdict(Outcome.FAILED, f"the old volume cannot be found{why}; nothing to "
                       "compare the target with")  # fmt: skip
    sides = (("source", source, own(uid, source)), ("target", target, own(uid, target)))
    for role, lv, st in sides:
        if st is not None and st.phase == VerifyPhase.FAILED:
            return Verdict(Outcome.FAILED, f"{_where(role, lv)} could not be digested: "
                           f"{st.message or 'no reason given'}")  # fmt: skip
    waiting = [f"{role} on node {lv.node_name}: {_state(st)}" for role, lv, st in sides
               if st is None or st.phase != VerifyPhase.DONE]  # fmt: skip
    if waiting:
        return Verdict(Outcome.PENDING, "digests being made (" + "; ".join(waiting) + ")")
    s, t = sides[0][2], sides[1][2]
    assert s is not None and t is not None
    if s.digest and s.digest == t.digest and s.size_bytes == t.size_bytes:
        return Verdict(Outcome.MATCH, f"the target's digest of {s.size_bytes} bytes as of the "
                       f"swap equals the source's: {s.digest}", s.digest, t.digest,
                       s.size_bytes)  # fmt: skip
    return Verdict(
        Outcome.MISMATCH, f"the target's content as of the swap differs from the source's: "
        f"source {s.digest or '(none)'} ({s.size_bytes} bytes), target {t.digest or '(none)'} "
        f"({t.size_bytes} bytes)", s.digest, t.digest, max(s.size_bytes, t.size_bytes),
    )  # fmt: skip


def _state(st: VerifyStatus | None) -> str:
    if st is None:
        return "not cut yet"
    text = {VerifyPhase.PENDING: "not cut yet", VerifyPhase.CUT: "cut, being read"}
    said = f" ({st.message})" if st.message and st.phase == VerifyPhase.PENDING else ""
    return text.get(st.phase, st.phase) + said

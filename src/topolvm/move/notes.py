"""The Events a move posts when its status changes (pure): each phase it enters, its
verification's outcome, and what became of the old volume it kept (docs/mobility.md)."""

from __future__ import annotations

from dataclasses import dataclass

from topolvm.k8s.moveobject import MovePhase, MoveStatus, OldVolume, Verified
from topolvm.move.prepull import ImagesPulled

WARNING_PHASES = frozenset({MovePhase.ROLLING_BACK, MovePhase.ROLLED_BACK, MovePhase.REFUSED,
                            MovePhase.UNVERIFIED})  # fmt: skip
REASONS = {MovePhase.SUCCEEDED: "Moved", MovePhase.ROLLED_BACK: "MoveRolledBack",
           MovePhase.REFUSED: "MoveRefused", MovePhase.UNVERIFIED: "MoveUnverified"}  # fmt: skip


@dataclass(frozen=True)
class Note:
    reason: str
    message: str
    warning: bool = False


def notes(read: MoveStatus, written: MoveStatus) -> list[Note]:
    """The Events for a status written over the one read (on the VolumeMove and its claim)."""
    out = []
    was, now = read.condition(Verified.TYPE), written.condition(Verified.TYPE)
    if now is not None and now != was and now.status == "True":
        out.append(Note("MoveVerified", now.message))
    pulled = written.condition(ImagesPulled.TYPE)
    if pulled is not None and read.condition(ImagesPulled.TYPE) is None:
        ok = pulled.status == "True"
        out.append(Note("ImagesPulled" if ok else "ImagesNotPulled",
                        f"images {pulled.message}", not ok))  # fmt: skip
    if written.phase != read.phase:
        phase = written.phase
        out.append(Note(REASONS.get(phase, f"Move{phase}"), written.message,
                        phase in WARNING_PHASES))  # fmt: skip
    if written.old_volume != read.old_volume and read.old_volume == OldVolume.KEPT:
        if written.old_volume == OldVolume.REMOVED and written.phase == read.phase:
            out.append(Note("OldVolumeRemoved", f"the old volume, PV {written.old_pv} "
                            f"(LogicalVolume {written.source_volume}), is removed"))  # fmt: skip
        elif written.old_volume == OldVolume.LEFT:
            out.append(Note("OldVolumeLeft", written.message, True))
    return out

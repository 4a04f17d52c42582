"""The group commit of claims that move together (src/topolvm/controller/movegroup.py), as
rules over the members' statuses: when a member may roll back, when the commit is whole,
what the commit waits for, and which done member keeps its VolumeMove. The commit against
two writers: tests/test_controller_move_fencing.py."""

from __future__ import annotations

from dataclasses import replace

from topolvm.controller.movegroup import Group
from topolvm.k8s.moveobject import MovePhase, MoveStatus, VolumeMoveObject

P = MovePhase
T = "2026-11-28T10:00:00Z"


def vm(claim: str, phase: str, commit: str = "", completion_time: str = "") -> VolumeMoveObject:
    others = tuple(c for c in ("a", "b", "c") if c != claim)
    status = MoveStatus(phase=phase, commit_time=commit, completion_time=completion_time)
    return VolumeMoveObject(claim, "ns", f"uid-{claim}", claim, "n2", others, status=status,
                            created="2026-11-28T09:00:00Z")  # fmt: skip


def group(me: VolumeMoveObject, *others: VolumeMoveObject | None, seen: str = "") -> Group:
    me = replace(me, status=replace(me.status, together_seen=seen))
    names = [c for c in ("a", "b", "c") if c != me.claim]
    return Group(me, dict(zip(names, others, strict=True)))


def test_a_member_before_the_commit_rolls_back_and_one_committed_does_not() -> None:
    assert group(vm("a", P.SWAPPING), vm("b", P.SWAPPING), vm("c", P.SWAPPING)
                 ).rollback_blocked() == ""  # fmt: skip
    g = group(vm("a", P.SWAPPING, T), vm("b", P.SWAPPING, T), vm("c", P.SWAPPING))
    assert g.rollback_blocked() == (
        "the claims moved together are committed to the swap (commitTime)"
    )


def test_a_committed_member_rolls_back_when_another_rolled_back_without_the_commit() -> None:
    g = group(vm("a", P.SWAPPING, T), vm("b", P.ROLLING_BACK), vm("c", P.SWAPPING, T))
    assert g.aborted == ["b"] and g.rollback_blocked() == ""
    # rolled back WITH the commit (itself aborted by another): not an abort on its own
    g = group(vm("a", P.SWAPPING, T), vm("b", P.ROLLING_BACK, T), vm("c", P.SWAPPING, T))
    assert g.aborted == [] and g.rollback_blocked()


def test_a_committed_member_whose_old_claim_is_gone_never_rolls_back_aborted_or_not() -> None:
    """Its swap deleted the old claim (the old PV is Released): a rollback would delete the
    unbound new PV and its LV, and the old PV's restored Delete policy the old one."""
    me = vm("a", P.SWAPPING, T)
    me = replace(me, status=replace(me.status, claim_uid="uid-old-a"))
    g = Group(me, {"b": vm("b", P.ROLLING_BACK), "c": vm("c", P.SWAPPING, T)},
              claim_gone="claim a (uid-old-a) is deleted")  # fmt: skip
    assert g.aborted == ["b"]
    assert g.rollback_blocked() == (
        "claim a (uid-old-a) is deleted: the old volume has no claim to go back to"
    )
    # without the commit the swap never deleted it: the claim's own deletion is no bar
    me = replace(me, status=replace(me.status, commit_time=""))
    g = Group(me, {"b": vm("b", P.ROLLING_BACK), "c": vm("c", P.SWAPPING)},
              claim_gone="claim a (uid-old-a) is deleted")  # fmt: skip
    assert g.rollback_blocked() == ""


def test_once_a_claim_is_swapped_none_rolls_back_aborted_or_not() -> None:
    g = group(vm("a", P.SWAPPING, T), vm("b", P.STARTING, T), vm("c", P.ROLLING_BACK))
    assert g.rollback_blocked() == "b, moved with this claim, swapped already"


def test_a_member_before_swapping_waits_for_the_groups_decision_made_in_swapping() -> None:
    g = group(vm("a", P.FINAL_COPY), vm("b", P.SWAPPING), vm("c", P.FINAL_COPY))
    assert g.rollback_blocked() == "b, moved with this claim, swapped already"


def test_the_commit_is_whole_once_every_member_has_it() -> None:
    assert not group(vm("a", P.SWAPPING, T), vm("b", P.SWAPPING, T), vm("c", P.SWAPPING)
                     ).commit_complete  # fmt: skip
    assert group(vm("a", P.SWAPPING, T), vm("b", P.SWAPPING, T), vm("c", P.STARTING, T)
                 ).commit_complete  # fmt: skip
    assert not group(vm("a", P.SWAPPING), vm("b", P.SWAPPING, T), vm("c", P.SWAPPING, T)
                     ).commit_complete  # fmt: skip
    # one seen and gone after this one's commit finished; one never seen is waited for
    assert group(vm("a", P.SWAPPING, T), None, vm("c", P.SWAPPING, T), seen="b,c"
                 ).commit_complete  # fmt: skip
    assert not group(vm("a", P.SWAPPING, T), None, vm("c", P.SWAPPING, T), seen="c"
                     ).commit_complete  # fmt: skip


def test_the_commit_waits_for_every_member_in_swapping() -> None:
    g = group(vm("a", P.SWAPPING), vm("b", P.FINAL_COPY), vm("c", P.SWAPPING))
    assert g.not_swapping() == "final copy done; waiting for claim b's swap (phase FinalCopy)"
    assert group(vm("a", P.SWAPPING), vm("b", P.SWAPPING), vm("c", P.STARTING, T)
                 ).not_swapping() == ""  # fmt: skip


def test_a_done_member_is_kept_while_a_member_of_its_move_is_in_progress() -> None:
    done = vm("a", P.ROLLED_BACK, completion_time="2026-11-28T10:00:00Z")
    assert group(done, vm("b", P.SWAPPING), vm("c", P.ROLLED_BACK)).busy() == ["b"]
    later = replace(vm("b", P.PRE_COPY), created="2026-11-28T11:00:00Z")  # a later move's
    assert group(done, later, None).busy() == []

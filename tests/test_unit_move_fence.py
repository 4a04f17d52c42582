"""A move's fences as pure rules (docs/mobility.md, "Fencing"): which phase a pass may write
over the one it read, which PV is the claim's, when a new PV or target volume may go in a
rollback, which gated pods the sweep lets go; and doctor's finding for a gate left behind."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests import doctor_scenarios as s
from topolvm.doctor.checks.move_gate_left import run as gate_left
from topolvm.doctor.model import Severity
from topolvm.k8s.moveobject import MovePhase, MoveStatus, OldVolume, may_write
from topolvm.move import claims, fence

Obj = dict[str, Any]
P = MovePhase
GATE = "topolvm.io/move"


@pytest.mark.parametrize(
    ("read", "written", "ok"),
    [
        (P.FINAL_COPY, P.SWAPPING, True), (P.FINAL_COPY, P.ROLLING_BACK, True),
        (P.SWAPPING, P.ROLLING_BACK, True), (P.STARTING, P.ROLLING_BACK, False),
        (P.STARTING, P.SUCCEEDED, False), (P.STARTING, P.VERIFYING, True),
        (P.VERIFYING, P.SUCCEEDED, True), (P.VERIFYING, P.UNVERIFIED, True),
        (P.VERIFYING, P.ROLLING_BACK, False), (P.UNVERIFIED, P.UNVERIFIED, False),
        (P.UNVERIFIED, P.SUCCEEDED, False), (P.SUCCEEDED, P.VERIFYING, False),
        (P.SUCCEEDED, P.ROLLING_BACK, False),
        (P.ROLLED_BACK, P.ROLLED_BACK, False), (P.PRE_COPY, P.SWAPPING, False),
        (P.SWAPPING, P.FINAL_COPY, False), (P.PENDING, P.REFUSED, True),
        (P.ROLLING_BACK, P.ROLLING_BACK, True), (P.STOPPING, P.PRE_COPY, False),
    ],
)  # fmt: skip
def test_a_pass_writes_only_a_phase_that_follows_the_one_it_read(
    read: str, written: str, ok: bool
) -> None:
    assert may_write(MoveStatus(phase=read), MoveStatus(phase=written)) is ok


def test_once_the_swap_recorded_the_claims_deletion_it_never_rolls_back() -> None:
    committed = MoveStatus(phase=P.SWAPPING, commit_time="2026-11-28T10:00:00Z")
    assert not may_write(committed, replace(committed, phase=P.ROLLING_BACK))
    assert may_write(committed, replace(committed, phase=P.STARTING))
    rolling = MoveStatus(phase=P.ROLLING_BACK, commit_time="2026-11-28T10:00:00Z")
    assert may_write(rolling, rolling)  # a rogue RollingBack stays, with its message


def test_the_group_commit_is_written_only_in_swapping_and_never_taken_back() -> None:
    stamp = "2026-11-28T10:00:00Z"
    swapping = MoveStatus(phase=P.SWAPPING)
    assert may_write(swapping, replace(swapping, commit_time=stamp))
    for phase in (P.FINAL_COPY, P.ROLLING_BACK, P.STARTING):  # only as the group's commit
        assert not may_write(MoveStatus(phase=phase), MoveStatus(phase=phase, commit_time=stamp))
    committed = replace(swapping, commit_time=stamp)
    assert not may_write(committed, swapping)  # never removed
    assert not may_write(committed, replace(committed, commit_time="2026-11-28T10:00:09Z"))


def test_a_committed_member_rolls_back_only_when_the_group_commit_was_aborted() -> None:
    """A member rolled back without ``commitTime``: the group's commit can never be whole, so
    no claim was deleted, and the members that have it roll back too."""
    committed = MoveStatus(phase=P.SWAPPING, commit_time="2026-11-28T10:00:00Z")
    back = replace(committed, phase=P.ROLLING_BACK)
    assert not may_write(committed, back)
    assert may_write(committed, back, aborted=True)
    starting = replace(committed, phase=P.STARTING)  # swapped: never, aborted or not
    assert not may_write(starting, replace(starting, phase=P.ROLLING_BACK), aborted=True)


def test_a_succeeded_move_only_records_what_became_of_its_old_volume() -> None:
    done = MoveStatus(phase=P.SUCCEEDED, old_volume=OldVolume.KEPT, message="kept")
    assert may_write(done, replace(done, old_volume=OldVolume.REMOVED, message="removed"))
    assert may_write(done, replace(done, old_volume=OldVolume.LEFT))
    assert not may_write(done, replace(done, target_node="n9"))
    removed = replace(done, old_volume=OldVolume.REMOVED)
    assert not may_write(removed, replace(removed, message="again"))
    assert not may_write(MoveStatus(phase=P.UNVERIFIED, old_volume=OldVolume.KEPT),
                         MoveStatus(phase=P.UNVERIFIED, old_volume=OldVolume.REMOVED))  # fmt: skip


def _pv(name: str, claim: str = "data", uid: str = "c1", phase: str = "Bound",
        driver: str = "topolvm.io", handle: str = "vol-1") -> Obj:  # fmt: skip
    ref = {"namespace": "app", "name": claim, **({"uid": uid} if uid else {})}
    csi = {"driver": driver, "volumeHandle": handle}
    return {"metadata": {"name": name}, "status": {"phase": phase},
            "spec": {"claimRef": ref, "csi": csi}}  # fmt: skip


def _pvc(uid: str, volume: str) -> Obj:
    return {"metadata": {"name": "data", "uid": uid}, "spec": {"volumeName": volume}}


def test_the_old_pv_is_the_claims_with_the_uid_recorded() -> None:
    assert fence.claim_volume(_pv("pv-1"), "app", "data", "c1", "topolvm.io") == ""
    assert "its claimRef is app/other" in fence.claim_volume(
        _pv("pv-9", claim="other"), "app", "data", "c1", "topolvm.io")  # fmt: skip
    assert "(UID c2)" in fence.claim_volume(_pv("pv-1", uid="c2"), "app", "data", "c1",
                                            "topolvm.io")  # fmt: skip
    assert "no claim UID" in fence.claim_volume(_pv("pv-1"), "app", "data", "", "topolvm.io")
    assert "provisioned by x.io" in fence.claim_volume(_pv("pv-1", driver="x.io"), "app",
                                                       "data", "c1", "topolvm.io")  # fmt: skip
    assert fence.claim_volume(None, "app", "data", "c1", "topolvm.io") == "it does not exist"


def test_the_old_pv_goes_only_once_no_claim_is_bound_to_it() -> None:
    released = _pv("pv-1", phase="Released")
    assert fence.released(released, _pvc("c2", "move-1"), "c1") == ""
    assert fence.released(released, None, "c1") == ""
    assert "not re-created" in fence.released(released, _pvc("c1", "pv-1"), "c1")
    assert "is bound to PV pv-1" in fence.released(released, _pvc("c2", "pv-1"), "c1")
    assert "still Bound" in fence.released(_pv("pv-1"), _pvc("c2", "move-1"), "c1")


def test_a_rollback_deletes_the_new_pv_only_while_nothing_uses_it() -> None:
    fresh = _pv("move-1", uid="", phase="Available")
    assert fence.unbound(fresh, _pvc("c1", "pv-1"), []) == ""
    assert "bound to claim app/data" in fence.unbound(_pv("move-1", uid="c2"), None, [])
    assert "is Bound" in fence.unbound(_pv("move-1", uid="", phase="Bound"), None, [])
    user = {"metadata": {"name": "db-0"},
            "spec": {"volumes": [{"persistentVolumeClaim": {"claimName": "data"}}]}}  # fmt: skip
    why = fence.unbound(fresh, _pvc("c2", "move-1"), [user])
    assert why == "claim data is bound to PV move-1, used by pod db-0"


def test_a_volume_goes_only_while_no_other_pv_refers_to_it() -> None:
    pvs = [_pv("move-1", handle="vol-2"), _pv("x", handle="vol-3", driver="other.io")]
    assert fence.unreferenced("vol-3", pvs, "topolvm.io") == ""
    assert fence.unreferenced("vol-2", pvs, "topolvm.io") == "PV move-1 refers to volume vol-2"
    assert fence.unreferenced("", pvs, "topolvm.io") == ""


def _pod(name: str, claim: str, gates: tuple[str, ...] = (GATE,), ns: str = "app") -> Obj:
    return {"metadata": {"name": name, "namespace": ns},
            "spec": {"schedulingGates": [{"name": g} for g in gates],
                     "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": claim}}]},
            "status": {"phase": "Pending"}}  # fmt: skip


def _move(claim: str, phase: str, ns: str = "app", name: str = "") -> Obj:
    return {"metadata": {"name": name or claim, "namespace": ns}, "spec": {"claim": claim},
            "status": {"phase": phase}}  # fmt: skip


def test_the_sweep_lets_go_the_pods_whose_claims_have_no_move_in_progress() -> None:
    pods = [_pod("a-0", "a"), _pod("b-0", "b"), _pod("c-0", "c"), _pod("d-0", "d"),
            _pod("e-0", "e", gates=("other",)), _pod("f-0", "f", ns="elsewhere"),
            _pod("g-0", "g")]  # fmt: skip
    moves = [_move("a", P.ROLLED_BACK), _move("b", P.STOPPING), _move("c", P.SUCCEEDED),
             _move("f", P.STOPPING), _move("g", P.FINAL_COPY, name="by-hand"),
             {"metadata": {"name": "new", "namespace": "app"}, "spec": {"claim": "x"}}]  # fmt: skip
    stale = [p["metadata"]["name"] for p in claims.stale_gates(pods, moves, GATE)]
    assert stale == ["a-0", "c-0", "d-0", "f-0"]  # f: its move is in another namespace


def test_doctor_names_a_pod_held_without_a_move() -> None:
    kind, held = s.pod("vault-0", claims=("data-vault-0",))
    held["spec"]["schedulingGates"] = [{"name": GATE}]
    held["metadata"]["creationTimestamp"] = s.OLD
    snap = s.snapshot((kind, held), s.volume_move("data-vault-0", P.ROLLED_BACK,
                                                  reason="CopyFailed"))  # fmt: skip
    [f] = gate_left(snap)
    assert f.severity is Severity.ERROR
    assert f.title == ("pod app/vault-0 is held by the scheduling gate topolvm.io/move, but no "
                       "move of its claims is in progress")  # fmt: skip
    assert "claim data-vault-0: VolumeMove app/data-vault-0 is RolledBack (CopyFailed)" in (
        f.evidence)  # fmt: skip
    assert f.fixes[1].commands == (
        'kubectl patch pod -n app vault-0 --type=json -p \'[{"op": "test", "path": '
        '"/spec/schedulingGates/0", "value": {"name": "topolvm.io/move"}}, {"op": '
        '"remove", "path": "/spec/schedulingGates/0"}]\'',
    )
    moving = s.snapshot((kind, held), s.volume_move("data-vault-0", P.FINAL_COPY))
    assert gate_left(moving) == []
    young = dict(
        held,
        metadata={
            **held["metadata"],
            "creationTimestamp": s.NOW.isoformat().replace("+00:00", "Z"),
        },
    )
    [w] = gate_left(s.snapshot((kind, young)))
    assert w.severity is Severity.WARNING and "claim data-vault-0: no VolumeMove" in w.evidence

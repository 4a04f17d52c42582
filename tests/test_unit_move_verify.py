"""A move verified before its old volume goes, as pure rules (docs/mobility.md, "Verified
before the source goes"): when the pod may start (the target is cut), what both nodes'
digests say (match, mismatch, a failed digest, still being made), the bytes they cover, and
the Events a status change posts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from topolvm.k8s.lvobject import LogicalVolumeObject
from topolvm.k8s.moveobject import Condition, MovePhase, MoveStatus, OldVolume, Verified
from topolvm.move import verdict
from topolvm.move.notes import notes
from topolvm.move.verdict import Outcome

UID = "vm-uid"


def lv(name: str, node: str, verify: dict[str, Any] | None = None, total: int = 0,
       spec_verify: dict[str, Any] | None = None) -> LogicalVolumeObject:  # fmt: skip
    status: dict[str, Any] = {"volumeID": f"vol-{name}"}
    if verify is not None:
        status["verify"] = verify
    if total:
        status["copy"] = {"phase": "Done", "totalBytes": total}
    spec: dict[str, Any] = {"nodeName": node, "size": "1Gi"}
    if spec_verify is not None:
        spec["verify"] = spec_verify
    return LogicalVolumeObject.from_dict({"metadata": {"name": name, "uid": f"u-{name}"},
                                          "spec": spec, "status": status})  # fmt: skip


def done(digest: str, size: int = 1 << 30, uid: str = UID) -> dict[str, Any]:
    return {"id": uid, "phase": "Done", "digest": digest, "sizeBytes": size}


def test_the_pod_starts_only_once_the_target_is_cut_for_this_move() -> None:
    assert not verdict.cut_made(UID, lv("t", "n2"))
    assert not verdict.cut_made(UID, lv("t", "n2", {"id": UID, "phase": "Pending"}))
    assert not verdict.cut_made(UID, lv("t", "n2", {"id": "another", "phase": "Cut"}))
    for phase in ("Cut", "Done", "Failed"):
        assert verdict.cut_made(UID, lv("t", "n2", {"id": UID, "phase": phase}))


def test_equal_digests_of_equal_sizes_verify_the_move() -> None:
    v = verdict.judge(UID, lv("s", "n1", done("ab12")), lv("t", "n2", done("ab12")))
    assert v.outcome == Outcome.MATCH and v.ended
    assert (v.source_digest, v.target_digest, v.size) == ("ab12", "ab12", 1 << 30)
    assert "equals the source's: ab12" in v.message


def test_different_digests_or_sizes_are_a_mismatch() -> None:
    v = verdict.judge(UID, lv("s", "n1", done("ab12")), lv("t", "n2", done("ff00")))
    assert v.outcome == Outcome.MISMATCH
    gib = 1 << 30
    assert v.message == ("the target's content as of the swap differs from the source's: "
                         f"source ab12 ({gib} bytes), target ff00 ({gib} bytes)")  # fmt: skip
    sized = verdict.judge(UID, lv("s", "n1", done("ab12")), lv("t", "n2", done("ab12", 4096)))
    assert sized.outcome == Outcome.MISMATCH


def test_a_failed_digest_on_either_side_fails_the_verification() -> None:
    failed = {"id": UID, "phase": "Failed", "message": "its cut overflowed"}
    v = verdict.judge(UID, lv("s", "n1", failed), lv("t", "n2", done("ab12")))
    assert v.outcome == Outcome.FAILED
    assert v.message == "the source volume s on node n1 could not be digested: its cut overflowed"
    gone = verdict.judge(UID, None, lv("t", "n2", done("ab12")), "the old PV is gone")
    assert gone.outcome == Outcome.FAILED and "the old PV is gone" in gone.message
    assert verdict.judge(UID, lv("s", "n1"), None).outcome == Outcome.FAILED


def test_digests_being_made_or_of_another_move_are_waited_for() -> None:
    cut = {"id": UID, "phase": "Cut"}
    v = verdict.judge(UID, lv("s", "n1", done("ab12", uid="earlier")), lv("t", "n2", cut))
    assert v.outcome == Outcome.PENDING and not v.ended
    assert v.message == ("digests being made (source on node n1: not cut yet; target on node "
                         "n2: cut, being read)")  # fmt: skip


def test_both_digests_cover_the_bytes_the_copy_went_through() -> None:
    target = lv("t", "n2", total=1000, spec_verify={"id": UID, "sizeBytes": 1000})
    assert verdict.verify_size(target, 4096) == 1000
    assert verdict.verify_size(lv("t", "n2"), 4096) == 4096  # no copy status: the move's size
    assert verdict.asked(target, UID, 1000)
    assert not verdict.asked(target, UID, 999) and not verdict.asked(target, "other", 1000)


def test_events_say_the_verification_and_what_became_of_the_old_volume() -> None:
    verifying = MoveStatus(phase=MovePhase.VERIFYING, old_volume=OldVolume.KEPT)
    cond = Condition(Verified.TYPE, "True", Verified.MATCH, "equal: ab12")
    verified = verifying.with_condition(cond)
    assert [(n.reason, n.message) for n in notes(verifying, verified)] == [
        ("MoveVerified", "equal: ab12")]  # fmt: skip
    assert notes(verified, verified) == []
    kept = replace(verified, phase=MovePhase.SUCCEEDED, message="moved")
    assert [n.reason for n in notes(verified, kept)] == ["Moved"]
    removed = replace(kept, old_volume=OldVolume.REMOVED, old_pv="pv-1", source_volume="pv-1")
    assert [n.reason for n in notes(kept, removed)] == ["OldVolumeRemoved"]
    bad = replace(verifying, phase=MovePhase.UNVERIFIED, message="differs").with_condition(
        Condition(Verified.TYPE, "False", Verified.MISMATCH, "differs"))  # fmt: skip
    [note] = notes(verifying, bad)
    assert (note.reason, note.warning) == ("MoveUnverified", True)


def test_the_verified_condition_round_trips_and_keeps_its_transition_time() -> None:
    cond = Condition(Verified.TYPE, "True", Verified.MATCH, "equal", "2026-01-01T00:00:00Z")
    s = MoveStatus(phase=MovePhase.VERIFYING).with_condition(cond)
    again = s.with_condition(replace(cond, message="equal again", last_transition_time="later"))
    assert again.conditions[0].last_transition_time == "2026-01-01T00:00:00Z"
    assert MoveStatus.from_dict(s.to_dict()) == s and s.verified
    assert s.to_dict()["conditions"] == [{
        "type": "Verified", "status": "True", "reason": "DigestMatch", "message": "equal",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]  # fmt: skip
    assert MoveStatus.from_dict({"conditions": "junk"}).conditions == ()

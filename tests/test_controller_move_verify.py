"""A move verified before its old volume goes (docs/mobility.md, "Verified before the source
goes"), against the Kubernetes API emulator, the test playing the nodes (their
``status.verify``), the kubelet and the PV controller: the target is asked for a digest once
its final copy is done, the source at the swap, the pod starts once the target is cut, equal
digests remove the old volume (or keep it ``spec.keepSourceSeconds``), a mismatch or a failed
digest keeps it and marks the move. The same with real nodes and a block flipped on purpose:
tests/test_cluster_move_verify.py.
The fences a review asked for (the source derived from the old PV, the swap of the final
round only, no rollback past the swap, the old PV before its LV, the pod deleted as checked)
are at the end."""

# ruff: noqa: F811  (the emulator fixtures, imported, are the tests' parameters)
from __future__ import annotations

import pytest

from tests.kube_emulator import KubeEmulator
from tests.move_fencing_helpers import keep_passes, node_verifies, seed_unrelated
from tests.test_controller_move_fencing import (
    KEY,
    LVS,
    _lv_status,
    _status,
    _swap,
    _to_final_copy,
    verified,
)
from tests.test_controller_moves import MOVES, _move, _reasons, reconciler  # noqa: F401
from tests.test_ops_move_cli import NS, emu, pod, seed  # noqa: F401 (the emulator fixture)
from topolvm.controller.moves import MoveReconciler
from topolvm.controller.movesteps import Rollback
from topolvm.k8s import api
from topolvm.k8s.moveobject import MovePhase, OldVolume, VolumeMoveObject, manifest

GIB = 1 << 30


async def _started(emu: KubeEmulator, r: MoveReconciler, keep: int = 0) -> VolumeMoveObject:
    """A move swapped (Starting), its pod re-created by its StatefulSet and Running."""
    vm = await _to_final_copy(emu, r, keep)
    await _swap(emu, r, vm)
    emu.create(pod("web-0", ["data-web-0"], ("StatefulSet", "web"), {"app": "web"}))
    return await _move(r, "data-web-0")


def _exists(emu: KubeEmulator, pv: str = "pv-1") -> tuple[bool, bool]:
    """Whether the old PV and the old LogicalVolume are there."""
    return (emu.get("persistentvolumes", pv) is not None,
            emu.get(LVS, pv, group="topolvm.io") is not None)  # fmt: skip


async def test_the_pod_starts_once_its_target_is_cut_and_the_old_volume_goes_once_verified(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    seed(emu)
    r = reconciler
    vm = await _started(emu, r)
    for name in (vm.made_name, "pv-1"):  # both asked at the swap, for the bytes copied
        lv = emu.get(LVS, name, group="topolvm.io")
        assert lv is not None and lv["spec"]["verify"] == {"id": vm.uid, "sizeBytes": 10 * GIB}
    await r.reconcile(KEY)  # the pod runs, but its volume is not cut yet: it is not let go
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.STARTING, vm.status
    assert vm.status.message == (
        "waiting for node n2 to cut the target volume for its verification"
    )
    vm = await verified(emu, r, vm)
    assert vm.status.phase == MovePhase.SUCCEEDED, vm.status
    assert vm.status.verified and vm.status.old_volume == OldVolume.REMOVED
    cond = vm.status.condition("Verified")
    assert cond is not None and cond.reason == "DigestMatch" and "ab12" in cond.message
    assert (vm.status.source_digest, vm.status.target_digest) == ("ab12", "ab12")
    assert vm.status.verify_bytes == 10 * GIB and vm.status.downtime_seconds >= 0
    assert vm.status.message.endswith("; verified; the old volume is removed"), vm.status
    assert _exists(emu) == (False, False)
    for kind in ("VolumeMove", "PersistentVolumeClaim"):
        said = await _reasons(r, kind)
        assert {"MoveVerifying", "MoveVerified", "Moved"} <= set(said), said


async def test_the_target_is_asked_for_its_digest_once_its_final_copy_is_done(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    """Before the swap, with the pod down: the target's node cuts while the rest of the move
    runs, so the pod's start does not wait for a snapshot (docs/mobility.md, a move's
    downtime); the source is asked after the commit."""
    seed(emu)
    r = reconciler
    vm = await _to_final_copy(emu, r)  # the final round copied
    await emu.remove("pods", "web-0", NS)  # the pod down
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.SWAPPING and not vm.status.commit_time, vm.status
    claim = emu.get("persistentvolumeclaims", "data-web-0", NS)
    assert claim is not None and claim["metadata"]["uid"] == vm.status.claim_uid  # not swapped
    target = emu.get(LVS, vm.made_name, group="topolvm.io")
    assert target is not None
    assert target["spec"]["verify"] == {"id": vm.uid, "sizeBytes": 10 * GIB}
    # the source only after the commit: its cut then holds whatever reached it until the swap
    source = emu.get(LVS, "pv-1", group="topolvm.io")
    assert source is not None
    assert "verify" not in source["spec"], source["spec"]
    await _swap(emu, r, vm)
    source = emu.get(LVS, "pv-1", group="topolvm.io")
    assert source is not None and source["spec"]["verify"]["id"] == vm.uid


async def test_a_mismatch_keeps_the_old_volume_and_marks_the_move(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    seed(emu)
    r = reconciler
    vm = await verified(emu, r, await _started(emu, r), target_digest="ff00")
    assert vm.status.phase == MovePhase.UNVERIFIED, vm.status
    assert vm.status.reason == "DigestMismatch" and not vm.status.verified
    cond = vm.status.condition("Verified")
    assert cond is not None and cond.status == "False" and cond.reason == "DigestMismatch"
    assert vm.status.old_volume == OldVolume.KEPT
    assert "source ab12" in vm.status.message and "target ff00" in vm.status.message
    assert "the old volume PV pv-1 (LogicalVolume pv-1 on node n1) is kept" in vm.status.message
    assert _exists(emu) == (True, True)
    old = emu.get("persistentvolumes", "pv-1")
    assert old is not None and old["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert "MoveUnverified" in await _reasons(r, "PersistentVolumeClaim")
    await api.delete(r.client, MOVES, "data-web-0", namespace=NS)  # deleting it keeps them too
    await r.reconcile(KEY)
    assert emu.get("volumemoves", "data-web-0", NS) is None
    assert _exists(emu) == (True, True)


async def test_a_verified_condition_written_by_another_is_judged_again_from_the_nodes(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    """Whoever may write volumemoves/status says Verified=True while the nodes' digests
    differ: the old volume is not removed; the move ends Unverified, the old volume kept."""
    seed(emu)
    r = reconciler
    vm = await _started(emu, r)
    node_verifies(emu, vm.made_name, vm.uid)  # cut: the pod may start
    await r.reconcile(KEY)
    assert (await _move(r, "data-web-0")).status.phase == MovePhase.VERIFYING
    node_verifies(emu, vm.made_name, vm.uid, "Done", "ff00")
    node_verifies(emu, "pv-1", vm.uid, "Done", "ab12")
    _status(emu, conditions=[{"type": "Verified", "status": "True", "reason": "DigestMatch",
                              "message": "a rogue writer"}])  # fmt: skip
    for _ in range(3):
        await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.UNVERIFIED, vm.status
    assert "the nodes' digests do not show the copy verified" in vm.status.message
    assert vm.status.old_volume == OldVolume.KEPT and _exists(emu) == (True, True)


async def test_a_failed_digest_keeps_the_old_volume(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    seed(emu)
    r = reconciler
    vm = await _started(emu, r)
    node_verifies(emu, vm.made_name, vm.uid)
    await r.reconcile(KEY)  # let go: Verifying
    lv = emu.get(LVS, "pv-1", group="topolvm.io")
    assert lv is not None
    lv["status"]["verify"] = {"id": vm.uid, "phase": "Failed",
                              "message": "its point-in-time cut verify.x overflowed"}  # fmt: skip
    emu.create(lv)
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.UNVERIFIED and vm.status.reason == "VerifyFailed"
    assert "could not be digested: its point-in-time cut verify.x overflowed" in str(
        vm.status.message
    )
    assert _exists(emu) == (True, True)


async def test_keep_source_keeps_the_old_volume_that_long_then_removes_it(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    seed(emu)
    r = reconciler
    vm = await verified(emu, r, await _started(emu, r, keep=600))
    assert vm.status.phase == MovePhase.SUCCEEDED and vm.status.verified, vm.status
    assert vm.status.old_volume == OldVolume.KEPT and vm.status.keep_source_until
    assert f"is kept until {vm.status.keep_source_until}" in vm.status.message
    assert _exists(emu) == (True, True)
    result = await r.reconcile(KEY)  # looked at again once the keep is over
    assert result is not None and result.requeue_after is not None
    assert 540 < result.requeue_after <= 601
    assert _exists(emu) == (True, True)
    keep_passes(emu, vm.made_name, 601)
    await r.reconcile(KEY)
    assert _exists(emu) == (False, False)
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.SUCCEEDED and vm.status.old_volume == OldVolume.REMOVED
    assert "then removed" in vm.status.message
    assert "OldVolumeRemoved" in await _reasons(r, "VolumeMove")


async def test_deleting_a_move_that_keeps_its_old_volume_removes_it(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    seed(emu)
    r = reconciler
    vm = await verified(emu, r, await _started(emu, r, keep=3600))
    assert vm.status.old_volume == OldVolume.KEPT and _exists(emu) == (True, True)
    await api.delete(r.client, MOVES, "data-web-0", namespace=NS)
    await r.reconcile(KEY)
    assert _exists(emu) == (False, False)
    assert emu.get("volumemoves", "data-web-0", NS) is None  # its finalizer let go after


async def test_an_old_volume_someone_took_is_left_to_them(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    """During the keep, the old PV's claimRef is removed (to bind a claim to it, as
    docs/mobility.md says): at the end of the keep the move leaves the PV and LV alone."""
    seed(emu)
    r = reconciler
    vm = await verified(emu, r, await _started(emu, r, keep=600))
    assert vm.status.old_volume == OldVolume.KEPT, vm.status
    old = emu.get("persistentvolumes", "pv-1")
    assert old is not None
    del old["spec"]["claimRef"]
    old["status"] = {"phase": "Available"}
    emu.create(old)
    keep_passes(emu, vm.made_name, 601)
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.SUCCEEDED and vm.status.old_volume == OldVolume.LEFT
    assert "left alone" in vm.status.message
    assert _exists(emu) == (True, True)
    assert "OldVolumeLeft" in await _reasons(r, "VolumeMove")


# -- fences of the review: what the move copies from, swaps to, deletes, and in what order ----


async def test_a_status_naming_another_source_rolls_back_before_any_copy(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    """The source is derived from the old PV's volumeHandle, not taken from the status: a
    status that names another LogicalVolume (another claim's) gets no copy made of it."""
    seed(emu)
    seed_unrelated(emu)
    r = reconciler
    await api.create(r.client, MOVES.from_dict(manifest("topolvm.io", NS, "data-web-0", "n2")))
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.PRE_COPY and vm.status.source_volume == "pv-1"
    _status(emu, sourceVolume="pv-9")
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    assert vm.status.phase in (MovePhase.ROLLING_BACK, MovePhase.ROLLED_BACK), vm.status
    assert vm.status.reason == "SourceChanged", vm.status
    assert "volume is LogicalVolume pv-1" in vm.status.message
    assert emu.get(LVS, vm.made_name, group="topolvm.io") is None


@pytest.mark.parametrize("forged", ["round 1", "target's source", "status's source"])
async def test_the_swap_commits_only_the_final_round_from_the_verified_source(
    emu: KubeEmulator, reconciler: MoveReconciler, forged: str
) -> None:
    """Before the commit the swap checks that the target holds round 2, done, copied from the
    LogicalVolume the old PV names: a target that does not (a phase written past Stopping, a
    copy from elsewhere, a status naming another source) rolls back; the claim is kept."""
    seed(emu)
    seed_unrelated(emu)
    r = reconciler
    vm = await _to_final_copy(emu, r)
    await emu.remove("pods", "web-0", NS)
    if forged == "round 1":  # the final round never asked for: round 1's copy is done
        _lv_status(emu, vm.made_name, 1)
    elif forged == "target's source":
        lv = emu.get(LVS, vm.made_name, group="topolvm.io")
        assert lv is not None
        lv["spec"]["copy"]["source"] = "pv-9"
        emu.create(lv)
    else:
        _status(emu, sourceVolume="pv-9")
    for _ in range(4):
        await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.ROLLED_BACK, vm.status
    reason = "SourceChanged" if forged == "status's source" else "CopyNotFinal"
    assert vm.status.reason == reason and not vm.status.commit_time, vm.status
    pvc = emu.get("persistentvolumeclaims", "data-web-0", NS)
    assert pvc is not None and pvc["metadata"]["uid"] == "uid-data-web-0"
    assert _exists(emu) == (True, True) and _exists(emu, "pv-9") == (True, True)


@pytest.mark.parametrize("committed", [True, False])
async def test_a_rollback_asked_for_after_the_swap_keeps_the_phase(
    emu: KubeEmulator, reconciler: MoveReconciler, monkeypatch: pytest.MonkeyPatch,
    committed: bool,
) -> None:  # fmt: skip
    """Past the swap (the old claim deleted) a step that asks for a rollback gets none: the
    move stays in its phase and says it cannot roll back (with or without commitTime, as a
    move swapped by an older controller has none)."""
    seed(emu)
    r = reconciler
    await _started(emu, r)
    if not committed:
        obj = emu.get("volumemoves", "data-web-0", NS)
        assert obj is not None
        del obj["status"]["commitTime"]
        emu.create(obj)

    async def boom(vm: VolumeMoveObject) -> str:
        raise Rollback("TargetGone", "the target went away")

    monkeypatch.setattr(r.verify, "cut_waiting", boom)
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.STARTING, vm.status
    assert vm.status.message.startswith("cannot roll back (the target went away)"), vm.status
    assert emu.get(LVS, vm.made_name, group="topolvm.io") is not None


async def test_the_old_pv_goes_before_its_logical_volume_even_across_a_crash(
    emu: KubeEmulator, reconciler: MoveReconciler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old PV is deleted first (its preconditions stop a PV someone bound meanwhile with
    its LV untouched), then the LV; a controller that crashes between the two finds the LV
    again by the verification the move asked of it."""
    seed(emu)
    r = reconciler
    vm = await _started(emu, r)
    node_verifies(emu, vm.made_name, vm.uid)
    await r.reconcile(KEY)  # Verifying
    node_verifies(emu, vm.made_name, vm.uid, "Done", "ab12")
    node_verifies(emu, "pv-1", vm.uid, "Done", "ab12")
    await r.reconcile(KEY)  # the condition
    assert (await _move(r, "data-web-0")).status.verified
    real, pv_gone, crash = r.store.delete, [], [True]

    async def delete(name: str, *, uid: str = "", resource_version: str = "") -> None:
        pv_gone.append(emu.get("persistentvolumes", "pv-1") is None)
        if crash.pop() if crash else False:
            raise RuntimeError("the controller crashed")
        await real(name, uid=uid, resource_version=resource_version)

    monkeypatch.setattr(r.store, "delete", delete)
    with pytest.raises(RuntimeError):
        await r.reconcile(KEY)
    assert _exists(emu) == (False, True)
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.SUCCEEDED and vm.status.old_volume == OldVolume.REMOVED
    assert _exists(emu) == (False, False) and pv_gone == [True, True]


async def test_the_pod_is_deleted_only_as_checked(
    emu: KubeEmulator, reconciler: MoveReconciler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod is deleted with its UID and resourceVersion as preconditions: a pod that
    changed after the move checked it (its gate, the move unchanged) is not deleted then."""
    seed(emu)
    r = reconciler
    await api.create(r.client, MOVES.from_dict(manifest("topolvm.io", NS, "data-web-0", "n2")))
    await r.reconcile(KEY)
    await r.reconcile(KEY)
    _lv_status(emu, (await _move(r, "data-web-0")).made_name, 1)
    await r.reconcile(KEY)
    assert (await _move(r, "data-web-0")).status.phase == MovePhase.STOPPING

    async def gate_works(vm: VolumeMoveObject, pod: dict[str, object]) -> None:
        return None  # the pod webhook's part (the emulator has none)

    real_still = r.steps.still

    async def still(vm: VolumeMoveObject) -> None:
        await real_still(vm)
        changed = emu.get("pods", "web-0", NS)
        assert changed is not None
        changed["metadata"]["labels"]["changed"] = "after-the-check"
        emu.create(changed)

    monkeypatch.setattr(r.steps, "_gate_works", gate_works)
    monkeypatch.setattr(r.steps, "still", still)
    await r.reconcile(KEY)
    assert emu.get("pods", "web-0", NS) is not None
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.STOPPING and "waiting for pod web-0" in vm.status.message
    monkeypatch.setattr(r.steps, "still", real_still)
    await r.reconcile(KEY)
    assert emu.get("pods", "web-0", NS) is None

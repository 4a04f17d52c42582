"""A move's fences (docs/mobility.md, "Fencing") against the Kubernetes API emulator, the test
playing the cluster's part (the kubelet, the PV controller, the copy): a pass paused between
its read and its write (a proxy holds its write) decides again from the phase it finds; a
rollback written over a bound claim deletes nothing; a status that names an unrelated PV or
LogicalVolume gets nothing unrelated deleted; deletes carry their preconditions; finalizers
of others stay. Two controllers and a SIGSTOP on the real cluster: tests/test_cluster_chaos.py."""

# ruff: noqa: F811  (the emulator fixtures, imported, are the tests' parameters)
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lightkube.resources.core_v1 import PersistentVolume

from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import client_for
from tests.move_fencing_helpers import holding_proxy, node_verifies, seed_unrelated
from tests.test_controller_moves import MOVES, _move, reconciler  # noqa: F401 (fixtures)
from tests.test_move_together import TOGETHER, seed_two
from tests.test_ops_move_cli import NS, emu, pod, seed  # noqa: F401 (the emulator fixture)
from topolvm.constants import NORMAL
from topolvm.controller.moves import MoveReconciler
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.moveobject import MovePhase, VolumeMoveObject, manifest

KEY = f"{NS}/data-web-0"
LVS = "logicalvolumes"
Obj = dict[str, Any]


def _status(emu: KubeEmulator, name: str = "data-web-0", **changes: Any) -> None:
    """Write the VolumeMove's status as another writer would (no precondition)."""
    obj = emu.get("volumemoves", name, NS)
    assert obj is not None
    obj["status"] = {**obj["status"], **changes}
    emu.create(obj)


def _lv_status(emu: KubeEmulator, name: str, round_: int, volume_id: str = "vol-new") -> None:
    """The target's node: created, and its copy of ``round_`` (of 10 GiB) done."""
    lv = emu.get(LVS, name, group="topolvm.io")
    assert lv is not None
    lv["spec"].setdefault("copy", {})["round"] = round_
    lv["status"] = {"volumeID": volume_id, "copy": {"phase": "Done", "round": round_,
                                                    "totalBytes": 10 << 30}}  # fmt: skip
    emu.create(lv)


async def _to_final_copy(emu: KubeEmulator, r: MoveReconciler, keep: int = 0) -> VolumeMoveObject:
    """Planned, pre-copied, and (the test stopping the pod's world) at FinalCopy with the
    final copy done; the old pod web-0 is still there. ``keep``: spec.keepSourceSeconds."""
    body = manifest("topolvm.io", NS, "data-web-0", "n2", keep_source_seconds=keep)
    await api.create(r.client, MOVES.from_dict(body))
    await r.reconcile(KEY)
    await r.reconcile(KEY)  # the target asked for
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.PRE_COPY and vm.status.target_volume == vm.made_name
    _lv_status(emu, vm.made_name, 1)
    await r.reconcile(KEY)
    assert (await _move(r, "data-web-0")).status.phase == MovePhase.STOPPING
    _lv_status(emu, vm.made_name, 2)  # Stopping's second round, done (no webhook here)
    _status(emu, phase=MovePhase.FINAL_COPY)
    return await _move(r, "data-web-0")


async def _swap(emu: KubeEmulator, r: MoveReconciler, vm: VolumeMoveObject) -> Obj:
    """From FinalCopy (the old pod gone) to Starting, binding the re-created claim to the new
    PV as the PV controller does; the claim."""
    await emu.remove("pods", "web-0", NS)
    for _ in range(6):
        await r.reconcile(KEY)
        pvc = emu.get("persistentvolumeclaims", "data-web-0", NS)
        if pvc is not None and pvc["spec"].get("volumeName") == vm.made_name:
            _bind(emu, pvc, vm.made_name)
        if (await _move(r, "data-web-0")).status.phase == MovePhase.STARTING:
            break
    assert (await _move(r, "data-web-0")).status.phase == MovePhase.STARTING
    pvc = emu.get("persistentvolumeclaims", "data-web-0", NS)
    assert pvc is not None
    return pvc


async def verified(
    emu: KubeEmulator, r: MoveReconciler, vm: VolumeMoveObject, digest: str = "ab12",
    target_digest: str = "", key: str = KEY,
) -> VolumeMoveObject:  # fmt: skip
    """From Starting (the new pod created), the nodes playing their part: the target cut, the
    pod let go, both digests made (the target's ``target_digest`` if given); the move after."""
    node_verifies(emu, vm.made_name, vm.uid)  # cut: the pod may start
    await r.reconcile(key)
    now = await _move(r, vm.name)
    assert now.status.phase == MovePhase.VERIFYING, now.status
    node_verifies(emu, vm.made_name, vm.uid, "Done", target_digest or digest)
    node_verifies(emu, "pv-1" if vm.name == "data-web-0" else "pv-2", vm.uid, "Done", digest)
    for _ in range(3):  # the condition first, then the old volume's fate
        await r.reconcile(key)
    return await _move(r, vm.name)


def _bind(emu: KubeEmulator, pvc: Obj, pv_name: str, old_pv: str = "pv-1") -> None:
    """The PV controller: the re-created claim and its new PV Bound, the old PV Released."""
    pvc["status"] = {"phase": "Bound"}
    emu.create(pvc)
    pv = emu.get("persistentvolumes", pv_name)
    assert pv is not None
    pv["spec"]["claimRef"]["uid"] = pvc["metadata"]["uid"]
    pv["status"] = {"phase": "Bound"}
    emu.create(pv)
    old = emu.get("persistentvolumes", old_pv)
    if old is not None and pv_name != old_pv:
        old["status"] = {"phase": "Released"}
        emu.create(old)


async def test_a_paused_pass_decides_again_from_the_phase_it_finds(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    """A pass reads FinalCopy, sees the old pod still there and decides to roll back; its
    write waits (the process paused) while another controller swaps the claim. Released, its
    write meets the newer version: it reads Starting and decides from there, never writing
    RollingBack over a swapped claim; the move then succeeds and removes only the old
    volume."""
    seed(emu)
    seed_unrelated(emu)
    r = reconciler
    vm = await _to_final_copy(emu, r)
    async with holding_proxy(emu) as proxy:
        paused = MoveReconciler(api.make_client(server=proxy.url), NORMAL, r.store)
        held = proxy.hold("PUT", "/volumemoves/data-web-0/status")
        task = asyncio.ensure_future(paused.reconcile(KEY))
        await asyncio.wait_for(held.arrived.wait(), 10)  # decided RollingBack, not written
        pvc = await _swap(emu, r, vm)
        held.release.set()
        await asyncio.wait_for(task, 10)
        await paused.client.close()
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.STARTING, vm.status
    assert vm.status.commit_time and not vm.status.message.startswith("rolling back")
    assert emu.get("persistentvolumes", vm.made_name) is not None
    assert emu.get(LVS, vm.made_name, group="topolvm.io") is not None

    emu.create(pod("web-0", ["data-web-0"], ("StatefulSet", "web"), {"app": "web"}))
    vm = await verified(emu, r, vm)  # the new pod runs, the copy verified: the old volume goes
    assert vm.status.phase == MovePhase.SUCCEEDED, vm.status
    assert emu.get("persistentvolumes", "pv-1") is None
    assert emu.get(LVS, "pv-1", group="topolvm.io") is None
    now = emu.get("persistentvolumeclaims", "data-web-0", NS)
    assert now is not None and now["metadata"]["uid"] == pvc["metadata"]["uid"]
    for kind, name in (("persistentvolumes", "pv-9"), (LVS, "pv-9"), (LVS, "old")):
        assert emu.get(kind, name, group="topolvm.io" if kind == LVS else None), name


async def test_a_rollback_written_over_a_bound_claim_deletes_nothing(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    """Another writer puts RollingBack over Starting (the claim bound to the new PV): the old
    claim is gone since the committed swap, so the move may not roll back; it deletes neither
    the PV nor the target LV, says why and waits for a person."""
    seed(emu)
    r = reconciler
    vm = await _to_final_copy(emu, r)
    await _swap(emu, r, vm)
    _status(emu, phase=MovePhase.ROLLING_BACK, message="rolling back: a rogue writer")
    await r.reconcile(KEY)
    after = await _move(r, "data-web-0")
    assert after.status.phase == MovePhase.ROLLING_BACK
    assert after.status.message.startswith("cannot roll back: claim data-web-0 ("), after.status
    assert "is deleted: the old volume has no claim to go back to" in after.status.message
    assert emu.get("persistentvolumes", vm.made_name) is not None
    assert emu.get(LVS, vm.made_name, group="topolvm.io") is not None
    assert emu.get("persistentvolumes", "pv-1") is not None  # the old one, Retain, kept too


VERIFIED = [{"type": "Verified", "status": "True", "reason": "DigestMatch"}]


@pytest.mark.parametrize("phase", [MovePhase.ROLLING_BACK, MovePhase.VERIFYING, "verified"])
async def test_a_status_naming_unrelated_volumes_deletes_nothing_unrelated(
    emu: KubeEmulator, reconciler: MoveReconciler, phase: str
) -> None:
    """Whoever may write volumemoves/status points every name at another claim's PV and
    LogicalVolume (and its claim's UID): a rollback deletes only the move's own target (named
    after the VolumeMove's UID) and leaves that PV's reclaim policy; a verification finds no
    old volume to compare with and keeps everything (Unverified); a status that says
    "verified" is judged again from the nodes' words: it deletes nothing (Unverified) and
    says the PV is not the claim's."""
    seed(emu)
    seed_unrelated(emu)
    r = reconciler
    await api.create(r.client, MOVES.from_dict(manifest("topolvm.io", NS, "data-web-0", "n2")))
    await r.reconcile(KEY)
    await r.reconcile(KEY)
    made = (await _move(r, "data-web-0")).made_name
    other = emu.get("persistentvolumeclaims", "data-db-0", NS)
    assert other is not None
    extra: dict[str, Any] = {"conditions": VERIFIED} if phase == "verified" else {}
    _status(emu, phase=MovePhase.VERIFYING if phase == "verified" else phase,
            sourceVolume="pv-9", targetVolume="pv-9", oldVolumeName="pv-9",
            newVolumeName="pv-9", claimUID=other["metadata"]["uid"], podUID="gone",
            reclaimPolicy="Retain", **extra)  # fmt: skip
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    if phase == MovePhase.ROLLING_BACK:
        assert vm.status.phase == MovePhase.ROLLED_BACK, vm.status
        assert emu.get(LVS, made, group="topolvm.io") is None  # its own target: gone
    elif phase == MovePhase.VERIFYING:
        assert vm.status.phase == MovePhase.UNVERIFIED, vm.status
        assert vm.status.reason == "VerifyFailed" and not vm.status.verified
        assert "PV pv-9 is not claim shop/data-web-0's" in vm.status.message, vm.status
    else:
        assert vm.status.phase == MovePhase.UNVERIFIED, vm.status
        assert "the nodes' digests do not show the copy verified" in vm.status.message
        assert "PV pv-9 is not claim shop/data-web-0's" in vm.status.message, vm.status
    pv9 = emu.get("persistentvolumes", "pv-9")
    assert pv9 is not None and "persistentVolumeReclaimPolicy" not in pv9["spec"]
    for kind, name in (("persistentvolumes", "pv-1"), (LVS, "pv-9"), (LVS, "pv-1")):
        assert emu.get(kind, name, group="topolvm.io" if kind == LVS else None), name


async def test_only_our_finalizer_is_added_and_removed(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    seed(emu)
    r = reconciler
    body = manifest("topolvm.io", NS, "data-web-0", "n2")
    body["metadata"]["finalizers"] = ["example.com/keep"]
    await api.create(r.client, MOVES.from_dict(body))
    await r.reconcile(KEY)
    stored = emu.get("volumemoves", "data-web-0", NS)
    assert stored is not None
    assert stored["metadata"]["finalizers"] == ["example.com/keep", "topolvm.io/volumemove"]
    assert stored["status"]["phase"] == MovePhase.PRE_COPY  # the write after the finalizer's
    _status(emu, phase=MovePhase.REFUSED)
    await api.delete(r.client, MOVES, "data-web-0", namespace=NS)
    await r.reconcile(KEY)
    left = emu.get("volumemoves", "data-web-0", NS)
    assert left is not None and left["metadata"]["finalizers"] == ["example.com/keep"]


async def test_deletes_and_status_writes_carry_their_preconditions(emu: KubeEmulator) -> None:
    seed(emu)
    client = client_for(emu)
    try:
        pv = await api.get(client, PersistentVolume, "pv-1")
        assert pv is not None
        meta = pv["metadata"]
        with pytest.raises(kube.PreconditionFailed):
            await api.delete(client, PersistentVolume, "pv-1", uid="another")
        with pytest.raises(kube.PreconditionFailed):
            await api.delete(client, PersistentVolume, "pv-1", uid=meta["uid"],
                             resource_version=str(int(meta["resourceVersion"]) - 1))  # fmt: skip
        assert not kube.is_transient(kube.PreconditionFailed(409, "Conflict", "x"))
        assert emu.get("persistentvolumes", "pv-1") is not None
        assert await api.delete(client, PersistentVolume, "pv-1", uid=meta["uid"],
                                resource_version=meta["resourceVersion"])  # fmt: skip
        assert emu.get("persistentvolumes", "pv-1") is None
        assert not await api.delete(client, PersistentVolume, "pv-1", uid=meta["uid"])

        await api.create(client, MOVES.from_dict(manifest("topolvm.io", NS, "m")))
        read = await api.get(client, MOVES, "m", namespace=NS)
        assert read is not None
        await api.write_status(client, MOVES, read, {"phase": "PreCopy"})
        with pytest.raises(kube.Conflict):  # the same read again: stale now
            await api.write_status(client, MOVES, read, {"phase": "RollingBack"})
        stored = emu.get("volumemoves", "m", NS)
        assert stored is not None and stored["status"] == {"phase": "PreCopy"}
    finally:
        await client.close()


# -- the group commit: claims of one pod that move together --------------------------------

DATA, LOGS = f"{NS}/data-web-0", f"{NS}/logs-web-0"
ORIGINAL = {"data-web-0": "uid-data-web-0", "logs-web-0": "uid-logs-web-0"}


async def _group_to_swapping(emu: KubeEmulator, r: MoveReconciler) -> None:
    """Pod web-0's two claims (tests/test_move_together.py) planned together, both final
    copies done, the pod gone: both moves in Swapping, neither committed."""
    seed_two(emu)
    for name in TOGETHER:
        together = tuple(c for c in TOGETHER if c != name)
        body = manifest("topolvm.io", NS, name, "n2", together)
        await api.create(r.client, MOVES.from_dict(body))
    for _ in range(2):  # planned, then the targets asked for
        for name in TOGETHER:
            await r.reconcile(f"{NS}/{name}")
    await emu.remove("pods", "web-0", NS)
    for name in TOGETHER:
        vm = await _move(r, name)
        _lv_status(emu, vm.made_name, 2, f"vol-new-{name}")
        _status(emu, name, phase=MovePhase.FINAL_COPY)
    for name in TOGETHER:
        await r.reconcile(f"{NS}/{name}")
        vm = await _move(r, name)
        assert vm.status.phase == MovePhase.SWAPPING and not vm.status.commit_time, vm.status


def _pod_back_on_n1(emu: KubeEmulator) -> None:
    """The pod's controller made it again, without the gate, on the old node."""
    emu.create(pod("web-0", list(TOGETHER), ("StatefulSet", "web"), {"app": "web"}))


def _claims_kept(emu: KubeEmulator) -> bool:
    """Both claims are the originals (never deleted)."""
    for name, uid in ORIGINAL.items():
        pvc = emu.get("persistentvolumeclaims", name, NS)
        if pvc is None or pvc["metadata"]["uid"] != uid:
            return False
    return True


async def test_a_stale_rollback_of_one_claim_loses_to_the_groups_commit(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    """A pass of a stale writer sees the pod back on the old node and decides to roll one claim
    (logs) back; its write waits while the other writer commits the group (commitTime on data,
    then logs) and deletes data's claim. Released, the stale write meets logs' newer version:
    it reads logs committed and goes forward; both claims end on the target."""
    r = reconciler
    await _group_to_swapping(emu, r)
    _pod_back_on_n1(emu)
    async with holding_proxy(emu) as proxy:
        stale = MoveReconciler(api.make_client(server=proxy.url), NORMAL, r.store)
        held = proxy.hold("PUT", "/volumemoves/logs-web-0/status")
        task = asyncio.ensure_future(stale.reconcile(LOGS))
        await asyncio.wait_for(held.arrived.wait(), 10)  # decided RollingBack, not written
        await emu.remove("pods", "web-0", NS)  # the pod went again
        await r.reconcile(DATA)  # the group's commit, then data's old claim deleted
        data, logs = await _move(r, "data-web-0"), await _move(r, "logs-web-0")
        assert data.status.commit_time and logs.status.commit_time == data.status.commit_time
        pvc = emu.get("persistentvolumeclaims", "data-web-0", NS)
        assert pvc is None or pvc["metadata"]["uid"] != ORIGINAL["data-web-0"]
        held.release.set()
        await asyncio.wait_for(task, 10)
        await stale.client.close()
    logs = await _move(r, "logs-web-0")
    assert logs.status.phase == MovePhase.SWAPPING, logs.status
    assert not logs.status.message.startswith(("rolling back", "cannot roll back")), logs.status
    for _ in range(8):  # both claims re-created and bound on the target
        for name, key in (("data-web-0", DATA), ("logs-web-0", LOGS)):
            await r.reconcile(key)
            vm = await _move(r, name)
            pvc = emu.get("persistentvolumeclaims", name, NS)
            if pvc is not None and pvc["spec"].get("volumeName") == vm.made_name:
                _bind(emu, pvc, vm.made_name, "pv-1" if name == "data-web-0" else "pv-2")
    for name in TOGETHER:
        vm = await _move(r, name)
        assert vm.status.phase == MovePhase.STARTING, vm.status


async def test_a_rollback_that_lands_first_aborts_the_commit_and_all_roll_back(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    """The committing writer wrote commitTime on data; before its write on logs lands, another
    writer rolls logs back (the pod came back on the old node). The commit can never be whole:
    its write on logs fails, it decides again and rolls data back too, though data has
    commitTime; no claim was deleted, and both end RolledBack."""
    r = reconciler
    await _group_to_swapping(emu, r)
    async with holding_proxy(emu) as proxy:
        committing = MoveReconciler(api.make_client(server=proxy.url), NORMAL, r.store)
        held = proxy.hold("PUT", "/volumemoves/logs-web-0/status")
        task = asyncio.ensure_future(committing.reconcile(DATA))
        await asyncio.wait_for(held.arrived.wait(), 10)  # data committed, logs not yet
        assert (await _move(r, "data-web-0")).status.commit_time
        _pod_back_on_n1(emu)
        await r.reconcile(LOGS)
        logs = await _move(r, "logs-web-0")
        assert logs.status.phase == MovePhase.ROLLING_BACK and not logs.status.commit_time
        held.release.set()
        await asyncio.wait_for(task, 10)
        await committing.client.close()
    data = await _move(r, "data-web-0")
    assert data.status.phase == MovePhase.ROLLING_BACK, data.status
    assert data.status.commit_time and data.status.reason == "TogetherFailed"
    assert _claims_kept(emu)
    for key in (DATA, LOGS):
        await r.reconcile(key)
    for name in TOGETHER:
        vm = await _move(r, name)
        assert vm.status.phase == MovePhase.ROLLED_BACK, vm.status
        assert emu.get(LVS, vm.made_name, group="topolvm.io") is None
    assert _claims_kept(emu)


async def test_a_done_member_keeps_its_volumemove_while_its_group_moves(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    """A member deleted once done keeps its finalizer until the other member is done too, so
    that no member vanishes while the group decides."""
    r = reconciler
    await _group_to_swapping(emu, r)
    _status(emu, "logs-web-0", phase=MovePhase.ROLLED_BACK, reason="CopyFailed",
            completionTime="2099-01-01T00:00:00Z")  # fmt: skip
    await api.delete(r.client, MOVES, "logs-web-0", namespace=NS)
    await r.reconcile(LOGS)
    assert emu.get("volumemoves", "logs-web-0", NS) is not None  # data is in progress
    await r.reconcile(DATA)  # aborted: rolls back
    await r.reconcile(DATA)
    assert (await _move(r, "data-web-0")).status.phase == MovePhase.ROLLED_BACK
    await r.reconcile(LOGS)
    assert emu.get("volumemoves", "logs-web-0", NS) is None

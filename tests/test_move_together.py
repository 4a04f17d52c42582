"""A pod's node-local claims move together (docs/mobility.md, "Moving a claim"), against the
Kubernetes API emulator: what ``topolvm move`` says and creates for a pod with two TopoLVM
claims, and how topolvm-controller's VolumeMoves of those claims wait for each other and fail
together. The whole move of such a pod, with kubelets and copies, is in
tests/test_cluster_transfer.py."""

# ruff: noqa: F811  (the emulator fixtures, imported, are the tests' parameters)
from __future__ import annotations

import pytest

from tests.kube_emulator import KubeEmulator
from tests.test_controller_moves import MOVES, _move, reconciler  # noqa: F401
from tests.test_ops_move_cli import (  # noqa: F401 (fixtures)
    GIB,
    NS,
    claim,
    emu,
    kubeconfig,
    logical_volume,
    pod,
    run_cli,
    seed,
    volume,
)
from topolvm.constants import NORMAL
from topolvm.controller.moves import MoveReconciler
from topolvm.k8s import api
from topolvm.k8s.moveobject import MovePhase, manifest
from topolvm.move import prepull, reads

TOGETHER = ("data-web-0", "logs-web-0")


def seed_two(emu: KubeEmulator) -> None:
    """:func:`seed`, and pod web-0 also mounts logs-web-0 (2 GiB, on n1 too)."""
    seed(emu)
    for obj in (
        claim("logs-web-0", "pv-2"), volume("pv-2", "logs-web-0", "n1", "vol-2"),
        logical_volume("pv-2", "vol-2", "2Gi"),
        pod("web-0", list(TOGETHER), ("StatefulSet", "web"), {"app": "web"}),
    ):  # fmt: skip
        emu.create(obj)


async def test_dry_run_names_the_claims_that_move_together(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_two(emu)
    code = await run_cli("move", "-n", NS, "pvc/data-web-0", "--dry-run", "--kubeconfig",
                         kubeconfig)  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "together with logs-web-0: pod web-0 uses them too" in out
    assert "data of data-web-0: at most 10.0 GiB" in out
    assert "data of logs-web-0: at most 2.0 GiB" in out
    # both final copies count: 10% of 12 GiB at the measured 200 MiB/s, plus the restart
    assert "final copy of ~1.2 GiB at 200.0 MiB/s" in out
    assert emu.list("volumemoves") == []


async def test_a_move_creates_a_volumemove_per_claim_with_one_target(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_two(emu)
    argv = ["move", "-n", NS, "logs-web-0", "--no-wait", "--kubeconfig", kubeconfig]
    assert await run_cli(*argv) == 0
    out = capsys.readouterr().out
    assert "moving claim shop/logs-web-0 with data-web-0: node n1 → n2 (at most 12.0 GiB)" in out
    for name, other in (("logs-web-0", "data-web-0"), ("data-web-0", "logs-web-0")):
        stored = emu.get("volumemoves", name, NS)
        assert stored is not None
        assert stored["spec"] == {"claim": name, "targetNode": "n2", "together": [other]}


async def test_room_is_needed_for_all_the_claims(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_two(emu)
    argv = ["move", "-n", NS, "data-web-0", "--to", "n4", "--kubeconfig", kubeconfig]
    emu.create(logical_volume("pv-2", "vol-2", "25Gi"))  # n4 has 30 GiB: 10 + 25 do not fit
    assert await run_cli(*argv) == 1
    err = capsys.readouterr().err
    assert "refused (NoRoom): node n4 has 30.0 GiB free in the default device class; the " \
        "volume needs 35.0 GiB" in err  # fmt: skip
    assert emu.list("volumemoves") == []


async def _set_copy(r: MoveReconciler, name: str, phase: str, message: str = "") -> None:
    def mutate(obj: api.Obj) -> bool:
        obj.setdefault("status", {})["copy"] = {"phase": phase, "round": 1, "message": message}
        return True

    await api.modify(r.client, api.logicalvolume_resource(NORMAL), name, mutate, status=True)


async def _set_copy_done(r: MoveReconciler, name: str) -> None:
    await _set_copy(r, name, "Done")


async def _create(r: MoveReconciler, name: str, target: str = "n2") -> None:
    together = tuple(c for c in TOGETHER if c != name)
    await api.create(r.client, MOVES.from_dict(manifest("topolvm.io", NS, name, target, together)))


async def _both_planned(emu: KubeEmulator, r: MoveReconciler) -> MoveReconciler:
    """:func:`seed_two`, and both claims' VolumeMoves created and planned (PreCopy)."""
    seed_two(emu)
    for name in TOGETHER:
        await _create(r, name)
        await r.reconcile(f"{NS}/{name}")
    return r


async def test_claims_moving_together_name_their_target(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    seed_two(emu)
    await _create(reconciler, "data-web-0", target="")
    await reconciler.reconcile(f"{NS}/data-web-0")
    vm = await _move(reconciler, "data-web-0")
    assert vm.status.phase == MovePhase.REFUSED and vm.status.reason == "NoTarget"


async def test_a_claim_left_out_is_refused(emu: KubeEmulator, reconciler: MoveReconciler) -> None:
    seed_two(emu)
    await api.create(reconciler.client, MOVES.from_dict(manifest("topolvm.io", NS, "data-web-0")))
    await reconciler.reconcile(f"{NS}/data-web-0")
    vm = await _move(reconciler, "data-web-0")
    assert vm.status.phase == MovePhase.REFUSED and vm.status.reason == "OtherLocalClaims"
    assert "pod web-0 also uses logs-web-0" in vm.status.message


async def test_the_pod_stops_only_once_every_pre_copy_is_done(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    seed_two(emu)
    r = reconciler
    await _create(r, "data-web-0")
    await r.reconcile(f"{NS}/data-web-0")  # planned
    await r.reconcile(f"{NS}/data-web-0")  # its target asked for
    data = await _move(r, "data-web-0")
    await _set_copy_done(r, data.status.target_volume)
    await r.reconcile(f"{NS}/data-web-0")
    data = await _move(r, "data-web-0")
    assert data.status.phase == MovePhase.PRE_COPY
    assert data.status.message == (
        "waiting for the VolumeMove of claim logs-web-0, which moves with this one"
    )
    await _create(r, "logs-web-0")
    for _ in range(2):
        await r.reconcile(f"{NS}/logs-web-0")
    await r.reconcile(f"{NS}/data-web-0")
    data = await _move(r, "data-web-0")
    assert data.status.phase == MovePhase.PRE_COPY
    assert data.status.message == "pre-copy done; waiting for claim logs-web-0's (phase PreCopy)"
    assert emu.get("pods", "web-0", NS) is not None  # the pod runs on
    logs = await _move(r, "logs-web-0")
    # one pre-pull pod for the pod, made by the move of its first claim; the other move took
    # that pull's outcome
    pulls = [p["metadata"]["name"] for p in emu.list("pods")
             if p["metadata"]["name"].startswith("topolvm-prepull-")]  # fmt: skip
    assert pulls == [prepull.pod_name(data.uid)], pulls
    assert logs.status.condition(prepull.ImagesPulled.TYPE) == data.status.condition(
        prepull.ImagesPulled.TYPE
    )
    assert logs.status.condition(prepull.ImagesPulled.TYPE) is not None
    await _set_copy_done(r, logs.status.target_volume)
    await r.reconcile(f"{NS}/data-web-0")  # every pre-copy and the pull done: it stops
    assert (await _move(r, "data-web-0")).status.phase == MovePhase.STOPPING
    await r.reconcile(f"{NS}/logs-web-0")
    assert (await _move(r, "logs-web-0")).status.phase == MovePhase.STOPPING


async def test_one_claims_failure_rolls_the_others_back(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    r = await _both_planned(emu, reconciler)
    assert (await _move(r, "data-web-0")).status.phase == MovePhase.PRE_COPY
    logs = emu.get("volumemoves", "logs-web-0", NS)
    assert logs is not None
    logs["status"] = {**logs["status"], "phase": "RolledBack", "reason": "CopyFailed",
                      "message": "rolled back: the copy to node n2 failed: disk"}  # fmt: skip
    emu.create(logs)
    await r.reconcile(f"{NS}/data-web-0")
    data = await _move(r, "data-web-0")
    assert data.status.phase == MovePhase.ROLLING_BACK and data.status.reason == "TogetherFailed"
    assert "the move of claim logs-web-0, which moves with this one, is RolledBack" in (
        data.status.message
    )
    await r.reconcile(f"{NS}/data-web-0")
    assert (await _move(r, "data-web-0")).status.phase == MovePhase.ROLLED_BACK


async def test_after_a_swap_the_others_only_go_forward(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    r = await _both_planned(emu, reconciler)
    logs = emu.get("volumemoves", "logs-web-0", NS)
    assert logs is not None
    logs["status"] = {**logs["status"], "phase": "Swapping"}
    emu.create(logs)
    await api.delete(r.client, reads.POD, "web-0", namespace=NS)  # stopped by the group
    await r.reconcile(f"{NS}/data-web-0")
    assert (await _move(r, "data-web-0")).status.phase == MovePhase.PRE_COPY  # no rollback
    await api.delete(r.client, MOVES, "data-web-0", namespace=NS)  # a cancel, too late:
    await r.reconcile(f"{NS}/data-web-0")  # ignored, the move goes on
    data = await _move(r, "data-web-0")
    assert data.status.phase == MovePhase.PRE_COPY
    assert not data.status.message.startswith(("rolling back", "cannot roll back"))
    # a failure now cannot roll back: the move says so, and waits
    await _set_copy(r, data.status.target_volume, "Failed", message="disk gone")
    await r.reconcile(f"{NS}/data-web-0")
    data = await _move(r, "data-web-0")
    assert data.status.phase == MovePhase.PRE_COPY
    assert data.status.message == (
        "cannot roll back (the copy to node n2 failed: disk gone): logs-web-0, moved with "
        "this claim, swapped already; the move goes on once that is mended"
    )


async def test_a_companion_deleted_once_seen_rolls_the_move_back(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    r = await _both_planned(emu, reconciler)
    await r.reconcile(f"{NS}/data-web-0")
    assert (await _move(r, "data-web-0")).status.together_seen == "logs-web-0"
    emu.remove_now("volumemoves", "logs-web-0", NS)  # gone, finalizer and all
    await r.reconcile(f"{NS}/data-web-0")
    data = await _move(r, "data-web-0")
    assert data.status.phase == MovePhase.ROLLING_BACK and data.status.reason == "TogetherGone"


async def test_a_companion_never_created_rolls_the_move_back_after_a_while(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    seed_two(emu)
    r = reconciler
    body = manifest("topolvm.io", NS, "data-web-0", "n2", ("logs-web-0",))
    body["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"  # long ago
    emu.create(body)
    await r.reconcile(f"{NS}/data-web-0")  # planned
    await r.reconcile(f"{NS}/data-web-0")
    data = await _move(r, "data-web-0")
    assert data.status.phase == MovePhase.ROLLING_BACK
    assert data.status.reason == "TogetherMissing"
    assert "no VolumeMove of claim logs-web-0" in data.status.message


async def test_an_earlier_moves_finished_companion_is_not_this_ones(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    seed_two(emu)
    r = reconciler
    old = manifest("topolvm.io", NS, "logs-web-0", "n4", ("data-web-0",))
    old["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    old["status"] = {"phase": "RolledBack", "reason": "CopyFailed"}
    emu.create(old)
    await _create(r, "data-web-0")
    await r.reconcile(f"{NS}/data-web-0")
    data = await _move(r, "data-web-0")
    assert data.status.phase == MovePhase.PRE_COPY, data.status  # not refused for the old one
    assert data.status.together_seen == ""


async def test_moving_the_claims_again_replaces_both_finished_moves(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_two(emu)
    for name in TOGETHER:
        earlier = manifest("topolvm.io", NS, name, "n4", tuple(c for c in TOGETHER if c != name))
        earlier["status"] = {"phase": "RolledBack"}
        emu.create(earlier)
    argv = ["move", "-n", NS, "data-web-0", "--no-wait", "--kubeconfig", kubeconfig]
    assert await run_cli(*argv) == 0, capsys.readouterr().err
    for name in TOGETHER:
        stored = emu.get("volumemoves", name, NS)
        assert stored is not None and stored["spec"]["targetNode"] == "n2"
        assert not stored.get("status")  # new ones

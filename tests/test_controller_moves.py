"""topolvm-controller's VolumeMove reconciler against the Kubernetes API emulator: the first
steps of a move (checks, the old PV kept, the target volume asked for), a refusal, and the
Events each step posts. The whole move, with pods, kubelets and copies, is
tests/test_cluster_transfer.py."""

# ruff: noqa: F811  (the emulator fixture, imported, is every test's parameter)
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from lightkube.resources.core_v1 import Event, PersistentVolume

from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import write_kubeconfig
from tests.test_ops_move_cli import NS, emu, seed  # noqa: F401 (the emulator fixture)
from topolvm.constants import NORMAL
from topolvm.controller.moves import MoveReconciler
from topolvm.k8s import api
from topolvm.k8s.lvobject import LogicalVolumeObject
from topolvm.k8s.lvstore import LogicalVolumeStore
from topolvm.k8s.moveobject import MovePhase, VolumeMoveObject, manifest
from topolvm.k8s.runtime import Informer

MOVES = api.volumemove_resource(NORMAL)


@pytest.fixture
async def reconciler(
    emu: KubeEmulator,
    tmp_path: Path,
) -> AsyncIterator[MoveReconciler]:
    emu.register("", "v1", "events", "Event", True, True)
    client = api.make_client(str(write_kubeconfig(tmp_path / "kubeconfig", emu.url)))
    informer = Informer(client, api.logicalvolume_resource(NORMAL))
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(informer.synced.wait(), 10)
    try:
        yield MoveReconciler(client, NORMAL, LogicalVolumeStore(client, NORMAL, informer))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


async def _move(r: MoveReconciler, claim: str) -> VolumeMoveObject:
    obj = await api.get(r.client, MOVES, claim, namespace=NS)
    assert obj is not None
    return VolumeMoveObject.from_dict(obj)


async def _reasons(r: MoveReconciler, kind: str) -> list[str]:
    items, _ = await api.list_all(r.client, Event, namespace=NS)
    return [e["reason"] for e in items if e["involvedObject"]["kind"] == kind]


async def test_a_move_plans_keeps_the_old_volume_and_asks_for_the_target(
    emu: KubeEmulator,
    reconciler: MoveReconciler,
) -> None:
    seed(emu)
    r = reconciler
    await api.create(r.client, MOVES.from_dict(manifest("topolvm.io", NS, "data-web-0", "n2")))
    await r.reconcile(f"{NS}/data-web-0")
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.PRE_COPY, vm.status
    assert (vm.status.source_node, vm.status.target_node) == ("n1", "n2")
    assert vm.status.pod == "web-0" and vm.status.owner == "StatefulSet/web"
    assert vm.status.reclaim_policy == "Delete"  # kept before the PV changes
    assert "MovePreCopy" in await _reasons(r, "PersistentVolumeClaim")
    assert "MovePreCopy" in await _reasons(r, "VolumeMove")

    await r.reconcile(f"{NS}/data-web-0")  # the pre-copy: the old PV kept, the target asked for
    pv = await api.get(r.client, PersistentVolume, "pv-1")
    assert pv is not None and pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    raw = await api.get(r.client, api.logicalvolume_resource(NORMAL), vm.status.target_volume)
    assert raw is not None
    target = LogicalVolumeObject.from_dict(raw)
    assert target.node_name == "n2" and target.copy_source == "pv-1"
    assert target.copy_keep_cut and target.copy_round == 1


async def test_a_move_of_a_claim_without_a_volume_is_refused_and_changes_nothing(
    emu: KubeEmulator,
    reconciler: MoveReconciler,
) -> None:
    seed(emu)
    r = reconciler
    await api.create(r.client, MOVES.from_dict(manifest("topolvm.io", NS, "nothing")))
    await r.reconcile(f"{NS}/nothing")
    vm = await _move(r, "nothing")
    assert vm.status.phase == MovePhase.REFUSED and vm.status.reason == "ClaimNotFound"
    assert vm.status.message == "claim nothing does not exist"
    assert "MoveRefused" in await _reasons(r, "VolumeMove")
    pv = await api.get(r.client, PersistentVolume, "pv-1")
    assert pv is not None and pv["spec"].get("persistentVolumeReclaimPolicy") != "Retain"


async def test_a_move_not_named_after_its_claim_is_refused(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    seed(emu)
    r = reconciler
    body = manifest("topolvm.io", NS, "data-web-0")
    body["metadata"]["name"] = "my-move"
    await api.create(r.client, MOVES.from_dict(body))
    await r.reconcile(f"{NS}/my-move")
    vm = await _move(r, "my-move")
    assert vm.status.phase == MovePhase.REFUSED and vm.status.reason == "NameNotClaim"
    assert "name it 'data-web-0'" in vm.status.message

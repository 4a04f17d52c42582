"""A move pulls its pod's images on the target node during the pre-copy (docs/mobility.md,
"The pod's images are pulled before it stops"), against the Kubernetes API emulator, whose
``on_create`` hook plays the target's kubelet: the pod stops only once the pull is over, the
``ImagesPulled`` condition and an Event say how it went before ``MoveStopping``, and the pre-pull
pod is gone once the pod stops or the move rolls back. A pull that fails, that does not end in
time, or whose pod cannot be made never holds or fails the move."""

# ruff: noqa: F811  (the emulator fixtures, imported, are the tests' parameters)
from __future__ import annotations

from typing import Any

from lightkube.resources.core_v1 import Event, Node, Pod

from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import pulled_at_once
from tests.test_controller_moves import MOVES, _move, reconciler  # noqa: F401 (fixtures)
from tests.test_move_together import _set_copy_done
from tests.test_ops_move_cli import NS, emu, seed  # noqa: F401 (the emulator fixture)
from topolvm.controller.moves import MoveReconciler
from topolvm.k8s import api
from topolvm.k8s.moveobject import MovePhase, VolumeMoveObject, manifest
from topolvm.move import prepull

KEY = f"{NS}/data-web-0"
IP = prepull.ImagesPulled


async def _precopied(emu: KubeEmulator, r: MoveReconciler) -> VolumeMoveObject:
    """The move of data-web-0 to n2 planned, its pre-copy asked for and done."""
    seed(emu)
    await api.create(r.client, MOVES.from_dict(manifest("topolvm.io", NS, "data-web-0", "n2")))
    await r.reconcile(KEY)  # planned
    await r.reconcile(KEY)  # the target asked for, the pre-pull pod made
    vm = await _move(r, "data-web-0")
    await _set_copy_done(r, vm.status.target_volume)
    return vm


def _puller(emu: KubeEmulator, vm: VolumeMoveObject) -> dict[str, Any] | None:
    return emu.get("pods", prepull.pod_name(vm.uid), NS)


async def _events(r: MoveReconciler) -> list[tuple[str, str, str]]:
    """The VolumeMove's Events, in the order they were posted."""
    items, _ = await api.list_all(r.client, Event, namespace=NS)
    items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["reason"], e["type"], e["message"]) for e in items
            if e["involvedObject"]["kind"] == "VolumeMove"]  # fmt: skip


async def test_the_pod_stops_once_its_images_are_on_the_target(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    r = reconciler
    vm = await _precopied(emu, r)
    puller = _puller(emu, vm)
    assert puller is not None and puller["spec"]["nodeName"] == "n2"
    workload = emu.get("pods", "web-0", NS)
    assert workload is not None
    images = {c["image"] for c in workload["spec"]["containers"]}
    assert {c["image"] for c in puller["spec"]["containers"]} == images
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.STOPPING, vm.status
    pulled = vm.status.condition(IP.TYPE)
    assert pulled is not None and (pulled.status, pulled.reason) == ("True", IP.PULLED)
    assert "images on node n2: pulled" in vm.status.message
    reasons = [reason for reason, _, _ in await _events(r)]
    assert reasons.index("ImagesPulled") < reasons.index("MoveStopping")
    await r.reconcile(KEY)  # Stopping: the pre-pull pod's work is done
    assert _puller(emu, vm) is None


async def test_a_pull_still_running_holds_the_stop_a_failed_one_does_not(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    r = reconciler
    emu.on_create.remove(pulled_at_once)  # the kubelet has not reported yet
    vm = await _precopied(emu, r)
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.PRE_COPY
    assert vm.status.message.startswith("pre-copy done; pulling the pod's images on node n2")
    assert emu.get("pods", "web-0", NS) is not None  # the workload runs meanwhile
    puller = _puller(emu, vm)
    assert puller is not None
    puller["status"] = {"phase": "Pending", "containerStatuses": [
        {"name": "pull-0", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
         "state": {"waiting": {"reason": "ErrImagePull", "message": "registry refused"}}},
    ]}  # fmt: skip
    emu.create(puller)
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    assert vm.status.phase == MovePhase.STOPPING
    pulled = vm.status.condition(IP.TYPE)
    assert pulled is not None and (pulled.status, pulled.reason) == ("False", IP.FAILED)
    assert "registry refused" in pulled.message
    assert ("ImagesNotPulled", "Warning") in [(a, b) for a, b, _ in await _events(r)]


async def test_a_pull_that_does_not_end_in_time_lets_the_move_go_on(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    r = reconciler
    emu.on_create.remove(pulled_at_once)
    r.prepull.timeout = -1.0  # any pull is too old
    await _precopied(emu, r)
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    pulled = vm.status.condition(IP.TYPE)
    assert vm.status.phase == MovePhase.STOPPING
    assert pulled is not None and pulled.reason == IP.TIMED_OUT


async def test_a_pre_pull_pod_that_cannot_be_made_is_skipped(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    r = reconciler
    seed(emu)
    await api.create(r.client, MOVES.from_dict(manifest("topolvm.io", NS, "data-web-0", "n2")))
    await r.reconcile(KEY)
    emu.inject("POST", "pods", code=403, reason="Forbidden",
               message='pods "topolvm-prepull" is forbidden: exceeded quota')  # fmt: skip
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    pulled = vm.status.condition(IP.TYPE)
    assert pulled is not None and pulled.reason == IP.SKIPPED and "exceeded quota" in pulled.message
    await _set_copy_done(r, vm.status.target_volume)
    await r.reconcile(KEY)
    assert (await _move(r, "data-web-0")).status.phase == MovePhase.STOPPING


async def test_a_rollback_removes_the_pre_pull_pod(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    r = reconciler
    emu.on_create.remove(pulled_at_once)
    vm = await _precopied(emu, r)
    assert _puller(emu, vm) is not None
    stored = emu.get("volumemoves", "data-web-0", NS)
    assert stored is not None
    stored["status"] |= {"phase": MovePhase.ROLLING_BACK, "reason": "CopyFailed"}
    emu.create(stored)
    await r.reconcile(KEY)
    assert (await _move(r, "data-web-0")).status.phase == MovePhase.ROLLED_BACK
    assert _puller(emu, vm) is None


async def test_a_pod_of_that_name_the_move_did_not_make_is_not_trusted(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    """Someone made a pod under the pre-pull pod's name (the move's UID is no secret): its
    status says nothing of the target, so the pull counts as skipped, and it is not deleted."""
    r = reconciler
    seed(emu)
    await api.create(r.client, MOVES.from_dict(manifest("topolvm.io", NS, "data-web-0", "n2")))
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    fake = prepull.prepull_pod({"metadata": {"namespace": NS}, "spec": {"containers": [
        {"image": "x"}]}}, "n1", prepull.pod_name(vm.uid), {})  # fmt: skip
    emu.create(fake)
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    pulled = vm.status.condition(IP.TYPE)
    assert pulled is not None and pulled.reason == IP.SKIPPED and "did not make" in pulled.message
    await r.reconcile(KEY)
    assert _puller(emu, vm) is not None  # not ours to delete


async def test_a_move_to_a_node_its_pod_may_not_run_on_is_refused(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    r = reconciler
    seed(emu)
    n2 = emu.get("nodes", "n2")
    assert n2 is not None
    n2["spec"]["taints"] = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]
    emu.create(n2)
    await api.create(r.client, MOVES.from_dict(manifest("topolvm.io", NS, "data-web-0", "n2")))
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    assert (vm.status.phase, vm.status.reason) == (MovePhase.REFUSED, "PodNotAllowed")
    assert "taint dedicated=gpu:NoSchedule" in vm.status.message


async def test_a_pull_over_in_time_counts_even_when_read_late(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    """The pull ended within its time, and the controller reads it only later (it was down):
    the images are pulled, not timed out."""
    r = reconciler
    await _precopied(emu, r)  # the pre-pull pod made; the kubelet pulled at once
    r.prepull.timeout = -1.0  # the move's start is long ago now
    await r.reconcile(KEY)
    vm = await _move(r, "data-web-0")
    pulled = vm.status.condition(IP.TYPE)
    assert pulled is not None and pulled.reason == IP.PULLED, pulled


async def test_images_the_target_already_lists_are_not_pulled_again(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    r = reconciler
    seed(emu)
    workload = emu.get("pods", "web-0", NS)
    n2 = emu.get("nodes", "n2")
    assert workload is not None and n2 is not None
    # pulled if not present (the seed's ":latest" is pulled at every start: it is pre-pulled)
    containers = [{**c, "imagePullPolicy": "IfNotPresent"} for c in workload["spec"]["containers"]]
    await api.patch_merge(r.client, Pod, "web-0", {"spec": {"containers": containers}},
                          namespace=NS)  # fmt: skip
    # the kubelet lists images by their full names: the workload's short ones must match them
    held = [{"names": [prepull.reference(c["image"]), "sha256:1"], "sizeBytes": 1}
            for c in containers]  # fmt: skip
    await api.write_status(r.client, Node, n2, {**n2.get("status", {}), "images": held})
    await api.create(r.client, MOVES.from_dict(manifest("topolvm.io", NS, "data-web-0", "n2")))
    await r.reconcile(KEY)  # planned
    await r.reconcile(KEY)  # the target asked for; nothing to pull
    vm = await _move(r, "data-web-0")
    assert _puller(emu, vm) is None
    pulled = vm.status.condition(IP.TYPE)
    assert pulled is not None and (pulled.status, pulled.reason) == ("True", IP.PRESENT), pulled
    await _set_copy_done(r, vm.status.target_volume)
    await r.reconcile(KEY)
    assert (await _move(r, "data-web-0")).status.phase == MovePhase.STOPPING

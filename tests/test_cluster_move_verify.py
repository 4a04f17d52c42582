"""A moved volume verified whole before its old volume goes (docs/mobility.md, "Verified before
the source goes"), on real nodes: a block of the target flipped on purpose after the final copy
(topolvm-controller paused with SIGSTOP meanwhile, so that nothing else moves) makes both nodes'
digests differ; the move ends Unverified (its pod runs on the target), the old PV and LV are
kept, the claim's Events, ``topolvm move`` and ``topolvm doctor`` say so and how to get out.
The same against the API emulator, the test playing the nodes:
tests/test_controller_move_verify.py."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume, Pod

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.umlnode import UmlNode
from tests.doctor_helpers import about, doctor
from tests.helpers import eventually
from tests.leader_helpers import controller_of, freeze
from tests.lvm_fixtures import THICK, THIN
from tests.move_helpers import move_done
from tests.move_writer_helpers import writer
from tests.provisioning import NS, Scenario, events_for, shared_nodes
from topolvm.k8s import api
from topolvm.k8s.lvobject import CopyPhase, LogicalVolumeObject
from topolvm.k8s.moveobject import MovePhase, VolumeMoveObject

pytestmark = pytest.mark.cluster

FLIP = 4096  # bytes written on the target, this far before the end of what the copy covered


def _pool(node: UmlNode) -> None:
    node.lvm("lvcreate", "-T", "vg1/pool0", "-L", "3g")


@pytest.fixture(scope="module")
def two_nodes(
    control_plane: ControlPlane, driver: DriverStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[UmlNode]]:
    with shared_nodes(control_plane, tmp_path_factory.mktemp("mvv"), "mvv", [8, 8],
                      [THICK, THIN], prepare=_pool) as nodes:  # fmt: skip
        yield nodes


@pytest.fixture
async def pair(
    control_plane: ControlPlane, two_nodes: list[UmlNode], cluster_client: AsyncClient
) -> AsyncIterator[Scenario]:
    s = Scenario(control_plane, cluster_client, two_nodes)
    await s.record()
    try:
        yield s
    finally:
        await s.clean()


async def _move(client: AsyncClient, claim: str) -> VolumeMoveObject | None:
    obj = await api.get(client, api.volumemove_resource(), claim, namespace=NS)
    return None if obj is None else VolumeMoveObject.from_dict(obj)


async def _lv(s: Scenario, name: str) -> LogicalVolumeObject | None:
    obj = await api.get(s.client, api.logicalvolume_resource(s.names), name)
    return None if obj is None else LogicalVolumeObject.from_dict(obj)


async def _flip_after_final_copy(
    s: Scenario, driver: DriverStack, claim: str, pod: str, pod_uid: str, target: UmlNode
) -> VolumeMoveObject:
    """Pause topolvm-controller once the move stops the pod (its pod being deleted) or has
    asked for the final round; ask for that round as it would; once the target's node reports
    it done, flip a block of the target; continue the controller. The move as it was then."""
    controller = controller_of(driver)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 300

    async def stopping() -> VolumeMoveObject | None:
        vm = await _move(s.client, claim)
        if vm is None or vm.status.phase not in (MovePhase.STOPPING, MovePhase.FINAL_COPY):
            assert vm is None or vm.status.phase in MovePhase.ORDER[:2], vm.status
            return None
        lv = await _lv(s, vm.made_name)
        if lv is not None and lv.copy_round == 2:
            return vm
        obj = await api.get(s.client, Pod, pod, namespace=NS)
        deleting = obj is None or obj["metadata"].get("uid") != pod_uid or bool(
            obj["metadata"].get("deletionTimestamp"))  # fmt: skip
        return vm if deleting else None

    while (vm := await stopping()) is None:
        assert loop.time() < deadline, "the move did not stop its pod"
        await asyncio.sleep(0.05)
    freeze(controller, True)
    try:
        res = api.logicalvolume_resource(s.names)
        await api.patch_merge(s.client, res, vm.made_name, {"spec": {"copy": {"round": 2}}})

        async def final_done() -> LogicalVolumeObject | None:
            lv = await _lv(s, vm.made_name)
            return lv if lv is not None and lv.copy_done and lv.copy_round == 2 else None

        made = await eventually("the final copy done", final_done, timeout=180)
        assert made.verify is None and not made.verify_id, "too late: the target is cut already"
        assert made.copy is not None and made.copy.phase == CopyPhase.DONE
        end = made.copy.total_bytes
        dev = f"/dev/vg1/{made.volume_id}"
        flip = (f"head -c {FLIP} /dev/urandom | dd of={dev} bs={FLIP} seek={end // FLIP - 1} "
                "oflag=direct 2>/dev/null")  # fmt: skip
        await target.aexec("sh", "-c", flip)
    finally:
        freeze(controller, False)
    return vm


async def test_a_block_flipped_on_the_target_after_the_final_copy_keeps_the_source(
    pair: Scenario, driver: DriverStack
) -> None:
    s = pair
    async with writer(s) as w:
        target = next(n for n in s.nodes if n.name == w.target)
        source = next(n for n in s.nodes if n.name == w.source)
        first = await api.get(s.client, Pod, w.pod, namespace=NS)
        assert first is not None
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "topolvm", "move", "-n", NS, f"pvc/{w.claim}",
            f"--to={w.target}", f"--kubeconfig={s.cp.kubeconfig}", "--timeout=10m",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        old_pv = old_lv = ""
        try:
            await _flip_after_final_copy(s, driver, w.claim, w.pod, first["metadata"]["uid"],
                                         target)  # fmt: skip
            out = (await proc.communicate())[0].decode()
            print(out)
            vm = await move_done(s.client, w.claim)
            old_pv, old_lv = vm.status.old_pv, vm.status.source_volume
            assert proc.returncode == 1, out
            assert f"move of claim {NS}/{w.claim} not verified (DigestMismatch)" in out, out
            assert vm.status.phase == MovePhase.UNVERIFIED, vm.status
            assert vm.status.reason == "DigestMismatch" and not vm.status.verified
            cond = vm.status.condition("Verified")
            assert cond is not None and cond.status == "False", vm.status
            assert vm.status.source_digest and vm.status.target_digest
            assert vm.status.source_digest != vm.status.target_digest
            # it went forward: the pod runs on the target (the downtime did not wait for it)
            await s.running(w.pod)
            moved = await api.get(s.client, Pod, w.pod, namespace=NS)
            assert moved is not None and moved["spec"]["nodeName"] == w.target
            # the old volume is kept: its PV (Retain), its LogicalVolume, its LV on the node
            pv = await api.get(s.client, PersistentVolume, old_pv)
            assert pv is not None and pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
            lv = await _lv(s, old_lv)
            assert lv is not None and not lv.deleting and lv.node_name == w.source
            source.exec("test", "-b", f"/dev/vg1/{lv.volume_id}")
            said = await events_for(s.client, "PersistentVolumeClaim", w.claim)
            assert any(e.startswith("MoveUnverified: ") for e in said), said
            _, doc = await doctor(s.cp, "-n", NS)
            [finding] = about(doc, "volume-move", w.claim)
            assert finding["severity"] == "error", finding
            assert finding["title"] == (
                f"move of claim {NS}/{w.claim} from node {w.source} to node {w.target} is not "
                f"verified (DigestMismatch): the old volume {old_pv} is kept"
            ), finding
            assert vm.status.source_digest in finding["cause"], finding
            back, keep = finding["fixes"]
            assert back["summary"].startswith(f"To go back to the old data (node {w.source}")
            assert f"kubectl delete pv {old_pv}" in keep["commands"], keep
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            # the way out that keeps the moved data (doctor's second fix): the old volume goes
            if old_pv:
                s.cp.kubectl("delete", "pv", old_pv, "--wait=false", check=False)
            if old_lv:
                s.cp.kubectl("delete", f"logicalvolumes.{s.names.group}", old_lv,
                             "--wait=false", check=False)  # fmt: skip

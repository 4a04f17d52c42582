"""Data that leaves its node (docs/mobility.md), end to end: pods on real kubelets write random
bytes and a filesystem tree on node A; restores and clones on node B read them back identically,
from thin and thick snapshots and volumes; a snapshot kept on node C by its class outlives node A
(powered off, its Node deleted). The copies run between the nodes' topolvm-node processes over
their TLS transfer ports, authenticated with the nodes' ServiceAccount tokens."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, Pod

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import record_line, unique
from tests.doctor_helpers import about, doctor
from tests.helpers import eventually
from tests.lvm_fixtures import THICK, THIN
from tests.move_helpers import (
    at_phases,
    budget,
    delete_move,
    lvs_accounted,
    move_done,
    move_webhook,
    moves_now,
    start_move,
    writer_set,
)
from tests.move_writer_helpers import (
    answers,
    fresh_image,
    lines_on,
    move_of,
    move_timeline,
    node_ready,
    pulled_before_the_stop,
    refused,
    restart_seconds,
    writer,
)
from tests.provisioning import NS, GiB, Scenario, claim, events_for, pod, pvc, shared_nodes
from tests.transfer_helpers import (
    MiB,
    from_snapshot,
    logical_volume_of,
    metric,
    on_node,
    read_sums,
    ready_snapshot,
    snapshot,
    snapshot_class,
    snapshotted,
    write_data,
)
from topolvm.k8s import api
from topolvm.k8s.lvobject import CopyPhase
from topolvm.k8s.moveobject import MovePhase

pytestmark = pytest.mark.cluster


MOVE_STEPS = MovePhase.ORDER[1:-1]  # PreCopy ... Verifying: between Pending and Succeeded


def _pool(node: UmlNode) -> None:
    node.lvm("lvcreate", "-T", "vg1/pool0", "-L", "3g")


@pytest.fixture(scope="module")
def abc_nodes(
    control_plane: ControlPlane, driver: DriverStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[UmlNode]]:
    # every node compresses what it sends: the copies and moves here travel as ZDATA where
    # their data compresses (a filesystem's metadata), as DATA where it does not (random bytes)
    with shared_nodes(control_plane, tmp_path_factory.mktemp("xfer"), "xfer", [8, 8, 8],
                      [THICK, THIN], prepare=_pool,
                      extra=("--transfer-compression=zstd",)) as nodes:  # fmt: skip
        yield nodes


@pytest.fixture
async def abc(
    control_plane: ControlPlane, abc_nodes: list[UmlNode], cluster_client: AsyncClient
) -> AsyncIterator[Scenario]:
    s = Scenario(control_plane, cluster_client, abc_nodes)
    await s.record()
    try:
        yield s
    finally:
        await s.clean()


async def test_a_thin_snapshot_restores_on_another_node_sending_only_its_blocks(
    abc: Scenario,
) -> None:
    s = abc
    a, b, _ = s.nodes
    thin = s.sc(device_class="thin", fs_type="xfs")
    # about 10% of the volume written
    got = await snapshotted(s, thin, a.name, "1Gi", mib=96)
    src, sums, snap, ready = got.claim, got.sums, got.snapshot, got.ready
    bound_to = ready["status"]["boundVolumeSnapshotContentName"]
    content = s.cp.kubectl("get", "volumesnapshotcontent", bound_to, "-o", "json")
    assert "nodeAffinity" not in content  # KEP-5943: nothing confines its restores to node A

    sent_before = metric(a, "topolvm_transfer_data_bytes_total", role="sender")
    restored, reader = unique("restored"), unique("reader")
    s.apply(claim(restored, thin, "1Gi", source=from_snapshot(snap)),
            on_node(reader, s.group, b.name, [restored]))  # fmt: skip
    [published] = await s.running(reader, timeout=300)
    assert read_sums(s, reader, restored).replace(restored, src) == sums
    target = await logical_volume_of(s, published.volume_id)
    assert target.node_name == b.name and target.copy is not None
    assert target.copy.phase == CopyPhase.DONE and target.copy.source_node == a.name
    sent = metric(a, "topolvm_transfer_data_bytes_total", role="sender") - sent_before
    # the mapped blocks: the data written, the filesystem's metadata and log; not the GiB
    assert 96 * MiB <= sent <= 0.2 * GiB, sent
    assert target.copy.transferred_bytes == sent
    # compressed where it shrinks (the filesystem's metadata), the random data as it is
    assert 96 * MiB <= target.copy.wire_bytes < sent, (target.copy.wire_bytes, sent)
    # the CPU a GiB cost on each side (status.copy), a figure a node of this release reports
    assert target.copy.sender_cpu_ms_per_gib > 0 and target.copy.receiver_cpu_ms_per_gib > 0
    await lvs_accounted(s, "the restore")


async def test_a_restore_free_to_run_anywhere_stays_on_its_snapshots_node(abc: Scenario) -> None:
    """(docs/mobility.md, "A restore stays local when it can") With the pod webhook on, a pod
    free to run on any of the three nodes whose claim is restored from a snapshot on node B
    runs on B, its volume a local snapshot: nothing copied. A pod that must run on C still gets
    its copy; a StorageClass with ``restore-placement: anywhere`` adds no preference."""
    s = abc
    _, b, c = s.nodes
    thin = s.sc(device_class="thin", fs_type="xfs")
    got = await snapshotted(s, thin, b.name, "1Gi", mib=8)
    src, sums, snap = got.claim, got.sums, got.snapshot
    async with move_webhook(s.cp, s.client):
        local, anywhere, pinned = unique("local"), unique("anywhere"), unique("pinned")
        # in a thread: the API server calls the webhook, which this thread's loop serves
        await asyncio.to_thread(s.apply, claim(local, thin, "1Gi", source=from_snapshot(snap)),
                                pod(local, s.group, [local]),
                                claim(pinned, thin, "1Gi", source=from_snapshot(snap)),
                                on_node(pinned, s.group, c.name, [pinned]))  # fmt: skip
        [near] = await s.running(local)
        [far] = await s.running(pinned, timeout=300)
        off = s.sc(device_class="thin", fs_type="xfs",
                   extra={"topolvm.io/restore-placement": "anywhere"})  # fmt: skip
        s.apply(claim(anywhere, off, "1Gi", source=from_snapshot(snap)))
        tried = await api.create(s.client, Pod.from_dict(pod(anywhere, s.group, [anywhere])),
                                 dry_run=True)  # fmt: skip
    placed = await api.get(s.client, Pod, local, namespace=NS)
    assert placed is not None and placed["spec"]["nodeName"] == b.name
    terms = placed["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms[0]["preference"]["matchFields"][0]["values"] == [b.name]
    here = await logical_volume_of(s, near.volume_id)
    assert here.node_name == b.name and here.copy is None and not here.copy_source  # no copy
    there = await logical_volume_of(s, far.volume_id)
    assert there.node_name == c.name and there.copy is not None and there.copy.source_node == b.name
    for reader, restored in ((local, local), (pinned, pinned)):
        assert read_sums(s, reader, restored).replace(restored, src) == sums
    assert "affinity" not in tried["spec"]  # the class turned the preference off


async def test_a_thick_volume_snapshots_and_restores_on_another_node(abc: Scenario) -> None:
    """A thick snapshot is an independent LV (a copy of a short-lived COW cut), not ready
    until the copy is done; the source stays expandable; a restore elsewhere reads it."""
    s = abc
    a, b, _ = s.nodes
    thick = s.sc(device_class="ssd", fs_type="ext4")
    vsc = unique("vsc")
    s.apply(snapshot_class(vsc))
    src, writer = unique("src"), unique("writer")
    s.apply(claim(src, thick, "512Mi"), on_node(writer, s.group, a.name, [src]))
    [source] = await s.running(writer)
    sums = write_data(s, writer, src, mib=48)
    snap = unique("snap")
    s.apply(snapshot(snap, vsc, src))
    ready = await ready_snapshot(s, snap)
    handle = ready["status"]["boundVolumeSnapshotContentName"]
    content = s.cp.kubectl("get", "volumesnapshotcontent", handle, "-o",
                           "jsonpath={.status.snapshotHandle}")  # fmt: skip
    snap_lv = await logical_volume_of(s, content)
    assert snap_lv.node_name == a.name and snap_lv.copy is not None
    assert snap_lv.copy.phase == CopyPhase.DONE
    lvs = a.lvs("vg1")
    assert lvs[snap_lv.volume_id]["origin"] == ""  # independent, not a COW snapshot
    assert not any(k.startswith("cut.") for k in lvs), lvs  # its cut is gone
    # the origin grows (LVM refuses while a COW snapshot of it exists)
    s.cp.kubectl("patch", "pvc", src, "-n", "default", "--type=merge",
                 "-p", '{"spec":{"resources":{"requests":{"storage":"768Mi"}}}}')  # fmt: skip
    await s.expanded(src)
    assert int(a.lvs("vg1")[source.volume_id]["lv_size"]) >= 768 * MiB

    restored, reader = unique("restored"), unique("reader")
    s.apply(claim(restored, thick, "512Mi", source=from_snapshot(snap)),
            on_node(reader, s.group, b.name, [restored]))  # fmt: skip
    [published] = await s.running(reader, timeout=300)
    assert read_sums(s, reader, restored).replace(restored, src) == sums
    target = await logical_volume_of(s, published.volume_id)
    assert target.node_name == b.name and target.copy is not None
    assert target.copy.source_node == a.name
    await lvs_accounted(s, "the thick snapshot's restore")


async def test_thin_and_thick_claims_clone_onto_another_node(abc: Scenario) -> None:
    s = abc
    a, b, _ = s.nodes
    thin = s.sc(device_class="thin", fs_type="xfs")
    thick = s.sc(device_class="ssd", fs_type="xfs")
    sources = {thin: unique("thinsrc"), thick: unique("thicksrc")}
    writer = unique("writer")
    s.apply(*(claim(c, sc, "384Mi") for sc, c in sources.items()),
            on_node(writer, s.group, a.name, list(sources.values())))  # fmt: skip
    await s.running(writer)
    sums = {c: write_data(s, writer, c, mib=32) for c in sources.values()}
    clones = {sc: unique("clone") for sc in sources}
    reader = unique("reader")
    s.apply(*(claim(clones[sc], sc, "384Mi", source={"kind": "PersistentVolumeClaim",
                                                      "name": sources[sc]}) for sc in sources),
            on_node(reader, s.group, b.name, list(clones.values())))  # fmt: skip
    published = await s.running(reader, timeout=300)
    for sc, src in sources.items():
        assert read_sums(s, reader, clones[sc]).replace(clones[sc], src) == sums[src]
    for p in published:
        lv = await logical_volume_of(s, p.volume_id)
        assert lv.node_name == b.name and lv.copy is not None and lv.copy.source_node == a.name
    assert not any(k.startswith("cut.") for k in a.lvs("vg1"))
    await lvs_accounted(s, "the clones")


async def test_doctor_names_the_source_node_a_claim_waits_for(abc: Scenario) -> None:
    """A restore whose source node B cannot reach (its transfer port refused): the claim stays
    Pending, the copy waits and says why, topolvm doctor names node A; healed, it binds."""
    s = abc
    a, b, _ = s.nodes
    thin = s.sc(device_class="thin", fs_type="xfs")
    got = await snapshotted(s, thin, a.name, "512Mi", mib=8)
    src, sums, snap = got.claim, got.sums, got.snapshot
    restored, reader = unique("restored"), unique("reader")
    with refused(b, a):
        s.apply(claim(restored, thin, "512Mi", source=from_snapshot(snap)),
                on_node(reader, s.group, b.name, [restored]))  # fmt: skip

        def state() -> str:
            lvs = s.cp.kubectl("get", "logicalvolumes.topolvm.io", "-o", "yaml", check=False)
            return f"{seen[-1:]}\n{lvs[-3000:]}"

        seen: list[Any] = []

        async def named() -> Any:
            _, doc = await doctor(s.cp, "-n", "default")
            seen.append(doc["findings"])
            found = about(doc, "copy-progress", restored)
            return found[0] if found and "waits for node" in found[0]["title"] else None

        finding = await eventually("doctor names the source node", named, timeout=120,
                                   details=state)  # fmt: skip
        assert finding["title"].endswith(f"its copy waits for node {a.name}")
        assert "refused" in finding["cause"].lower(), finding
        events = await events_for(s.client, "PersistentVolumeClaim", restored)
        assert any(e.startswith("CopyWaiting:") for e in events), events
        assert (await pvc(s.client, restored) or {})["status"]["phase"] == "Pending"
    await s.running(reader, timeout=300)  # the copy goes on once the port answers
    assert read_sums(s, reader, restored).replace(restored, src) == sums
    _, doc = await doctor(s.cp, "-n", "default")
    assert about(doc, "copy-progress", restored) == []
    await lvs_accounted(s, "the restore")


async def test_a_pods_two_claims_move_together_losing_no_write(
    abc: Scenario, driver: DriverStack
) -> None:
    """``topolvm move`` of a StatefulSet pod's claim: its pod also mounts a thick claim, and
    both move, to one node. The pod writes a numbered, synced log without pause through the
    pre-copy; on the target the log holds every line written up to the pod's stop (its last
    line "stop N" too), the files written before the move are intact on both claims, and the
    old volumes are gone. Its image, a fresh tag in a registry, is not on the target node: it is
    pulled there during the pre-copy, before the pod stops (docs/mobility.md)."""
    async with fresh_image(abc) as (registry, image), writer(abc, logs=True, image=image) as w:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "topolvm", "move", "-n", NS, f"pvc/{w.claim}",
            f"--to={w.target}", f"--kubeconfig={abc.cp.kubeconfig}", "--timeout=10m",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out = (await proc.communicate())[0].decode()
        print(out)  # the numbers, for the record
        assert proc.returncode == 0, out
        assert f"moving claim {NS}/{w.claim} with {w.logs}" in out
        assert f"moved claim {NS}/{w.claim} from node {w.source} to node {w.target}" in out
        assert f"moved claim {NS}/{w.logs} from node {w.source} to node {w.target}" in out
        vm = await move_done(abc.client, w.claim)
        assert vm.status.phase == MovePhase.SUCCEEDED, vm.status
        logs = await move_done(abc.client, w.logs)
        assert logs.status.phase == MovePhase.SUCCEEDED, logs.status
        await w.check(vm, logs)
        # the final copy sent what changed since the pre-copy, not the volume again (the pod
        # writes on while its image is pulled on the target, so the delta may outgrow the
        # pre-copy of this young volume, never the volume)
        assert 0 < vm.status.delta_bytes < vm.status.size_bytes // 2, vm.status
        # the thick claim's read only the chunks its first cut's exception table lists
        said = await events_for(abc.client, "PersistentVolumeClaim", w.logs)
        assert any("thick, its changed chunks" in e for e in said), said
        assert vm.status.downtime_seconds > 0
        await pulled_before_the_stop(abc, registry, image, vm)
        # both final cuts were made once the kubelet unmounted the claims, before the final
        # copy asked (docs/mobility.md, "The final cut waits for the source to close")
        [source] = [n for n in abc.nodes if n.name == w.source]
        logged = (await asyncio.to_thread(source.node_log, "topolvm-node", 2000)).splitlines()
        early = [ln for ln in logged if "final cut made once its source closed" in ln]
        assert len(early) == 2, "\n".join(ln for ln in logged if "cut" in ln)

        # for the record: the same pod restarted on its node (docs/mobility.md)
        restart = await restart_seconds(abc, w.pod)
        steps, down = move_timeline(driver.log("topolvm-controller"),
                                    [f"{NS}/{w.claim}", f"{NS}/{w.logs}"])  # fmt: skip
        record_line(f"a move of a pod with a thin and a thick claim: down {down:.1f} s "
                    f"(status.downtimeSeconds {vm.status.downtime_seconds}); a plain restart "
                    f"of that pod on its node: {restart:.1f} s; ratio {down / restart:.2f} "
                    f"(target <= 1.5); steps from the stop: {steps}")  # fmt: skip


async def test_a_move_survives_crashes_at_every_step(abc: Scenario, driver: DriverStack) -> None:
    """topolvm-controller and both nodes' topolvm-node SIGKILLed (and started again) together
    in every step of a move: the move goes on from where it was, and ends with every write in
    place."""
    s = abc
    async with writer(s) as w:
        ends = [n for n in s.nodes if n.name in (w.source, w.target)]

        def kill_all() -> None:
            for n in ends:
                n.signal("topolvm-node", "SIGKILL", wait=10)
            driver.kill_controller()
            for n in ends:
                n.respawn("topolvm-node")
            driver.restart_after_crash()

        await start_move(s.client, w.claim, w.target)
        acted = await at_phases(s.client, w.claim, dict.fromkeys(MOVE_STEPS, kill_all))
        vm = await move_done(s.client, w.claim)
        assert vm.status.phase == MovePhase.SUCCEEDED, (acted, vm.status)
        assert len(acted) >= 4, acted  # the steps seen (one may pass between two polls)
        await w.check(vm)


async def test_a_move_survives_a_power_cut_of_its_target_at_every_step(abc: Scenario) -> None:
    """The target node loses power in every step of the move, once in each (the pre-copy it
    receives, the pod stopping, the final copy, the swap, the pod starting on it, the
    verification): each time it boots again (its kubelet, containerd and topolvm-node with it),
    the move goes on from where it was, and the pod runs on the target with every write."""
    s = abc
    async with writer(s) as w:
        target = next(n for n in s.nodes if n.name == w.target)
        cuts: list[str] = []  # phase: what LVM's activation said after the boot

        def cut_power(phase: str) -> Callable[[], None]:
            def cut() -> None:
                cuts.append(f"{phase}: {target.power_cycle() or 'all LVs active'}")

            return cut

        await start_move(s.client, w.claim, w.target)
        try:
            await at_phases(s.client, w.claim, {p: cut_power(p) for p in MOVE_STEPS}, timeout=600)
        except AssertionError as e:  # what the rebooted node's kubelet says of the pod
            described = s.cp.kubectl("describe", "pod", w.pod, "-n", NS, check=False)
            kubelet = target.daemon("kubelet", lines=15)
            dmesg = target.exec("dmesg", check=False).stdout[-1500:]
            # where the copy stood: both ends' topolvm-node (the source's node: the other one
            # that took part; the target's since its last boot)
            copy_logs = "\n".join(f"topolvm-node on {n.name}:\n{n.node_log(lines=40)}"
                                  for n in s.nodes)  # fmt: skip
            raise AssertionError(f"{e}\ncuts: {cuts}\n{described[-1500:]}\nkubelet: running "
                                 f"{kubelet['running']}, rc {kubelet['rc']}\n{kubelet['log']}"
                                 f"\ndmesg:\n{dmesg}\n{copy_logs}") from e  # fmt: skip
        vm = await move_done(s.client, w.claim)
        assert vm.status.phase == MovePhase.SUCCEEDED, (cuts, vm.status)
        # every step but one that passed while the node was booting (the swap is quick)
        assert len(cuts) >= 3, cuts
        print(f"power cuts of the target: {cuts}")
        # the last cut may land in Verifying: the move ends while the node's kubelet starts
        await eventually(f"pod {w.pod} answers on {target.name}", partial(answers, s, w.pod), 180)
        await w.check(vm)


async def test_a_move_survives_its_link_cut_in_both_copies(abc: Scenario) -> None:
    """The target's connections to the source's transfer port reset for 3 s, once in the
    pre-copy and once in the final copy: each copy waits and says so (CopyWaiting), then goes on
    once the link heals, and the move ends with every write in place."""
    s = abc
    async with writer(s) as w:
        source = next(n for n in s.nodes if n.name == w.source)
        target = next(n for n in s.nodes if n.name == w.target)

        def cut() -> None:
            with refused(target, source):
                time.sleep(3)

        await start_move(s.client, w.claim, w.target)
        acted = await at_phases(s.client, w.claim, {MovePhase.PRE_COPY: cut,
                                                    MovePhase.FINAL_COPY: cut})  # fmt: skip
        vm = await move_done(s.client, w.claim)
        assert vm.status.phase == MovePhase.SUCCEEDED, (acted, vm.status)
        assert acted == [MovePhase.PRE_COPY, MovePhase.FINAL_COPY], acted
        said = await events_for(s.client, "PersistentVolumeClaim", w.claim)
        assert any(e.startswith("CopyWaiting:") for e in said), said
        await w.check(vm)


async def test_a_drain_moves_every_claim_within_the_disruption_budget(abc: Scenario) -> None:
    """Two StatefulSets, three claims, all on one node; a PodDisruptionBudget lets one pod of
    the two-replica set down at a time. ``topolvm drain`` (two moves at once) cordons the node,
    moves the three claims off it, never two of that set's pods down together, and leaves the
    node cordoned."""
    s = abc
    thin = s.sc(device_class="thin", fs_type="xfs")
    drained, *others = s.nodes
    pair, single, pdb = unique("dx"), unique("dy"), unique("pdb")
    pods = [f"{pair}-0", f"{pair}-1", f"{single}-0"]
    claims_ = [f"data-{p}" for p in pods]
    s.claims.extend(claims_)
    async with move_webhook(s.cp, s.client):
        for n in others:  # the pods are placed while only the drained node takes them
            s.cp.kubectl("cordon", n.name)
        try:
            s.cp.apply(writer_set(pair, thin, s.group, replicas=2),
                       writer_set(single, thin, s.group), budget(pdb, pair, 1))  # fmt: skip
            for p in pods:
                await s.running(p)
        finally:
            for n in others:
                s.cp.kubectl("uncordon", n.name)
        try:
            down_together = 0
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "topolvm", "drain", drained.name, "--max-parallel=2",
                f"--kubeconfig={s.cp.kubeconfig}", "--timeout=10m",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            while proc.returncode is None:
                moves = await moves_now(s.client)
                down = [m for m in moves if m.claim.startswith(f"data-{pair}-")
                        and m.status.phase in MovePhase.DOWN]  # fmt: skip
                down_together = max(down_together, len(down))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 0.2)
            out = (await proc.stdout.read()).decode() if proc.stdout else ""
            assert proc.returncode == 0, out
            assert down_together == 1, out
            done = {m.claim: m for m in await moves_now(s.client)}
            for c in claims_:
                assert done[c].status.phase == MovePhase.SUCCEEDED, done[c].status
            for p in pods:
                await s.running(p)
                obj = await api.get(s.client, Pod, p, namespace=NS)
                assert obj is not None and obj["spec"]["nodeName"] != drained.name
            node = await api.get(s.client, Node, drained.name)
            assert node is not None and node["spec"].get("unschedulable") is True
            await lvs_accounted(s, "the drain")
        finally:
            s.cp.kubectl("uncordon", drained.name, check=False)
            s.cp.kubectl("delete", "statefulset", pair, single, "-n", NS, "--wait=true",
                         check=False)  # fmt: skip
            s.cp.kubectl("delete", "pdb", pdb, "-n", NS, check=False)
            for c in claims_:
                await delete_move(s.client, c)


async def test_a_move_waits_until_a_force_deleted_pods_writer_stops(abc: Scenario) -> None:
    """The source node's kubelet is stopped (its container writes on) and the moved pod's
    object force-deleted: the final copy waits, its message and topolvm doctor saying the
    volume is still open on that node, and the move does not swap while the writer writes.
    The kubelet started again stops the orphaned container and unmounts the volume; the move
    ends with every line the writer wrote, also after its pod object was gone, on the target."""
    s = abc
    async with writer(s) as w:
        source = next(n for n in s.nodes if n.name == w.source)
        claimed = await pvc(s.client, w.claim)
        assert claimed is not None
        pv = claimed["spec"]["volumeName"]
        source.signal("kubelet", "SIGTERM", wait=30)  # its containers run on
        try:
            await start_move(s.client, w.claim, w.target)

            async def deleting() -> bool:  # Stopping: no kubelet confirms the pod's end
                obj = await api.get(s.client, Pod, w.pod, namespace=NS)
                return obj is not None and bool(obj["metadata"].get("deletionTimestamp"))

            await eventually("the pod being deleted", deleting, timeout=180)
            s.cp.kubectl("delete", "pod", w.pod, "-n", NS, "--force", "--grace-period=0")
            gone_at = await lines_on(source, pv)
            vm = await move_of(s.client, w.claim)
            res = api.logicalvolume_resource(s.names)
            still = f"is still open on node {source.name}"

            async def waiting() -> str:
                obj = await api.get(s.client, res, vm.status.target_volume) or {}
                message = str(((obj.get("status") or {}).get("copy") or {}).get("message", ""))
                return message if still in message else ""

            message = await eventually("the final copy waiting for the source", waiting, 120)
            assert message.startswith("waiting: refused (unavailable): the volume "), message
            assert "mounted at /var/lib/kubelet/" in message, message
            _, doc = await doctor(s.cp, "-n", NS)
            [finding] = about(doc, "volume-move", w.claim)
            assert finding["cause"].startswith(f"the volume is still open on node {source.name}")
            for _ in range(10):  # no swap while it writes
                assert (await move_of(s.client, w.claim)).status.phase == MovePhase.FINAL_COPY
                await asyncio.sleep(1)
            written = await lines_on(source, pv)
            assert written > gone_at  # it wrote on after its pod object was gone
        finally:
            source.respawn("kubelet")  # it stops the orphaned container, unmounts the volume
        vm = await move_done(s.client, w.claim)
        assert vm.status.phase == MovePhase.SUCCEEDED, vm.status
        await s.running(w.pod)
        lines = s.exec(w.pod, "cat /data/log").strip().split("\n")
        assert lines[:written] == [str(i) for i in range(written)], "an acknowledged write lost"
        assert all(n == str(i) or n.startswith("stop ") for i, n in enumerate(lines)), lines[-5:]
        await eventually(
            f"node {source.name} Ready again", partial(node_ready, s, source.name), 120
        )


# last: it powers node A off for good (the tests above need the three nodes)
async def test_a_snapshot_kept_on_another_node_outlives_its_node(abc: Scenario) -> None:
    """The class keeps the snapshot on a node labelled for it (C); node A's guest is powered
    off for good and its Node deleted; the claim is restored on B from C."""
    s = abc
    a, b, c = s.nodes
    s.cp.kubectl("label", "node", c.name, "topolvm.test/keeper=yes", "--overwrite")
    thin = s.sc(device_class="thin", fs_type="xfs")
    keeper = {"topolvm.io/snapshot-node-selector": "topolvm.test/keeper=yes"}
    got = await snapshotted(s, thin, a.name, "512Mi", mib=40, snapshot_params=keeper)
    src, writer, sums, snap, ready = got.claim, got.writer, got.sums, got.snapshot, got.ready
    handle = s.cp.kubectl("get", "volumesnapshotcontent",
                          ready["status"]["boundVolumeSnapshotContentName"], "-o",
                          "jsonpath={.status.snapshotHandle}")  # fmt: skip
    kept = await logical_volume_of(s, handle)
    assert kept.node_name == c.name and kept.copy is not None and kept.copy.source_node == a.name

    # node A goes for good: its pods are lost with it, its guest is powered off, its Node deleted
    s.cp.kubectl("delete", "pod", writer, "-n", "default", "--force", "--grace-period=0")
    s.pods.remove(writer)
    a.stop()
    s.nodes = [b, c]
    del s.before[a.name]
    s.cp.kubectl("delete", "node", a.name, "--wait=false")

    restored, reader = unique("restored"), unique("reader")
    s.apply(claim(restored, thin, "512Mi", source=from_snapshot(snap)),
            on_node(reader, s.group, b.name, [restored]))  # fmt: skip
    [published] = await s.running(reader, timeout=300)
    assert read_sums(s, reader, restored).replace(restored, src) == sums
    target = await logical_volume_of(s, published.volume_id)
    assert target.copy is not None and target.copy.source_node == c.name
    await lvs_accounted(s, "the restore from node C")

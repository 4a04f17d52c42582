"""The crash campaign: seeded runs, each one operation (create, delete, expand, snapshot,
restore; every other restore onto a second node: a copy from the first, docs/mobility.md; move: a
claim a StatefulSet's pod uses moves to the second node, both nodes running kubelets) with one
crash at a random point of it: SIGKILL of topolvm-controller, of topolvm-node, of lvmd (socket
mode), a power loss of the UML node itself (the first node: the copy's sender), or a pause: the
controller leader SIGSTOPped while a second controller takes over, then SIGCONTed (a former
leader going on from where it was; the victim of a move, when one can be drawn). After each
run the operation must complete, every invariant hold on both nodes (tests/invariants.py), and
every volume's data read back with the checksum it was written with. Then two controllers
drive the same moves, one paused mid-step, over seeded interleavings (docs/mobility.md,
"Fencing").

``make test`` runs the first 10 seeded runs, ``make chaos`` 100 (TOPOLVM_CHAOS_RUNS;
TOPOLVM_CHAOS_VICTIMS narrows the victims, TOPOLVM_CHAOS_OPS the operations,
TOPOLVM_CHAOS_SEED picks another campaign; a failing
run names its seed, operation, victim and delay). The victims take turns (run n: the n-th
victim, cyclically); the operation and the delay are drawn from the seed. The two failures the
long campaign found are fixed (docs/reliability.md)."""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.umlnode import UmlNode
from tests.chaos_helpers import MIB, READ, WRITE, Volume, device_class, settled, with_data
from tests.cluster_fixtures import NodeSet, pod_node, record_line, unique
from tests.faults_helpers import pinned_class
from tests.helpers import eventually
from tests.leader_helpers import Replica, controller_of, freeze
from tests.lvm_fixtures import THICK, THIN
from tests.move_fencing_helpers import fenced_move
from tests.move_helpers import delete_move, holding_set, move_done, move_webhook, start_move
from tests.provisioning import NS, Scenario, bound, claim
from topolvm.k8s import api
from topolvm.k8s.lvobject import parse_quantity
from topolvm.k8s.moveobject import MovePhase

# One event loop for the module: the campaign (its API client, its gRPC channels) spans the runs.
pytestmark = [pytest.mark.cluster, pytest.mark.asyncio(loop_scope="module")]

RUNS = int(os.environ.get("TOPOLVM_CHAOS_RUNS", "10"))
SEED = os.environ.get("TOPOLVM_CHAOS_SEED", "20261125")
KNOWN_VICTIMS = ("topolvm-controller", "topolvm-node", "lvmd", "power loss", "pause")
PAUSE = 8.0  # seconds the leader stays stopped while the second controller drives
FENCE_RUNS = int(os.environ.get("TOPOLVM_FENCE_RUNS", "3"))
# every victim in make test too, since the 100-run make chaos of 2026-11-27 (docs/reliability.md)
VICTIMS = tuple(os.environ.get("TOPOLVM_CHAOS_VICTIMS", ",".join(KNOWN_VICTIMS)).split(","))
if unknown := set(VICTIMS) - set(KNOWN_VICTIMS):
    raise ValueError(f"TOPOLVM_CHAOS_VICTIMS: unknown {sorted(unknown)}; "
                     f"known {list(KNOWN_VICTIMS)}")  # fmt: skip
KNOWN_OPS = ("create", "delete", "expand", "snapshot", "restore", "move")
# TOPOLVM_CHAOS_OPS narrows the operations drawn (create is drawn while none of them can be)
OPS = tuple(os.environ.get("TOPOLVM_CHAOS_OPS", ",".join(KNOWN_OPS)).split(","))
if unknown := set(OPS) - set(KNOWN_OPS):
    raise ValueError(f"TOPOLVM_CHAOS_OPS: unknown {sorted(unknown)}; known {list(KNOWN_OPS)}")
CLASSES = [device_class(THICK), device_class(THIN)]
THICK_BUDGET_MIB = 3 * 1024  # of the 5 GiB the thick class offers (10 GiB VG, 4 GiB pool, spare)
SNAPSHOT = {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot"}
Done = Callable[[], Awaitable[None]]


@dataclass
class Campaign:
    s: Scenario
    node: UmlNode
    other: UmlNode  # where cross-node restores go, copied from ``node``
    driver: DriverStack
    sc: dict[str, str]  # device class -> StorageClass (Immediate: claims bind without a pod)
    tracked: dict[str, str]  # StorageClass (WaitForFirstConsumer) -> device class
    vsc: str
    sc_other: str  # thin, Immediate, its topology only ``other``: a restore there is a copy
    replica: Replica  # a second topolvm-controller: the pause victim's successor
    volumes: dict[str, Volume] = field(default_factory=dict)
    snapshots: dict[str, Volume] = field(default_factory=dict)  # what a restore must read
    runs: Counter[str] = field(default_factory=Counter)
    restarts: Counter[str] = field(default_factory=Counter)
    moves: Counter[str] = field(default_factory=Counter)  # how the moves ended
    recovery: list[float] = field(default_factory=list)
    slowest: tuple[float, str] = (0.0, "")  # the longest recovery, and its run
    activation: str = ""  # what LVM's activation printed after the last power loss, if it failed
    restores: int = 0
    last_op: str = ""  # what the last operation turned out to be: a restore may be an xrestore

    @property
    def client(self) -> AsyncClient:
        return self.s.client

    def possible(self) -> list[str]:
        thick = sum(v.size_mib for v in self.volumes.values() if v.device_class == "ssd")
        ops = ["create"] if len(self.volumes) < 6 and thick <= THICK_BUDGET_MIB - 512 else []
        if self.volumes or self.snapshots:
            ops.append("delete")
        if self._growable() and thick <= THICK_BUDGET_MIB - 256:
            ops.append("expand")
        if any(v.device_class == "thin" for v in self.volumes.values()) and len(self.snapshots) < 3:
            ops.append("snapshot")
        if self.snapshots and len(self.volumes) < 6:
            ops.append("restore")  # every other one onto the second node (``restore``)
        if self._movable():
            ops.append("move")
        return ops

    def _movable(self) -> list[str]:
        """Claims on the campaign's node that may move to the second node (while it holds
        fewer than 3 volumes). A grown claim's filesystem waits for a kubelet to mount it; the
        move's pod would do that, and it is left out to keep the run to one operation."""
        if sum(v.node == self.other.name for v in self.volumes.values()) >= 3:
            return []
        return sorted(n for n, v in self.volumes.items() if not v.node and not v.expanded)

    def _growable(self) -> list[str]:
        return sorted(n for n, v in self.volumes.items() if not v.expanded)

    async def _volume_of(self, name: str) -> str:
        obj = await bound(self.client, name, timeout=180)
        return str(obj["spec"]["volumeName"])

    # --- operations: each starts, and returns what waits for its end ----------------------

    async def create(self, rng: random.Random) -> Done:
        dc = rng.choice(["ssd", "thin"])
        v = Volume(unique(f"c-{dc}"), dc, 512)
        self.s.apply(claim(v.claim, self.sc[dc], f"{v.size_mib}Mi"))

        async def done() -> None:
            v.checksum = (await with_data(self.client, self.node, await self._volume_of(v.claim),
                                          WRITE)).strip()  # fmt: skip
            self.volumes[v.claim] = v

        return done

    async def delete(self, rng: random.Random) -> Done:
        names = sorted(self.volumes) + sorted(self.snapshots)
        name = rng.choice(names)
        if name in self.snapshots:
            del self.snapshots[name]
            self.s.cp.kubectl("delete", "volumesnapshot", name, "-n", NS, "--wait=false")
            return lambda: self._gone("volumesnapshot", name)
        v = self.volumes.pop(name)
        pv_name = await self._volume_of(v.claim)
        self.s.cp.kubectl("delete", "pvc", v.claim, "-n", NS, "--wait=false")

        async def done() -> None:
            async def pv_gone() -> bool:
                return await api.get(self.client, PersistentVolume, pv_name) is None

            await eventually(f"PV {pv_name} deleted", pv_gone, timeout=180)

        return done

    async def _gone(self, kind: str, name: str) -> None:
        async def gone() -> bool:
            out = self.s.cp.kubectl("get", kind, name, "-n", NS, "--ignore-not-found")
            return not out.strip()

        await eventually(f"{kind} {name} deleted", gone, timeout=180)

    async def expand(self, rng: random.Random) -> Done:
        v = self.volumes[rng.choice(self._growable())]
        pv_name = await self._volume_of(v.claim)
        v.size_mib += 256
        v.expanded = True
        await api.patch_merge(self.client, PersistentVolumeClaim, v.claim,
                              {"spec": {"resources": {"requests": {
                                  "storage": f"{v.size_mib}Mi"}}}}, namespace=NS)  # fmt: skip

        async def done() -> None:
            async def grown() -> bool:
                pv = await api.get(self.client, PersistentVolume, pv_name)
                # compared as quantities: the resizer writes 1024Mi as "1Gi"
                size = pv and parse_quantity(pv["spec"]["capacity"]["storage"])
                return size == v.size_mib * MIB

            await eventually(f"PV {pv_name} grown to {v.size_mib}Mi", grown, timeout=180)

        return done

    async def snapshot(self, rng: random.Random) -> Done:
        thin = sorted(n for n, v in self.volumes.items() if v.device_class == "thin")
        v = self.volumes[rng.choice(thin)]
        name = unique("snap")
        self.s.apply({**SNAPSHOT, "metadata": {"name": name, "namespace": NS},
                      "spec": {"volumeSnapshotClassName": self.vsc,
                               "source": {"persistentVolumeClaimName": v.claim}}})  # fmt: skip

        async def done() -> None:
            async def ready() -> bool:
                out = self.s.cp.kubectl("get", "volumesnapshot", name, "-n", NS, "-o",
                                        "jsonpath={.status.readyToUse}", check=False)  # fmt: skip
                return out.strip() == "true"

            await eventually(f"snapshot {name} ready", ready, timeout=180)
            self.snapshots[name] = Volume(name, "thin", v.size_mib, v.checksum)

        return done

    async def restore(self, rng: random.Random) -> Done:
        """A restore; the first, third, ... go onto the second node (while it holds fewer than
        3 volumes): its topolvm-node copies the snapshot from this one. Alternating, not drawn,
        so that the seeded draws stay those of the campaigns before (docs/reliability.md) and
        ``make test``'s 10 runs cross nodes too."""
        snap = self.snapshots[rng.choice(sorted(self.snapshots))]
        self.restores += 1
        across = (
            self.restores % 2 == 1
            and sum(v.node == self.other.name for v in self.volumes.values()) < 3
        )
        name, sc = ("xrestore", self.sc_other) if across else ("restore", self.sc["thin"])
        node = self.other.name if across else ""
        v = Volume(unique(name), "thin", snap.size_mib, snap.checksum, node)
        source = {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                  "name": snap.claim}  # fmt: skip
        self.s.apply(claim(v.claim, sc, f"{v.size_mib}Mi", source=source))
        self.last_op = name

        async def done() -> None:
            await self._volume_of(v.claim)
            self.volumes[v.claim] = v

        return done

    async def move(self, rng: random.Random) -> Done:
        """A claim on the campaign's node, mounted by a StatefulSet's pod running there, moves
        to the second node (docs/mobility.md): pre-copy, the pod stopped, the final copy, the
        claim re-created bound to the copy, the pod started there. A crash may also end it
        rolled back, the claim and its pod where they were: either way the data reads back."""
        v = self.volumes[rng.choice(self._movable())]
        name = unique("hold")
        self.s.cp.apply(holding_set(name, v.claim, self.s.group))
        await self.s.running(f"{name}-0")
        await start_move(self.client, v.claim, self.other.name)

        async def done() -> None:
            vm = await move_done(self.client, v.claim, timeout=200)
            assert vm.status.phase in (MovePhase.SUCCEEDED, MovePhase.ROLLED_BACK), vm.status
            why = f" ({vm.status.reason})" if vm.status.reason else ""
            self.moves[f"{vm.status.phase}{why}"] += 1
            moved = vm.status.phase == MovePhase.SUCCEEDED
            await self.s.running(f"{name}-0")
            landed = await pod_node(self.client, f"{name}-0")
            assert landed == (self.other if moved else self.node).name, (landed, vm.status)
            if moved:
                v.node = self.other.name
            # the pod goes (its kubelet unpublishes the claim), then the finished move
            await asyncio.to_thread(self.s.cp.kubectl, "delete", "statefulset", name, "-n", NS,
                                    "--cascade=foreground", "--timeout=120s",
                                    timeout=150)  # fmt: skip
            await delete_move(self.client, v.claim)

        return done

    def node_of(self, v: Volume) -> UmlNode:
        return self.other if v.node == self.other.name else self.node

    # --- crashes ------------------------------------------------------------------------

    def crash(self, victim: str) -> None:
        if victim == "topolvm-controller":
            self.driver.kill_controller()
            self.driver.restart_after_crash()
        elif victim == "power loss":
            self.activation = self.node.power_cycle()
        else:
            self.node.signal(victim, "SIGKILL", wait=10)
            self.node.respawn(victim)

    async def pause(self) -> None:
        """The leader stops (SIGSTOP) mid-operation; a second controller starts and drives
        the operation for :data:`PAUSE` seconds; the former leader goes on (SIGCONT) with what
        it had read, and both run until the run ends (:meth:`Replica.stop`)."""
        leader = controller_of(self.driver)
        freeze(leader, True)
        try:
            self.replica.start()  # on this thread: see test_crash_at_a_random_point
            await asyncio.sleep(PAUSE)
        finally:
            freeze(leader, False)

    def restart_exited(self) -> None:
        """What the kubelet does for a container that exited: start it again (and count it)."""
        for node, name in ((self.node, "lvmd"), (self.node, "topolvm-node"),
                           (self.other, "topolvm-node")):  # fmt: skip
            if not node.daemon(name, lines=1)["running"]:
                self.restarts[name] += 1
                node.respawn(name)

    async def verify_data(self) -> None:
        for v in list(self.volumes.values()):
            pv_name = await self._volume_of(v.claim)
            got = (await with_data(self.client, self.node_of(v), pv_name, READ)).strip()
            assert got == v.checksum, f"{v.claim}: data read back as {got}, written {v.checksum}"


@pytest.fixture(scope="module")
def chaos_nodes(
    control_plane: ControlPlane, driver: DriverStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[UmlNode, UmlNode]]:
    """The campaign's node: vg1 (10 GiB) with pool0 (4 GiB), lvmd as its own daemon (socket
    mode); and a second node (vg1 6 GiB, pool0 2 GiB, lvmd embedded) where restores are copied."""
    nodes = NodeSet(control_plane, "chaos", tmp_path_factory.mktemp("chaos"))
    try:
        # kubelets: the move operation's pod runs on one, then the other
        node, other = nodes.make(2, vg_gib=[10, 6], kubelet=True)
        node.lvm("lvcreate", "-T", "vg1/pool0", "-L", "4g")
        other.lvm("lvcreate", "-T", "vg1/pool0", "-L", "2g")
        socket = node.start_lvmd([THICK, THIN])
        node.start_topolvm_node(control_plane, [], lvmd_socket=socket)
        other.start_topolvm_node(control_plane, [THICK, THIN])
        yield node, other
    finally:
        nodes.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def campaign(
    control_plane: ControlPlane, driver: DriverStack, chaos_nodes: tuple[UmlNode, UmlNode],
) -> AsyncIterator[Campaign]:  # fmt: skip
    client = api.make_client(str(control_plane.kubeconfig))
    chaos_node, other = chaos_nodes
    s = Scenario(control_plane, client, [chaos_node, other])
    await s.record()
    vsc = unique("vsc")
    s.apply(
        {
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotClass",
            "metadata": {"name": vsc},
            "driver": "topolvm.io",
            "deletionPolicy": "Delete",
        }
    )
    # pinned to the campaign's node: with two nodes the controller could pick either
    sc = {dc: pinned_class(s, [chaos_node], dc) for dc in ("ssd", "thin")}
    # csi-provisioner tracks capacity only for WaitForFirstConsumer classes (what the scheduler
    # reads); these are the ones whose CSIStorageCapacity the invariants check
    tracked = {s.sc(device_class=dc, fs_type="xfs"): dc for dc in ("ssd", "thin")}
    elsewhere = pinned_class(s, [other], "thin")
    replica = Replica(driver, driver.workdir.parent / "chaos-replica")
    c = Campaign(s, chaos_node, other, driver, sc, tracked, vsc, elsewhere, replica)
    try:
        async with move_webhook(control_plane, client):  # holds a moving claim's pod
            yield c
    finally:
        replica.stop()
        if "topolvm-controller" not in driver.children:
            driver.restart_after_crash()
        await asyncio.to_thread(c.restart_exited)
        try:
            await s.clean()
        finally:
            await client.close()
            _report(c)


def _report(c: Campaign) -> None:
    if not c.recovery:
        return
    lines = [f"chaos: {len(c.recovery)} seeded runs (seed {SEED}): "
             + ", ".join(f"{k} {n}" for k, n in sorted(c.runs.items())),
             f"  recovery (crash to every invariant holding and data read back): median "
             f"{statistics.median(c.recovery):.1f}s, max {max(c.recovery):.1f}s "
             f"({c.slowest[1]})"]  # fmt: skip
    if c.moves:
        lines.append("  moves: " + ", ".join(f"{k} {n}" for k, n in sorted(c.moves.items())))
    if c.restarts:
        lines.append("  exited after a crash and restarted: "
                     + ", ".join(f"{k} {n}" for k, n in sorted(c.restarts.items())))  # fmt: skip
    if report := os.environ.get("TOPOLVM_CHAOS_REPORT"):
        Path(report).write_text("\n".join(lines) + "\n")
    record_line("\n".join(lines))


@pytest.mark.parametrize("run", range(RUNS))
async def test_crash_at_a_random_point(campaign: Campaign, run: int) -> None:
    c = campaign
    rng = random.Random(f"{SEED}:{run}")
    possible = c.possible()
    op = rng.choice([o for o in possible if o in OPS] or possible)
    victim = VICTIMS[run % len(VICTIMS)]
    if victim == "pause" and "move" in possible and "move" in OPS:
        op = "move"  # a pause is a move's victim: its steps are what a former leader redoes
    delay = round(rng.uniform(0, 3), 2)
    c.activation, c.last_op = "", ""
    done = await getattr(c, op)(rng)
    op = c.last_op or op
    if op == "move":  # its steps span seconds: a crash may come in any of them
        delay = round(delay * 5, 2)
    hit = "topolvm-controller paused" if victim == "pause" else f"{victim} killed"
    what = f"run {run} (seed {SEED}): {op}, {hit} after {delay}s"
    await asyncio.sleep(delay)
    t0 = time.monotonic()
    # on this thread: a daemon restarted from a worker thread would die with it
    # (PR_SET_PDEATHSIG follows the starting thread), at the end of this module's event loop
    if victim == "pause":
        await c.pause()
    else:
        c.crash(victim)
    c.runs[f"{op}/{victim}"] += 1

    def logs() -> str:
        failed = f"\nLV activation after the power loss failed: {c.activation}" * bool(c.activation)
        return (f"{what}{failed}\ntopolvm-node:\n{c.node.node_log(lines=15)}\n"
                f"topolvm-node of {c.other.name}:\n{c.other.node_log(lines=10)}")  # fmt: skip

    try:
        await asyncio.wait_for(done(), 240)
        await asyncio.to_thread(c.restart_exited)
        await settled(c.client, [c.node, c.other], CLASSES, c.tracked, details=logs)
        await c.verify_data()
    except (AssertionError, TimeoutError) as exc:
        raise AssertionError(f"{what}: {exc}") from exc
    finally:
        c.replica.stop()  # the pause's second controller, if it ran
    c.recovery.append(time.monotonic() - t0)
    c.slowest = max(c.slowest, (c.recovery[-1], what))
    print(f"{what}: recovered in {c.recovery[-1]:.1f}s")


@pytest.mark.parametrize("interleaving", range(FENCE_RUNS))
async def test_two_controllers_drive_the_same_moves_and_delete_no_bound_volume(
    campaign: Campaign, interleaving: int
) -> None:
    """topolvm-controller and a second one both drive every move (leader election off in
    both, as the chart now refuses; or a former leader that wakes); in each seeded
    interleaving one of them is SIGSTOPped mid-step and continued (tests/move_fencing_helpers
    .fenced_move). Every move ends Succeeded or RolledBack, the pod reads its data back where
    it runs, no bound PV or LogicalVolume is deleted, and the move's leftovers are gone. The
    second controller runs on until the campaign ends."""
    c = campaign
    c.replica.start()
    child = c.replica.child
    assert child is not None
    controllers = {"leader": controller_of(c.driver), "second": child}
    # each interleaving pauses in another step, in a seeded order
    at = random.Random(f"{SEED}:fence").sample(MovePhase.ORDER[1:-1], 5)[interleaving % 5]
    rng = random.Random(f"{SEED}:fence:{interleaving}")
    t0 = time.monotonic()
    line = await fenced_move(c.s, c.node, c.other, c.sc["thin"], controllers, at, rng)
    print(f"fencing {interleaving} (seed {SEED}): {line}; {time.monotonic() - t0:.0f}s")

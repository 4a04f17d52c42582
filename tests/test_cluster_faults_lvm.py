"""Faults below the driver: LVM refusing (a VG too small, capacity taken behind the driver's
back after it chose the node, a VG whose physical volume disappears) and LVM commands that
hang (a lock held, a stalled disk). One UML node for the module: ``vg1`` (10 GiB, class
``ssd``) on its first disk and ``vg2`` (class ``frail``) on two device-mapper maps of its second
disk, which tests fail or stall and bring back; lvmd as its own daemon with an LVM command
timeout of 8 s. A claim that cannot be provisioned must get an Event naming why within a minute
or two (never a silent hang), the claims of the healthy VG must not suffer, and once the fault
is gone every claim ends Bound with the invariants holding and lvmd and topolvm-node never
restarted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import AsyncClient

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.umlnode import UmlNode
from tests.chaos_helpers import device_class, settled
from tests.cluster_fixtures import NodeSet, record_line, unique
from tests.faults_helpers import (
    all_bound,
    cause,
    event_naming,
    logs,
    node_pid,
    phase,
    pinned_class,
)
from tests.helpers import eventually
from tests.lvm_fixtures import THICK
from tests.provisioning import Scenario, claim
from topolvm.k8s import api

pytestmark = pytest.mark.cluster

FRAIL: dict[str, Any] = {"name": "frail", "volume-group": "vg2", "spare-gb": 0}
CLASSES = [device_class(THICK), device_class(FRAIL)]
COMMAND_TIMEOUT = 8
FRAIL_PVS = ("frail0", "frail1")  # device-mapper maps of regions of the second disk
FRAIL_PV_BYTES = 1 << 30
OFFSET = 2048  # sectors between the regions (and before the first)
LOCK = "/run/lock/lvm/V_vg1"  # LVM's lock of vg1 (global/locking_dir of the guests' lvm.conf)


@pytest.fixture(scope="module")
def lvm_node(
    control_plane: ControlPlane, driver: DriverStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[UmlNode]:
    nodes = NodeSet(control_plane, "lvmfault", tmp_path_factory.mktemp("lvmfault"))
    try:
        (node,) = nodes.make(1, vg_gib=[10])
        for pv in FRAIL_PVS:
            _map(node, pv, "linear", create=True)
        # LVM's filter takes the guest's disks only; it takes the maps too now (and the bare
        # disk still, which carries no PV label: the maps start past its first MiB)
        node.exec("sed", "-i", r's#"a|^/dev/ubd|",#"a|^/dev/ubd|", "a|^/dev/mapper/frail|",#',
                  "/run/lvm-conf/lvm.conf")  # fmt: skip
        devices = [f"/dev/mapper/{pv}" for pv in FRAIL_PVS]
        node.lvm("pvcreate", "-y", *devices)
        node.lvm("vgcreate", "-s", "4m", "vg2", *devices)
        socket = node.start_lvmd([THICK, FRAIL], "lvmd", f"--command-timeout={COMMAND_TIMEOUT}",
                                 "--refresh-interval=5")  # fmt: skip
        node.start_topolvm_node(control_plane, [], lvmd_socket=socket)
        yield node
    finally:
        nodes.close()


def _map(node: UmlNode, pv: str, target: str, create: bool = False) -> None:
    """(Re)load the device-mapper table of one of vg2's PVs: ``linear`` (its region of the
    second disk) or ``error`` (every I/O fails: the disk is gone)."""
    size = FRAIL_PV_BYTES // 512
    start = OFFSET + FRAIL_PVS.index(pv) * (size + OFFSET)
    where = f" {node.disk_devices[1]} {start}" if target == "linear" else ""
    table = f"0 {size} {target}{where}"
    dm = ["dmsetup", "--noudevsync"]
    if create:
        node.exec(*dm, "create", pv, "--table", table)
    else:
        node.exec(*dm, "suspend", pv)
        node.exec(*dm, "load", pv, "--table", table)
        node.exec(*dm, "resume", pv)
    node.exec(*dm, "mknodes", pv)
    if target == "linear" and not create:
        # What LVM's udev rules run on a real host when a device changes. Without it, the
        # hints LVM wrote while the PV could not be read (/run/lvm/hints: which devices hold
        # PVs) leave it out for good, as nothing else tells LVM the device is back (seen in
        # CI, 2026-11-26: "Couldn't find device with uuid" for 150 s after the PV returned).
        node.lvm("pvscan", "--cache")


def _lvmd_pid(node: UmlNode) -> str:
    return node.exec("pgrep", "-f", "topolvm lvmd", check=False).stdout.strip()


async def _scenario(cp: ControlPlane, client: AsyncClient, node: UmlNode) -> Scenario:
    s = Scenario(cp, client, [node])
    await s.record()
    return s


async def _healed(s: Scenario, node: UmlNode, driver: DriverStack, pids: tuple[str, str]) -> None:
    tracked = {s.sc(device_class=dc, fs_type="xfs"): dc for dc in ("ssd", "frail")}
    await settled(s.client, [node], CLASSES, tracked, details=lambda: logs(driver, [node]))
    assert (node_pid(node), _lvmd_pid(node)) == pids, "topolvm-node or lvmd was restarted"


async def test_a_claim_larger_than_any_node_is_an_event(
    control_plane: ControlPlane, driver: DriverStack, lvm_node: UmlNode,
    cluster_client: AsyncClient,
) -> None:  # fmt: skip
    """A claim larger than the VG: the controller refuses it (RESOURCE_EXHAUSTED, the node's
    free bytes named) and csi-provisioner records that on the claim; it stays Pending."""
    s = await _scenario(control_plane, cluster_client, lvm_node)
    try:
        sc = pinned_class(s, [lvm_node])
        big = unique("toobig")
        s.apply(claim(big, sc, "20Gi"))
        event = await event_naming(cluster_client, big, "ResourceExhausted", "bytes free")
        assert await phase(cluster_client, big) == "Pending"
        record_line(f"faults: claim larger than the VG -> {cause(event)}")
    finally:
        await asyncio.shield(s.clean())


async def test_capacity_taken_after_the_node_was_chosen(
    control_plane: ControlPlane, driver: DriverStack, lvm_node: UmlNode,
    cluster_client: AsyncClient,
) -> None:  # fmt: skip
    """The controller accepts a 4 GiB claim for the node (its annotation says 9 GiB free), but
    before lvmd's lvcreate runs, 6 GiB are taken by hand (LVM's VG lock held meanwhile, so that
    lvmd's command waits). lvmd answers RESOURCE_EXHAUSTED, which the claim's event names; once
    the space is freed again the claim is Bound, no process restarted."""
    node, pids = lvm_node, (node_pid(lvm_node), _lvmd_pid(lvm_node))
    s = await _scenario(control_plane, cluster_client, node)
    try:
        sc = pinned_class(s, [node])
        name = unique("squeezed")
        node.spawn("vglock", ["flock", "-x", LOCK, "sleep", "60"])
        try:
            s.apply(claim(name, sc, "4Gi"))

            async def accepted() -> bool:  # the controller made its LogicalVolume
                return bool(await _logical_volumes(s, node))

            await eventually("the claim's LogicalVolume", accepted, timeout=60)
            node.lvm("lvcreate", "--nolocking", "-y", "-n", "intruder", "-L", "6g", "vg1")
        finally:
            node.signal("vglock", "SIGKILL", wait=10)
        event = await event_naming(cluster_client, name, "ResourceExhausted", "no enough space")
        node.lvm("lvremove", "-y", "vg1/intruder")
        t0 = time.monotonic()
        await all_bound(cluster_client, [name], timeout=120)
        record_line(f"faults: capacity taken after the node was chosen -> {cause(event)}; "
                    f"Bound {time.monotonic() - t0:.1f}s after it was freed")  # fmt: skip
        await _healed(s, node, driver, pids)
    finally:
        node.lvm("lvremove", "-y", "vg1/intruder", check=False)
        await asyncio.shield(s.clean())


async def _logical_volumes(s: Scenario, node: UmlNode) -> list[str]:
    lvs, _ = await api.list_all(s.client, api.logicalvolume_resource(s.names))
    return [o["metadata"]["name"] for o in lvs if o["spec"].get("nodeName") == node.name]


async def test_a_hung_lvm_command_times_out_with_an_event(
    control_plane: ControlPlane, driver: DriverStack, lvm_node: UmlNode,
    cluster_client: AsyncClient,
) -> None:  # fmt: skip
    """Another process holds LVM's lock of vg1 for 20 s (an administrator's long command):
    lvmd's LVM commands wait for it. Each is killed after lvmd's command timeout (8 s) and the
    claim's event says so; once the lock is released the claim is Bound, no process
    restarted."""
    node, pids = lvm_node, (node_pid(lvm_node), _lvmd_pid(lvm_node))
    s = await _scenario(control_plane, cluster_client, node)
    try:
        sc = pinned_class(s, [node])
        name = unique("stuck")
        node.spawn("vglock", ["flock", "-x", LOCK, "sleep", "20"])
        t0 = time.monotonic()
        s.apply(claim(name, sc, "1Gi"))
        event = await event_naming(cluster_client, name, f"timed out after {COMMAND_TIMEOUT}")
        named = time.monotonic() - t0
        await all_bound(cluster_client, [name], timeout=150)
        record_line(f"faults: VG lock held 20 s -> event after {named:.1f}s: {cause(event)}; "
                    f"Bound {time.monotonic() - t0:.1f}s after the claim")  # fmt: skip
        await _healed(s, node, driver, pids)
    finally:
        node.signal("vglock", "SIGKILL", wait=10)
        await asyncio.shield(s.clean())


async def test_a_stalled_disk_fails_the_command_without_holding_lvmd(
    control_plane: ControlPlane, driver: DriverStack, lvm_node: UmlNode,
    cluster_client: AsyncClient,
) -> None:  # fmt: skip
    """One of vg2's PVs stalls (its device-mapper map suspended: I/O waits until it resumes). An
    LVM command reading it sleeps uninterruptibly and SIGKILL cannot end it; lvmd kills it after
    its command timeout, gives up waiting 10 s later and answers, so the claim's event says what
    happened instead of lvmd hanging with its lock held. Once the disk resumes the stuck commands
    exit, the claim is Bound and no process restarted."""
    node, pids = lvm_node, (node_pid(lvm_node), _lvmd_pid(lvm_node))
    s = await _scenario(control_plane, cluster_client, node)
    frail = pinned_class(s, [node], "frail")
    name = unique("stalled")
    dm = ["dmsetup", "--noudevsync"]
    node.exec(*dm, "suspend", "frail0")
    try:
        t0 = time.monotonic()
        s.apply(claim(name, frail, "256Mi"))
        event = await event_naming(cluster_client, name, "had not exited", "stalled disk",
                                   timeout=120)  # fmt: skip
        named = time.monotonic() - t0
    finally:
        node.exec(*dm, "resume", "frail0")
    try:
        await all_bound(cluster_client, [name], timeout=180)
        lvmd_log = node.node_log("lvmd", lines=400)
        assert "a killed command exited at last" in lvmd_log, lvmd_log[-3000:]
        record_line(f"faults: a stalled PV -> event after {named:.1f}s: {cause(event)}; Bound "
                    f"{time.monotonic() - t0:.1f}s after the claim")  # fmt: skip
        await _healed(s, node, driver, pids)
    finally:
        await asyncio.shield(s.clean())


async def test_a_missing_physical_volume_is_an_event(
    control_plane: ControlPlane, driver: DriverStack, lvm_node: UmlNode,
    cluster_client: AsyncClient,
) -> None:  # fmt: skip
    """One of vg2's two PVs fails (its map now answers every I/O with an error; LVM reads the
    VG from the other one): a new claim of class frail gets an event naming the missing PV,
    while a claim of class ssd (vg1) on the same node is still Bound. Once the PV is back the
    frail claim is Bound and the invariants hold for both classes."""
    node, pids = lvm_node, (node_pid(lvm_node), _lvmd_pid(lvm_node))
    s = await _scenario(control_plane, cluster_client, node)
    frail, ssd = pinned_class(s, [node], "frail"), pinned_class(s, [node])
    first = unique("frail")
    s.apply(claim(first, frail, "512Mi"))
    try:
        await all_bound(cluster_client, [first], timeout=120)
        _map(node, "frail1", "error")
        try:
            broken, healthy = unique("frail"), unique("healthy")
            s.apply(claim(broken, frail, "512Mi"), claim(healthy, ssd, "512Mi"))
            event = await event_naming(cluster_client, broken, "vg2", "missing PV", timeout=120)
            await all_bound(cluster_client, [healthy], timeout=120)
        finally:
            _map(node, "frail1", "linear")
        await all_bound(cluster_client, [broken], timeout=150)
        assert "pvscan --cache" in event, event  # lvmd's hint for the operator (docs/lvmd.md)
        said = " ".join(line.strip() for line in event.splitlines() if "missing" in line)
        record_line(f"faults: one of vg2's PVs failed -> {said[:240]}")
        await _healed(s, node, driver, pids)
    finally:
        await asyncio.shield(s.clean())

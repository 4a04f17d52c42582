"""Faults around the driver: the control plane restarting under a burst of claims, an API server
that answers with conflicts, throttling, errors and broken watches (a fault proxy), and LVM
refusing or hanging (tests/test_cluster_faults_lvm.py). Every claim must end Bound, or with an
Event that names the cause; nothing may hang; the invariants of tests/invariants.py must hold
afterwards; and no driver process may need a restart to get there."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.faultproxy import FAULTS, FaultProxy, Schedule
from devtools.testbed.umlnode import UmlNode
from tests.chaos_helpers import device_class
from tests.cluster_fixtures import NodeSet, UmlNodes, record_line, unique
from tests.faults_helpers import (
    all_bound,
    controller_with_kubeconfig,
    logs,
    phase,
    pinned_class,
    processes,
    pv_size,
    settle,
    sidecars,
    still_serving,
)
from tests.helpers import eventually
from tests.lvm_fixtures import THICK
from tests.provisioning import NS, Scenario, claim
from topolvm.k8s import api
from topolvm.k8s.lvobject import parse_quantity

pytestmark = pytest.mark.cluster

BURST = 20
CLASSES = [device_class(THICK)]
SEED = os.environ.get("TOPOLVM_FAULT_SEED", "20261126")


async def _volumes(client: AsyncClient, nodes: set[str]) -> int:
    lvs, _ = await api.list_all(client, api.logicalvolume_resource(Scenario.names))
    return sum(1 for o in lvs if o["spec"].get("nodeName") in nodes)


@pytest.fixture(scope="module")
def burst_nodes(
    control_plane: ControlPlane, driver: DriverStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[UmlNode]]:
    """Two UML nodes (vg1 of 10 GiB, class ssd) for both restart tests."""
    node_set = NodeSet(control_plane, "faultburst", tmp_path_factory.mktemp("faultburst"))
    try:
        nodes = node_set.make(2, vg_gib=[10, 10])
        for n in nodes:
            n.start_topolvm_node(control_plane, [THICK])
        yield nodes
    finally:
        node_set.close()


@pytest.mark.parametrize(
    ("component", "crash", "down"),
    [("kube-apiserver", False, 0.0), ("etcd", True, 3.0)],
    ids=["kube-apiserver-restart", "etcd-crash"],
)
async def test_control_plane_restart_in_a_burst(
    control_plane: ControlPlane, driver: DriverStack, burst_nodes: list[UmlNode],
    cluster_client: AsyncClient, component: str, crash: bool, down: float,
) -> None:  # fmt: skip
    """20 claims at once on two nodes; once the first volumes exist, the API server restarts
    (SIGTERM, its graceful shutdown), or etcd is SIGKILLed and started again 3 s later on the
    same data. Every claim ends Bound and the invariants hold, with the same topolvm-controller
    and topolvm-node processes (same PIDs, still serving): each one reconnects by itself."""
    nodes = burst_nodes
    s = Scenario(control_plane, cluster_client, nodes)
    await s.record()
    tracked = {s.sc(device_class="ssd", fs_type="xfs"): "ssd"}  # CSIStorageCapacity checked
    sc = pinned_class(s, nodes)
    before = await asyncio.to_thread(processes, driver, nodes)
    names = [unique("burst") for _ in range(BURST)]
    try:
        s.apply(*[claim(n, sc, "128Mi") for n in names])
        node_names = {n.name for n in nodes}

        async def some_in_flight() -> bool:
            return await _volumes(cluster_client, node_names) >= 3

        await eventually("the burst's first volumes", some_in_flight, timeout=120)
        bound_then = sum([await phase(cluster_client, n) == "Bound" for n in names])
        t0 = time.monotonic()
        # on this thread, though it blocks the loop: a child dies with the thread that
        # started it (PR_SET_PDEATHSIG), and asyncio.to_thread's threads end with the loop
        control_plane.restart(component, crash=crash, down=down)
        back = time.monotonic() - t0

        def details() -> str:
            return f"{sidecars(driver)}\n{logs(driver, nodes)}"

        await all_bound(cluster_client, names, timeout=240, details=details)
        all_bound_after = time.monotonic() - t0
        took, slowest = await settle(cluster_client, nodes, CLASSES, tracked, details=details)
        assert await asyncio.to_thread(processes, driver, nodes) == before, details()
        await still_serving(driver, nodes)
        what = "restarted" if not crash else f"SIGKILLed, {down:.0f}s down, started"
        record_line(f"faults: {component} {what} after {bound_then}/{BURST} claims of a burst "
                    f"were Bound: back in {back:.1f}s, all Bound {all_bound_after:.1f}s after "
                    f"the fault, invariants {took:.1f}s later (last: {slowest or '-'}); no "
                    "driver restart")  # fmt: skip
    finally:
        await asyncio.shield(s.clean())


async def test_volumes_through_a_fault_proxy(
    control_plane: ControlPlane, driver: DriverStack, uml_nodes: UmlNodes,
    cluster_client: AsyncClient, tmp_path: Path,
) -> None:  # fmt: skip
    """topolvm-node and topolvm-controller reach the API server only through the fault proxy
    (devtools/testbed/faultproxy.py: conflicts, throttling, 500s before and after a write,
    watches ended by 410 Gone or cut mid-stream). Claims are created, grown and deleted through
    them; each operation completes and the invariants hold, with no process restarted. Every
    kind of fault must have been injected at least once (the counts go to the summary)."""
    proxy = FaultProxy(control_plane, tmp_path / "proxy", Schedule(SEED)).start()
    nodes: list[UmlNode] = []
    try:
        nodes += uml_nodes(1, vg_gib=[10])
        nodes[0].start_topolvm_node(control_plane, [THICK], server=proxy.url_for(nodes[0].index))
        with controller_with_kubeconfig(driver, proxy.kubeconfig(tmp_path / "ctl.kubeconfig")):
            await _create_expand_delete(control_plane, driver, nodes[0], cluster_client, proxy)
    finally:
        for n in nodes:  # while it can still reach the API server: its shutdown is quick
            n.stop_topolvm_node()
        proxy.stop()
        record_line(f"faults: fault proxy, seed {SEED}: {proxy.summary()}")
    missing = [f for f in FAULTS if not proxy.counts[f]]
    assert not missing, f"never injected: {missing} ({proxy.summary()})"


async def _create_expand_delete(
    cp: ControlPlane, driver: DriverStack, node: UmlNode, client: AsyncClient, proxy: FaultProxy
) -> None:
    nodes = [node]
    s = Scenario(cp, client, nodes)
    before = await asyncio.to_thread(processes, driver, nodes)

    def details() -> str:
        return f"proxy: {proxy.summary()}\n{logs(driver, nodes)}"

    try:
        await s.record()
        tracked = {s.sc(device_class="ssd", fs_type="xfs"): "ssd"}
        sc = pinned_class(s, nodes)
        names = [unique("proxied") for _ in range(6)]
        s.apply(*[claim(n, sc, "256Mi") for n in names])
        await all_bound(client, names, timeout=240, details=details)
        grown, gone = names[:3], names[3:]
        for name in grown:
            await api.patch_merge(client, PersistentVolumeClaim, name,
                                  {"spec": {"resources": {"requests": {"storage": "512Mi"}}}},
                                  namespace=NS)  # fmt: skip
        pvs = {}
        for name in gone:
            obj = await api.get(client, PersistentVolumeClaim, name, namespace=NS)
            pvs[name] = (obj or {})["spec"]["volumeName"]
        cp.kubectl("delete", "pvc", *gone, "-n", NS, "--wait=false")

        async def done() -> bool:
            sizes = [await pv_size(client, n) for n in grown]
            left = [await api.get(client, PersistentVolume, pv) for pv in pvs.values()]
            return all(sz and parse_quantity(sz) == 512 << 20 for sz in sizes) and not any(left)

        await eventually("3 PVs grown to 512Mi and 3 deleted", done, timeout=240, interval=1,
                         details=details)  # fmt: skip
        await settle(client, nodes, CLASSES, tracked, details=details)
        assert await asyncio.to_thread(processes, driver, nodes) == before, details()
        await still_serving(driver, nodes)
    finally:
        await asyncio.shield(s.clean())

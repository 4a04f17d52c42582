"""CSIStorageCapacity at scale (issue 20): 1000 simulated Nodes (Node and CSINode objects only,
no kubelet) with capacity annotations, two WaitForFirstConsumer StorageClasses, and the
session's topolvm-controller answering csi-provisioner's GetCapacity (``--enable-capacity``).

The test asserts correctness with generous timeouts: one CSIStorageCapacity per (StorageClass,
Node), each equal to the Node's annotation; after 100 Nodes are deleted their objects go, and
after they come back with new capacities every object is right again, with no restart of the
controller or the provisioner in between (upstream TopoLVM #1201 lost objects at 1,800 nodes
until a restart). The times (the target is 60 s for the first 2000 objects) and
topolvm-controller's resident memory are reported in the session summary, not asserted.

For this test the session's csi-provisioner polls every minute (its own default, and the
chart's) instead of the test bed's 2 s: csi-provisioner queues every (segment, StorageClass) pair
at each poll, and its queue keys are pointers, so a poll never merges with the entries still
queued. At 2000 pairs a 2 s poll asks for 1000 GetCapacity calls a second, more than its one
capacity worker gets answered on the 2-CPU test machine (about 750 a second), the queue grows
for as long as the Nodes exist, and a deletion or a new Node waits behind that backlog (48-62 s
and 83-124 s for the churn below, instead of about 4 s). The provisioner is started again with
the test bed's flags at the end; nothing restarts between the phases. The first 2000 objects
take at least 40 s whatever the poll: the test bed's ``--kube-api-capacity-qps=50`` paces the
creations (upstream's default, 1, would take over half an hour)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from lightkube import ALL_NS, AsyncClient, codecs
from lightkube.resources.core_v1 import Node
from lightkube.resources.storage_v1 import CSINode, CSIStorageCapacity, StorageClass

from devtools.testbed.driver import DriverStack
from devtools.testbed.process import Child
from tests.cluster_fixtures import record_line, record_stat, unique
from tests.helpers import eventually
from topolvm.constants import Names, names
from topolvm.k8s import api
from topolvm.k8s.lvobject import parse_quantity

pytestmark = pytest.mark.cluster
NODES, CHURN = 1000, 100
DEVICE_CLASSES = ("ssd", "hdd")
TARGET_SECONDS = 60.0  # issue 20's goal for the first 2000 objects: reported, not asserted
TIMEOUT = 300.0  # what the assertions allow
POLL_FLAG, POLL = "--capacity-poll-interval=", "1m"  # csi-provisioner's default poll
LABEL = "topolvm.test/capacity-scale"
DRIVER_LABEL = "csi.storage.k8s.io/drivername"  # csi-provisioner's label on its objects
GIB, MIB = 1 << 30, 1 << 20
Obj = dict[str, Any]


def capacity(index: int, klass: int, generation: int) -> int:
    """Free bytes, distinct for every node, device class and generation (a Node deleted and
    added again comes back with new values), so that any mix-up shows."""
    return (generation * NODES + index + 1) * GIB + (klass + 1) * MIB


def vm_kib(pid: int, field_name: str) -> int:
    """``VmRSS``/``VmHWM`` of a live process, in KiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field_name}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


async def bounded(jobs: list[Callable[[], Awaitable[object]]], width: int = 32) -> None:
    gate = asyncio.Semaphore(width)

    async def run(job: Callable[[], Awaitable[object]]) -> None:
        async with gate:
            await job()

    await asyncio.gather(*(run(j) for j in jobs))


@dataclass
class Scale:
    """The test's objects and what their CSIStorageCapacity objects must say."""

    client: AsyncClient
    names: Names
    prefix: str
    classes: dict[str, str]  # StorageClass -> device class
    want: dict[str, dict[str, int]] = field(default_factory=dict)  # Node -> device class -> bytes
    last: list[str] = field(default_factory=list)  # what the latest check found wrong

    def node_name(self, index: int) -> str:
        return f"{self.prefix}-n{index}"

    @property
    def every_node(self) -> set[str]:
        return {self.node_name(i) for i in range(NODES)}

    def storage_class(self, name: str, device_class: str) -> Obj:
        return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": name, "labels": {LABEL: self.prefix}},
                "provisioner": self.names.plugin,
                "parameters": {self.names.device_class_param: device_class},
                "volumeBindingMode": "WaitForFirstConsumer"}  # fmt: skip

    async def add_node(self, index: int, generation: int) -> None:
        """A Node as topolvm-node leaves it (topology label, capacity annotations; no
        finalizer: no topolvm-node runs) and the CSINode the kubelet would register, owned by
        the Node as the kubelet's is."""
        name = self.node_name(index)
        caps = {dc: capacity(index, k, generation) for k, dc in enumerate(DEVICE_CLASSES)}
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name,
                             "labels": {LABEL: self.prefix, self.names.topology_key: name},
                             "annotations": {self.names.capacity_annotation(dc): str(v)
                                             for dc, v in caps.items()}}}  # fmt: skip
        created = await api.create(self.client, codecs.from_dict(node))
        owner = {"apiVersion": "v1", "kind": "Node", "name": name,
                 "uid": created["metadata"]["uid"]}  # fmt: skip
        csinode = {"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                   "metadata": {"name": name, "labels": {LABEL: self.prefix},
                                "ownerReferences": [owner]},
                   "spec": {"drivers": [{"name": self.names.plugin, "nodeID": name,
                                         "topologyKeys": [self.names.topology_key]}]}}  # fmt: skip
        await api.create(self.client, codecs.from_dict(csinode))
        self.want[name] = caps

    async def add_nodes(self, indices: list[int], generation: int) -> None:
        await bounded([partial(self.add_node, i, generation) for i in indices])

    async def remove_nodes(self, nodes: list[str]) -> None:
        for name in nodes:
            self.want.pop(name, None)
        jobs: list[Callable[[], Awaitable[object]]] = []
        for name in nodes:
            jobs.append(partial(api.delete, self.client, CSINode, name))
            jobs.append(partial(api.delete, self.client, Node, name))
        await bounded(jobs)

    async def problems(self) -> list[str]:
        """Every way the CSIStorageCapacity objects of the test's classes and nodes differ
        from :attr:`want`: missing, duplicated, wrong, or left for a deleted Node."""
        items, _ = await api.list_all(self.client, CSIStorageCapacity, namespace=ALL_NS,
                                      labels={DRIVER_LABEL: self.names.plugin})  # fmt: skip
        ours = self.every_node
        seen: dict[tuple[str, str], list[int]] = {}
        for cap in items:
            sc = str(cap.get("storageClassName", ""))
            labels = (cap.get("nodeTopology") or {}).get("matchLabels") or {}
            on = labels.get(self.names.topology_key)
            if sc in self.classes and on in ours:
                seen.setdefault((sc, on), []).append(parse_quantity(str(cap.get("capacity", "0"))))
        out = []
        for (sc, on), got in sorted(seen.items()):
            if on not in self.want:
                out.append(f"{sc} on {on}: {len(got)} object(s) left for a deleted Node")
            elif len(got) != 1:
                out.append(f"{sc} on {on}: {len(got)} objects {got}")
            elif got[0] != (want := self.want[on][self.classes[sc]]):
                out.append(f"{sc} on {on}: {got[0]} bytes, the Node says {want}")
        out += [f"{sc} on {on}: missing" for on in sorted(self.want) for sc in self.classes
                if (sc, on) not in seen]  # fmt: skip
        self.last = out
        return out

    async def settle(self, what: str, timeout: float = TIMEOUT) -> float:
        """Wait until :meth:`problems` finds nothing; return the seconds it took."""
        start = time.monotonic()

        async def right() -> bool:
            return not await self.problems()

        def details() -> str:
            return f"{len(self.last)} problem(s), the first: " + "; ".join(self.last[:10])

        await eventually(what, right, timeout=timeout, interval=1.0, details=details)
        return time.monotonic() - start

    async def leftovers(self) -> list[str]:
        """Objects of the test that still exist (the teardown waits for none)."""
        out = []
        for kind in (Node, CSINode, StorageClass):
            items, _ = await api.list_all(self.client, kind, labels={LABEL: self.prefix})
            out += [f"{kind.__name__} {i['metadata']['name']}" for i in items]
        items, _ = await api.list_all(self.client, CSIStorageCapacity, namespace=ALL_NS,
                                      labels={DRIVER_LABEL: self.names.plugin})  # fmt: skip
        out += [f"CSIStorageCapacity {i['metadata']['name']}" for i in items
                if i.get("storageClassName") in self.classes]  # fmt: skip
        return out

    async def clean_up(self) -> None:
        """Delete the StorageClasses, CSINodes and Nodes (dropping any finalizer left on a
        Node: topolvm-controller's node cleanup only removes its own, and only topolvm-node
        adds it), then wait until csi-provisioner has removed every CSIStorageCapacity."""
        for sc in self.classes:
            await api.delete(self.client, StorageClass, sc)
        nodes, _ = await api.list_all(self.client, Node, labels={LABEL: self.prefix})
        await self.remove_nodes([str(n["metadata"]["name"]) for n in nodes])
        nodes, _ = await api.list_all(self.client, Node, labels={LABEL: self.prefix})
        for node in nodes:
            if api.finalizers(node):
                await api.patch_merge(self.client, Node, str(node["metadata"]["name"]),
                                      {"metadata": {"finalizers": None}})  # fmt: skip
        left: list[str] = []

        async def gone() -> bool:
            left[:] = await self.leftovers()
            return not left

        await eventually("the test's objects to be gone", gone, timeout=TIMEOUT, interval=2.0,
                         details=lambda: f"{len(left)} left: " + ", ".join(left[:10]))  # fmt: skip


@pytest.fixture
def provisioner(driver: DriverStack) -> Iterator[Child]:
    """The session's csi-provisioner with ``--capacity-poll-interval=1m`` for this test (see the
    module's docstring), started again with its own flags afterwards."""
    session = driver.children.get("csi-provisioner")
    assert session is not None, "the driver stack runs no csi-provisioner"
    assert any(a.startswith(POLL_FLAG) for a in session.argv), session.argv
    argv = [POLL_FLAG + POLL if a.startswith(POLL_FLAG) else a for a in session.argv]
    session.stop()
    ours = Child(session.name, argv, session.log, env=session.env)
    driver.children[session.name] = ours  # same place in the stack's (stop) order
    try:
        yield ours.start()
    finally:
        ours.stop()
        driver.children[session.name] = session
        session.start()


@pytest.fixture
async def scale(
    driver: DriverStack, provisioner: Child, cluster_client: AsyncClient
) -> AsyncIterator[Scale]:
    prefix = unique("capscale")
    run = Scale(cluster_client, names(driver.legacy), prefix,
                {f"{prefix}-{dc}": dc for dc in DEVICE_CLASSES})  # fmt: skip
    try:
        yield run
    finally:
        start = time.monotonic()
        await run.clean_up()
        record_line(f"CSIStorageCapacity at scale: clean-up (every object of the test gone) took "
                    f"{time.monotonic() - start:.1f}s")  # fmt: skip


def pid_of(driver: DriverStack, name: str) -> int:
    child = driver.children.get(name)
    assert child is not None and child.proc is not None, f"the driver stack runs no {name}"
    return child.proc.pid


async def test_capacity_objects_for_1000_nodes_and_100_replaced_without_restart(
    driver: DriverStack, scale: Scale
) -> None:
    controller = pid_of(driver, "topolvm-controller")
    provisioner = pid_of(driver, "csi-provisioner")
    rss_before = vm_kib(controller, "VmRSS")
    for sc, dc in scale.classes.items():
        await api.create(scale.client, codecs.from_dict(scale.storage_class(sc, dc)))

    t0 = time.monotonic()
    await scale.add_nodes(list(range(NODES)), generation=0)
    created = time.monotonic() - t0
    await scale.settle(f"{NODES * len(DEVICE_CLASSES)} correct CSIStorageCapacity objects")
    first = time.monotonic() - t0
    rss_loaded = vm_kib(controller, "VmRSS")

    churned = [scale.node_name(i) for i in range(3, NODES, NODES // CHURN)]
    assert len(churned) == CHURN
    t1 = time.monotonic()
    await scale.remove_nodes(churned)
    await scale.settle(f"the CSIStorageCapacity objects of {CHURN} deleted Nodes to go")
    removed = time.monotonic() - t1

    t2 = time.monotonic()
    await scale.add_nodes([int(n.rsplit("-n", 1)[1]) for n in churned], generation=1)
    await scale.settle(f"{NODES * len(DEVICE_CLASSES)} correct objects after {CHURN} re-added")
    readded = time.monotonic() - t2

    assert pid_of(driver, "topolvm-controller") == controller, "topolvm-controller restarted"
    assert pid_of(driver, "csi-provisioner") == provisioner, "csi-provisioner restarted"
    rss_after, hwm = vm_kib(controller, "VmRSS"), vm_kib(controller, "VmHWM")
    for key, value in {"capacity_scale_seconds": first, "capacity_scale_created": created,
                       "capacity_scale_removed": removed, "capacity_scale_readded": readded,
                       "capacity_scale_rss_before_mib": rss_before / 1024,
                       "capacity_scale_rss_after_mib": rss_after / 1024}.items():  # fmt: skip
        record_stat(key, value)
    verdict = "met" if first <= TARGET_SECONDS else "MISSED"
    record_line(
        f"CSIStorageCapacity at scale ({NODES} Nodes x {len(DEVICE_CLASSES)} StorageClasses, "
        f"csi-provisioner polling every {POLL}): "
        f"all {NODES * len(DEVICE_CLASSES)} correct {first:.1f}s after the Nodes' creation began "
        f"(creating them took {created:.1f}s; target {TARGET_SECONDS:.0f}s {verdict}); "
        f"{CHURN} Nodes deleted, their objects gone in {removed:.1f}s; re-added with new "
        f"capacities, all correct again in {readded:.1f}s; topolvm-controller VmRSS "
        f"{rss_before / 1024:.0f} MiB before, {rss_loaded / 1024:.0f} MiB with {NODES} Nodes, "
        f"{rss_after / 1024:.0f} MiB after the churn (VmHWM {hwm / 1024:.0f} MiB)"
    )

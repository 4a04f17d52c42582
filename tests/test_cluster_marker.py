"""The ``topolvm.io/capacity`` marker can never strand a pod.

Upstream's pod webhook puts ``topolvm.io/capacity: 1`` on pods with TopoLVM volumes. A
kube-scheduler without the topolvm-scheduler extender rejects every node that does not advertise
that resource (``Insufficient topolvm.io/capacity``), and the pods stay Pending: the founding
outage, reproduced here with the real kube-scheduler's default profile (no extender). topolvm-node
advertises the resource on its Node, and the pods schedule.

The exporter runs against the real API server on simulated Nodes, with the Watch messages that
lvmd would send; one test runs the whole ``topolvm node`` process in a UML node for the flag.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node
from prometheus_client import CollectorRegistry

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.process import Child
from tests.cluster_fixtures import (
    EXTENDER_PORTS,
    GROUP_LABEL,
    UmlNodes,
    node_annotations,
    pod_node,
    unique,
)
from tests.helpers import eventually
from tests.lvm_fixtures import THICK
from tests.test_cluster_scheduler import delete_pods, failed_scheduling
from topolvm.constants import NORMAL
from topolvm.k8s import api
from topolvm.k8s.lvobject import parse_quantity
from topolvm.node.exporter import CapacityExporter, NodeMetrics
from topolvm.node.lvmd_client import SocketLvmd
from topolvm.proto import lvmd_pb2 as pb
from topolvm.scheduler.server import make_app

pytestmark = pytest.mark.cluster
GiB = 1 << 30
MARKER = NORMAL.capacity_resource  # topolvm.io/capacity
COUNT = 1_000_000  # what topolvm-node advertises
INSUFFICIENT = f"Insufficient {MARKER}"
WATCH = pb.WatchResponse(
    free_bytes=5 * GiB,
    items=[pb.WatchItem(device_class="ssd", free_bytes=5 * GiB, size_bytes=10 * GiB)],
)

MakeExporter = Callable[..., CapacityExporter]


def marker_pod(name: str, group: str, scheduler: str = "default-scheduler") -> dict[str, Any]:
    """A pod as upstream's webhook leaves it: the marker in container 0's requests and limits,
    and the capacity annotation."""
    one = {MARKER: "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {"capacity.topolvm.io/ssd": str(GiB)},
        },
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {GROUP_LABEL: group},
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/app:1",
                    "resources": {"requests": one, "limits": one},
                }
            ],
        },
    }


async def node_status(client: AsyncClient, node: str) -> dict[str, Any]:
    obj = await api.get(client, Node, node)
    assert obj is not None, f"Node {node} not found"
    status: dict[str, Any] = obj["status"]
    return status


async def marker_counts(client: AsyncClient, node: str) -> tuple[int | None, int | None]:
    """The advertised marker count in the Node's (capacity, allocatable); None where absent."""
    status = await node_status(client, node)
    values = [(status.get(key) or {}).get(MARKER) for key in ("capacity", "allocatable")]
    capacity, allocatable = (None if v is None else parse_quantity(v) for v in values)
    return capacity, allocatable


async def stays_pending(cp: ControlPlane, client: AsyncClient, pod: str) -> str:
    """Wait for kube-scheduler's verdict on ``pod`` and return it: it must be the outage's."""
    messages = await eventually(f"FailedScheduling for {pod}", lambda: failed_scheduling(cp, pod))
    assert INSUFFICIENT in messages[-1], messages
    assert await pod_node(client, pod) is None
    return str(messages[-1])


def drop_node(cp: ControlPlane, *nodes: str) -> None:
    """Delete simulated Nodes; the exporter put its finalizer on them (the controller's job to
    remove, and there is none here)."""
    for node in nodes:
        cp.kubectl(
            "patch", "node", node, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
            check=False,
        )  # fmt: skip
    cp.kubectl("delete", "node,csinode", *nodes, "--ignore-not-found", check=False)


@pytest.fixture
async def make_exporter(cluster_client: AsyncClient) -> AsyncIterator[MakeExporter]:
    """``make_exporter(node, advertise=True)``: topolvm-node's capacity exporter for a simulated
    Node. ``publish()`` never calls lvmd: the tests hand it the Watch messages lvmd would send,
    so the lvmd client points at a socket that is never dialled."""
    lvmd = SocketLvmd("/nonexistent/lvmd.sock")

    def make(node: str, advertise: bool = True) -> CapacityExporter:
        metrics = NodeMetrics(CollectorRegistry(), node)
        return CapacityExporter(
            cluster_client, NORMAL, node, lvmd, metrics, advertise_resource=advertise
        )

    yield make
    await lvmd.close()


async def test_marker_strands_a_pod_until_the_node_advertises_it(
    control_plane: ControlPlane, cluster_client: AsyncClient, make_exporter: MakeExporter
) -> None:
    group = unique("marker")
    node = f"{group}-n1"
    control_plane.add_node(node, labels={GROUP_LABEL: group})
    pod = unique("stranded")
    try:
        # The outage: the default kube-scheduler (no extender) finds no node with the resource.
        control_plane.apply(marker_pod(pod, group))
        await stays_pending(control_plane, cluster_client, pod)
        assert await marker_counts(cluster_client, node) == (None, None)

        # topolvm-node's first capacity publish advertises it, next to the annotations.
        assert await make_exporter(node).publish(WATCH)
        assert await marker_counts(cluster_client, node) == (COUNT, COUNT)
        status = await node_status(cluster_client, node)
        assert status["capacity"]["pods"] == "110"  # the rest of the status is untouched
        annotations = await node_annotations(cluster_client, node)
        assert annotations["capacity.topolvm.io/ssd"] == str(5 * GiB)

        landed = await eventually(
            f"{pod} scheduled", lambda: pod_node(cluster_client, pod), timeout=90
        )
        assert landed == node
    finally:
        delete_pods(control_plane, pod)
        drop_node(control_plane, node)


async def test_resource_comes_back_after_removal_or_reset_and_false_removes_it(
    control_plane: ControlPlane, cluster_client: AsyncClient, make_exporter: MakeExporter
) -> None:
    group = unique("readvertise")
    node = f"{group}-n1"
    control_plane.add_node(node, labels={GROUP_LABEL: group})
    pod = unique("after-off")
    exporter = make_exporter(node)
    key = MARKER.replace("/", "~1")
    try:
        await exporter.publish(WATCH)
        assert await marker_counts(cluster_client, node) == (COUNT, COUNT)

        # Nothing to change: the next refresh writes nothing at all.
        before = (await api.get(cluster_client, Node, node) or {})["metadata"]["resourceVersion"]
        await exporter.publish(WATCH)
        after = (await api.get(cluster_client, Node, node) or {})["metadata"]["resourceVersion"]
        assert after == before

        # Someone removes it, as the Kubernetes docs show: the next refresh puts it back.
        removal = [
            {"op": "remove", "path": f"/status/capacity/{key}"},
            {"op": "remove", "path": f"/status/allocatable/{key}"},
        ]
        control_plane.kubectl(
            "patch", "node", node, "--subresource=status", "--type=json", "-p",
            json.dumps(removal),
        )  # fmt: skip
        assert await marker_counts(cluster_client, node) == (None, None)
        await exporter.publish(WATCH)
        assert await marker_counts(cluster_client, node) == (COUNT, COUNT)

        # kubelet zeroes every extended resource when it re-registers a re-provisioned node.
        zero = {"status": {"capacity": {MARKER: "0"}, "allocatable": {MARKER: "0"}}}
        control_plane.kubectl(
            "patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(zero)
        )
        assert await marker_counts(cluster_client, node) == (0, 0)
        await exporter.publish(WATCH)
        assert await marker_counts(cluster_client, node) == (COUNT, COUNT)

        # --advertise-capacity-resource=false cleans up; the annotations stay published.
        off = make_exporter(node, advertise=False)
        assert await off.publish(WATCH)
        assert await marker_counts(cluster_client, node) == (None, None)
        status = await node_status(cluster_client, node)
        assert status["allocatable"]["pods"] == "110"
        assert (await node_annotations(cluster_client, node))["capacity.topolvm.io/ssd"]
        # ... and then the marker strands pods again, as without topolvm-node's help.
        control_plane.apply(marker_pod(pod, group))
        await stays_pending(control_plane, cluster_client, pod)
    finally:
        delete_pods(control_plane, pod)
        drop_node(control_plane, node)


async def test_a_node_being_deleted_gets_no_more_updates(
    control_plane: ControlPlane, cluster_client: AsyncClient, make_exporter: MakeExporter
) -> None:
    node = f"{unique('deleting')}-n1"
    control_plane.add_node(node)
    # a finalizer of the test's own holds the Node even after topolvm-controller (if the
    # session runs one) has done its node cleanup and removed topolvm-node's
    control_plane.kubectl("patch", "node", node, "--type=merge", "-p",
                          '{"metadata":{"finalizers":["topolvm.test/hold"]}}')  # fmt: skip
    try:
        exporter = make_exporter(node)
        await exporter.publish(WATCH)  # adds the node finalizer, which holds the Node
        await cluster_client.delete(Node, node)
        control_plane.kubectl(
            "patch", "node", node, "--subresource=status", "--type=merge", "-p",
            json.dumps({"status": {"capacity": {MARKER: None}, "allocatable": {MARKER: None}}}),
        )  # fmt: skip
        assert not await exporter.publish(WATCH)
        assert await marker_counts(cluster_client, node) == (None, None)
    finally:
        drop_node(control_plane, node)


async def test_topolvm_node_process_advertises_and_flag_false_removes(
    control_plane: ControlPlane, uml_nodes: UmlNodes, cluster_client: AsyncClient
) -> None:
    """The whole ``topolvm node`` process: advertised by default, so a marker pod schedules with
    the default kube-scheduler; ``--advertise-capacity-resource=false`` removes it."""
    (node,) = uml_nodes(1, vg_gib=[4])
    group = node.labels[GROUP_LABEL]
    pod = unique("uml-marker")
    try:
        node.start_topolvm_node(control_plane, [THICK])

        async def advertised() -> bool:
            return await marker_counts(cluster_client, node.name) == (COUNT, COUNT)

        await eventually("the advertised resource", advertised, details=node.node_log)
        control_plane.apply(marker_pod(pod, group))
        landed = await eventually(
            f"{pod} scheduled", lambda: pod_node(cluster_client, pod), timeout=90
        )
        assert landed == node.name

        node.stop_topolvm_node()
        node.start_topolvm_node(control_plane, [THICK], "--advertise-capacity-resource=false")

        async def removed() -> bool:
            return await marker_counts(cluster_client, node.name) == (None, None)

        await eventually("the resource removed", removed, details=node.node_log)

        def logged() -> bool:
            return f"removed extended resource {MARKER}" in node.node_log(lines=0)

        await eventually(
            "the second topolvm-node to log the removal",
            lambda: asyncio.to_thread(logged),
            timeout=20,
            details=lambda: node.node_log(lines=40),
        )
    finally:
        delete_pods(control_plane, pod)


# -- the extender's /status: is kube-scheduler calling it? ---------------------------------------


async def extender_status(profile: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{EXTENDER_PORTS[profile]}/status"
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        doc: dict[str, Any] = await r.json()
        return doc


async def test_extender_status_counts_kube_schedulers_calls(
    control_plane: ControlPlane, extenders: dict[str, Child], cluster_client: AsyncClient
) -> None:
    """A real kube-scheduler wired to the extender: scheduling one pod over two fitting nodes
    makes it call both verbs, and /status counts them."""
    profile = "topolvm-extender"
    group = unique("calls")
    nodes = [f"{group}-a", f"{group}-b"]
    for name in nodes:
        control_plane.add_node(name, labels={GROUP_LABEL: group})
        control_plane.kubectl("annotate", "node", name, f"capacity.topolvm.io/ssd={20 * GiB}")
    pod = unique("counted")
    spec = marker_pod(pod, group, scheduler=profile)
    del spec["spec"]["containers"][0]["resources"]  # the default mode: annotations only
    try:
        before = (await extender_status(profile))["calls"]
        control_plane.apply(spec)
        assert await eventually(f"{pod} scheduled", lambda: pod_node(cluster_client, pod))
        doc = await extender_status(profile)
        for verb in ("predicate", "prioritize"):
            assert doc["calls"][verb]["count"] > before[verb]["count"], doc
            assert doc["calls"][verb]["lastTime"] is not None
            assert doc["calls"][verb]["secondsSinceLast"] < 60
        assert doc["wired"].startswith("yes: kube-scheduler called")
    finally:
        delete_pods(control_plane, pod)
        control_plane.kubectl("delete", "node,csinode", *nodes, "--ignore-not-found", check=False)


async def test_status_counts_each_verb_and_ignores_other_methods() -> None:
    now = [1_700_000_000.0]
    app = make_app(wall_clock=lambda: now[0], plugin_names=NORMAL)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        doc = await (await client.get("/status")).json()
        assert doc["calls"] == {
            "predicate": {"count": 0, "lastTime": None, "secondsSinceLast": None},
            "prioritize": {"count": 0, "lastTime": None, "secondsSinceLast": None},
        }
        body = {"Pod": marker_pod("p", "g"), "Nodes": {"metadata": {}, "items": []}}
        for _ in range(3):
            assert (await client.post("/predicate", json=body)).status == 200
        now[0] += 5
        assert (await client.post("/prioritize", json=body)).status == 200
        assert (await client.post("/prioritize", data=b"not json")).status == 400
        now[0] += 2
        assert (await client.get("/predicate")).status == 405  # a person's curl, not a call
        doc = await (await client.get("/status")).json()
        assert doc["calls"] == {
            "predicate": {
                "count": 3,
                "lastTime": "2023-11-14T22:13:20.000+00:00",
                "secondsSinceLast": 7,
            },
            "prioritize": {
                "count": 2,
                "lastTime": "2023-11-14T22:13:25.000+00:00",
                "secondsSinceLast": 2,
            },
        }
        assert doc["lastRequestPath"] == "prioritize"
        assert doc["wired"] == "yes: kube-scheduler called prioritize 2s ago"
    finally:
        await client.close()

"""The real kube-scheduler with topolvm-scheduler as its extender, in each wiring mode. The
nodes are simulated (no UML needed): the test writes their capacity annotations, as
topolvm-node would, and the pods' capacity annotations, as the pod webhook would."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from lightkube import AsyncClient

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.process import Child
from tests.cluster_fixtures import EXTENDER_PORTS, GROUP_LABEL, pod_node, unique
from tests.helpers import eventually

pytestmark = pytest.mark.cluster
GiB = 1 << 30
PROFILES = ["topolvm-extender", "topolvm-nodecache", "topolvm-marker"]


def simulated_nodes(cp: ControlPlane, group: str, capacities: dict[str, int]) -> list[str]:
    names = []
    for suffix, free in capacities.items():
        name = f"{group}-{suffix}"
        cp.add_node(name, labels={GROUP_LABEL: group})
        cp.kubectl("annotate", "node", name, f"capacity.topolvm.io/ssd={free}", "--overwrite")
        names.append(name)
    return names


def capacity_pod(name: str, group: str, profile: str, request: int) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "registry.invalid/app:1"}
    if profile == "topolvm-marker":  # what upstream's pod webhook adds in marker mode
        container["resources"] = {
            "requests": {"topolvm.io/capacity": "1"},
            "limits": {"topolvm.io/capacity": "1"},
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {"capacity.topolvm.io/ssd": str(request)},
        },
        "spec": {
            "schedulerName": profile,
            "nodeSelector": {GROUP_LABEL: group},
            "containers": [container],
        },
    }


async def predicate(profile: str, pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    """Ask the extender behind ``profile`` directly, with node names as kube-scheduler sends
    them in nodeCacheCapable mode."""
    url = f"http://127.0.0.1:{EXTENDER_PORTS[profile]}/predicate"
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, json={"Pod": pod, "NodeNames": nodes}) as r,
    ):
        reply: dict[str, Any] = await r.json()
        return reply


async def cache_agrees(pod: dict[str, Any], nodes: list[str], fits: set[str]) -> bool:
    """True once the node-cache extender's Node watch shows the annotations the test wrote:
    exactly ``fits`` pass and the others fail for lack of space (not "unknown capacity")."""
    reply = await predicate("topolvm-nodecache", pod, nodes)
    failed = reply.get("FailedNodes") or {}
    known = all(reason.startswith("out of VG free space") for reason in failed.values())
    return known and set(reply.get("NodeNames") or []) == fits


def failed_scheduling(cp: ControlPlane, pod: str) -> list[str]:
    out = cp.kubectl(
        "get", "events", "-n", "default", "-o", "json",
        f"--field-selector=involvedObject.name={pod},reason=FailedScheduling",
    )  # fmt: skip
    return [e.get("message") or e.get("note", "") for e in json.loads(out)["items"]]


def delete_pods(cp: ControlPlane, *pods: str) -> None:
    """No kubelet confirms a deletion: force it."""
    cp.kubectl(
        "delete", "pod", "-n", "default", "--grace-period=0", "--force", "--ignore-not-found",
        *pods, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("profile", PROFILES)
async def test_pods_land_by_capacity_and_oversized_pods_get_the_extenders_reason(
    control_plane: ControlPlane,
    extenders: dict[str, Child],
    cluster_client: AsyncClient,
    profile: str,
) -> None:
    group = unique("sched")
    nodes = simulated_nodes(
        control_plane, group, {"small": 5 * GiB, "big": 40 * GiB, "middle": 12 * GiB}
    )
    fits, huge = unique("fits"), unique("huge")
    try:
        if profile == "topolvm-nodecache":  # kube-scheduler won't retry on annotation changes
            probe = capacity_pod("probe", group, profile, 8 * GiB)
            await eventually(
                "the node cache", lambda: cache_agrees(probe, nodes, {nodes[1], nodes[2]})
            )
        control_plane.apply(capacity_pod(fits, group, profile, 8 * GiB))
        landed = await eventually(
            f"{fits} scheduled", lambda: pod_node(cluster_client, fits),
            details=lambda: extenders[profile].log.read_text()[-2000:],
        )  # fmt: skip
        assert landed == nodes[1]  # filter drops small, prioritize prefers the most free space

        control_plane.apply(capacity_pod(huge, group, profile, 100 * GiB))

        async def refused() -> list[str]:
            return failed_scheduling(control_plane, huge)

        messages = await eventually(f"FailedScheduling for {huge}", refused)
        text = messages[0]
        assert "0/" in text and "nodes are available" in text
        assert "out of VG free space for device-class ssd" in text, text
        assert await pod_node(cluster_client, huge) is None
    finally:
        delete_pods(control_plane, fits, huge)
        control_plane.kubectl("delete", "node,csinode", *nodes, "--ignore-not-found", check=False)


async def test_node_cache_extender_follows_annotation_changes_and_deletions(
    control_plane: ControlPlane, extenders: dict[str, Child], cluster_client: AsyncClient
) -> None:
    """The nodeCacheCapable extender gets node names only: its Node watch on the real API server
    must follow annotation changes and deletions, and never take an unknown node for empty."""
    group = unique("watch")
    first, second = simulated_nodes(control_plane, group, {"a": 30 * GiB, "b": 10 * GiB})
    pods = [unique("before-change"), unique("after-change")]
    want = capacity_pod(pods[0], group, "topolvm-nodecache", 5 * GiB)
    try:
        await eventually(
            "the node cache", lambda: cache_agrees(want, [first, second], {first, second})
        )
        control_plane.apply(want)
        assert (
            await eventually("first pod placed", lambda: pod_node(cluster_client, pods[0])) == first
        )

        control_plane.kubectl(
            "annotate", "node", first, f"capacity.topolvm.io/ssd={2 * GiB}", "--overwrite"
        )
        control_plane.kubectl(
            "annotate", "node", second, f"capacity.topolvm.io/ssd={50 * GiB}", "--overwrite"
        )
        await eventually(
            "the changed annotations", lambda: cache_agrees(want, [first, second], {second})
        )
        control_plane.apply(capacity_pod(pods[1], group, "topolvm-nodecache", 5 * GiB))
        assert (
            await eventually("second pod placed", lambda: pod_node(cluster_client, pods[1]))
            == second
        )

        control_plane.kubectl("delete", "node", first)
        never_seen = unique("never-seen")

        async def unknown() -> dict[str, str] | None:
            failed = (await predicate("topolvm-nodecache", want, [first, never_seen])).get(
                "FailedNodes"
            ) or {}
            return (
                failed
                if "not in the scheduler extender's node cache" in failed.get(first, "")
                else None
            )

        failed = await eventually("the deleted node to be unknown", unknown)
        for name in (first, never_seen):
            assert failed[name].startswith("unknown capacity for device-class ssd"), failed[name]
            assert f"node {name} is not in the scheduler extender's node cache" in failed[name]
    finally:
        delete_pods(control_plane, *pods)
        control_plane.kubectl(
            "delete", "node,csinode", first, second, "--ignore-not-found", check=False
        )

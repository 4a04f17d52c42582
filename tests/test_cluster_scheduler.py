"""The real kube-scheduler with topolvm-scheduler as its extender, in each wiring mode. The
nodes are simulated (no UML needed): the test writes their capacity annotations, as
topolvm-node would, and the pods' capacity annotations, as the pod webhook would."""

from __future__ import annotations

import json
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.process import Child
from tests.cluster_fixtures import GROUP_LABEL, unique
from tests.helpers import eventually_async
from topolvm.k8s import api

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


async def node_of(client: AsyncClient, pod: str) -> str | None:
    obj = await api.get(client, Pod, pod, namespace="default")
    node = (obj or {}).get("spec", {}).get("nodeName")
    return str(node) if node else None


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
        control_plane.apply(capacity_pod(fits, group, profile, 8 * GiB))
        landed = await eventually_async(
            f"{fits} scheduled", lambda: node_of(cluster_client, fits),
            details=lambda: extenders[profile].log.read_text()[-2000:],
        )  # fmt: skip
        assert landed == nodes[1]  # filter drops small, prioritize prefers the most free space

        control_plane.apply(capacity_pod(huge, group, profile, 100 * GiB))

        async def refused() -> list[str]:
            return failed_scheduling(control_plane, huge)

        messages = await eventually_async(f"FailedScheduling for {huge}", refused)
        text = messages[0]
        assert "0/" in text and "nodes are available" in text
        assert "out of VG free space for device-class ssd" in text, text
        assert await node_of(cluster_client, huge) is None
    finally:
        delete_pods(control_plane, fits, huge)
        control_plane.kubectl("delete", "node,csinode", *nodes, "--ignore-not-found", check=False)


async def test_node_cache_extender_follows_annotation_changes(
    control_plane: ControlPlane, extenders: dict[str, Child], cluster_client: AsyncClient
) -> None:
    """The nodeCacheCapable extender gets node names only; its Node watch on the real API
    server must see an annotation change before the next pod is placed."""
    group = unique("watch")
    first, second = simulated_nodes(control_plane, group, {"a": 30 * GiB, "b": 10 * GiB})
    pod = unique("after-change")
    try:
        control_plane.kubectl(
            "annotate", "node", first, f"capacity.topolvm.io/ssd={2 * GiB}", "--overwrite"
        )
        control_plane.kubectl(
            "annotate", "node", second, f"capacity.topolvm.io/ssd={50 * GiB}", "--overwrite"
        )
        control_plane.apply(capacity_pod(pod, group, "topolvm-nodecache", 5 * GiB))
        landed = await eventually_async(f"{pod} scheduled", lambda: node_of(cluster_client, pod))
        assert landed == second
    finally:
        delete_pods(control_plane, pod)
        control_plane.kubectl(
            "delete", "node,csinode", first, second, "--ignore-not-found", check=False
        )

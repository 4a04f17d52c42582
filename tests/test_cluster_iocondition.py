"""The Node condition topolvm-node sets when IO limits cannot be put in force on its node
(docs/qos.md), written to a real API server's Node beside the kubelet's own conditions."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightkube import AsyncClient, codecs
from lightkube.resources.core_v1 import Node

from tests.cluster_fixtures import unique
from tests.test_unit_iocondition import cgroup_tree
from topolvm.iolimits import NODE_CONDITION
from topolvm.k8s import api, stamps
from topolvm.node import podcgroup
from topolvm.node.iocondition import NodeCondition

pytestmark = pytest.mark.cluster


async def conditions(client: AsyncClient, name: str) -> tuple[dict[str, api.Obj], str]:
    node = await api.get(client, Node, name)
    assert node is not None
    listed = (node.get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in listed}, node["metadata"]["resourceVersion"]


async def kubelet_says_ready(client: AsyncClient, name: str) -> None:
    """The kubelet's status update: a strategic merge patch of its own condition."""
    now = stamps.now()
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
             "lastTransitionTime": now}  # fmt: skip
    await api.patch_strategic(client, Node.Status, name, {"status": {"conditions": [ready]}})


async def test_the_node_says_why_it_cannot_limit_and_keeps_the_kubelets_conditions(
    cluster_client: AsyncClient, tmp_path: Path
) -> None:
    client, name = cluster_client, unique("iocond")
    await api.create(client, codecs.from_dict({"apiVersion": "v1", "kind": "Node",
                                               "metadata": {"name": name}}))  # fmt: skip
    try:
        await kubelet_says_ready(client, name)
        v1 = tmp_path / "v1"
        v1.mkdir()  # cgroup v1: no cgroup.controllers
        await NodeCondition(client, name, v1).start()
        found, version = await conditions(client, name)
        assert "Ready" in found, found
        said = found[NODE_CONDITION]
        assert (said["status"], said["reason"]) == ("True", podcgroup.CGROUP_V1)
        assert "cgroup v2" in said["message"]
        print(f"{NODE_CONDITION}: {said['status']} {said['reason']}: {said['message']}")

        # a restarted topolvm-node with the same answer writes nothing
        await NodeCondition(client, name, v1).start()
        assert (await conditions(client, name))[1] == version

        # the kubelet's next update keeps it
        await kubelet_says_ready(client, name)
        assert (await conditions(client, name))[0][NODE_CONDITION] == said

        # the node fixed (cgroup v2, the io controller for pods, block throttling)
        good = cgroup_tree(tmp_path / "v2", pods="kubepods")
        await NodeCondition(client, name, good).start()
        found, _ = await conditions(client, name)
        fixed = found[NODE_CONDITION]
        assert (fixed["status"], fixed["reason"]) == ("False", podcgroup.SUPPORTED)
        assert "Ready" in found
    finally:
        await api.delete(client, Node, name)

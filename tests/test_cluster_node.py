"""topolvm-node (embedded lvmd) in a UML node with real LVM, against the real kube-apiserver:
the LogicalVolume reconciler, the capacity annotations and the node finalizer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import UmlNodes, unique
from tests.helpers import eventually_async
from tests.lvm_fixtures import THICK, THIN
from topolvm.constants import NORMAL
from topolvm.k8s import api

pytestmark = pytest.mark.cluster
GiB = 1 << 30
LV = api.logicalvolume_resource(NORMAL)


async def node_with_topolvm(cp: ControlPlane, uml_nodes: UmlNodes, client: AsyncClient) -> UmlNode:
    """One UML node: vg1 (6 GiB) with thin pool0 (2 GiB), topolvm-node running, annotations up."""
    (node,) = uml_nodes(1, vg_gib=[6])
    node.lvm("lvcreate", "-T", "vg1/pool0", "-L", f"{2 * GiB}b", "-y")
    node.start_topolvm_node(cp, [THICK, THIN])
    await eventually_async(
        "capacity annotations",
        lambda: node_annotations(client, node.name),
        details=node.node_log,
    )
    return node


async def node_annotations(client: AsyncClient, node: str) -> dict[str, str]:
    obj = await api.get(client, Node, node)
    return dict(((obj or {}).get("metadata") or {}).get("annotations") or {})


async def create_lv(client: AsyncClient, node: str, size: int, **spec: str) -> tuple[str, str]:
    name = unique("lv")
    obj = {
        "apiVersion": f"{NORMAL.group}/v1",
        "kind": "LogicalVolume",
        "metadata": {"name": name},
        "spec": {"name": name, "nodeName": node, "size": str(size), **spec},
    }
    created = api.to_dict(await client.create(LV.from_dict(obj)))
    return name, created["metadata"]["uid"]


async def wait_status(
    client: AsyncClient, name: str, ready: Callable[[dict[str, Any]], bool] | None = None
) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        obj = await api.get(client, LV, name)
        st = (obj or {}).get("status") or {}
        done = ready(st) if ready else bool(st.get("volumeID") or st.get("code"))
        return st if done else None

    result: dict[str, Any] = await eventually_async(f"status of {name}", check)
    return result


async def test_reconciler_create_resize_snapshot_delete(
    control_plane: ControlPlane, uml_nodes: UmlNodes, cluster_client: AsyncClient
) -> None:
    node = await node_with_topolvm(control_plane, uml_nodes, cluster_client)
    name, uid = await create_lv(cluster_client, node.name, GiB)
    status = await wait_status(cluster_client, name)
    assert status == {"volumeID": uid, "currentSize": "1Gi"}
    assert int(node.lvs("vg1")[uid]["lv_size"]) == GiB
    obj = await api.get(cluster_client, LV, name)
    assert obj is not None and NORMAL.lv_finalizer in obj["metadata"]["finalizers"]

    await api.modify(
        cluster_client, LV, name, lambda o: bool(o["spec"].update(size=str(2 * GiB))) or True
    )
    await wait_status(cluster_client, name, lambda st: st.get("currentSize") == "2Gi")
    assert int(node.lvs("vg1")[uid]["lv_size"]) == 2 * GiB

    thin, thin_uid = await create_lv(cluster_client, node.name, GiB, deviceClass="thin")
    await wait_status(cluster_client, thin)
    snap, snap_uid = await create_lv(
        cluster_client, node.name, GiB, deviceClass="thin", source=thin, accessType="ro"
    )
    assert (await wait_status(cluster_client, snap))["volumeID"] == snap_uid
    lvs = node.lvs("vg1")
    assert lvs[snap_uid]["origin"] == thin_uid and lvs[snap_uid]["pool_lv"] == "pool0"

    for n in (snap, thin, name):
        await cluster_client.delete(LV, n)
    await eventually_async(
        "LogicalVolumes gone",
        lambda: _all_gone(cluster_client, [snap, thin, name]),
    )
    assert set(node.lvs("vg1")) == {"pool0"}


async def _all_gone(client: AsyncClient, names: list[str]) -> bool:
    return all([await api.get(client, LV, n) is None for n in names])


async def test_create_failure_is_reported_in_status(
    control_plane: ControlPlane, uml_nodes: UmlNodes, cluster_client: AsyncClient
) -> None:
    node = await node_with_topolvm(control_plane, uml_nodes, cluster_client)
    name, _ = await create_lv(cluster_client, node.name, 50 * GiB)
    status = await wait_status(cluster_client, name)
    assert status["code"] == 8  # RESOURCE_EXHAUSTED
    assert "no enough space" in status["message"]
    assert set(node.lvs("vg1")) == {"pool0"}
    await cluster_client.delete(LV, name)
    await eventually_async("object gone", lambda: _all_gone(cluster_client, [name]))


async def test_restart_mid_create_creates_each_lv_once(
    control_plane: ControlPlane, uml_nodes: UmlNodes, cluster_client: AsyncClient
) -> None:
    node = await node_with_topolvm(control_plane, uml_nodes, cluster_client)
    # The crash window: the LV exists, its status was never written.
    node.stop_topolvm_node(sig="SIGKILL")
    crashed, crashed_uid = await create_lv(cluster_client, node.name, GiB)
    node.lvm("lvcreate", "-n", crashed_uid, "-L", f"{GiB}b", "-W", "y", "-y", "vg1")
    # And creates in flight when the process is killed.
    node.start_topolvm_node(control_plane, [THICK, THIN])
    inflight = [await create_lv(cluster_client, node.name, GiB // 4) for _ in range(3)]
    await asyncio.sleep(0.3)
    node.stop_topolvm_node(sig="SIGKILL")
    node.start_topolvm_node(control_plane, [THICK, THIN])
    assert (await wait_status(cluster_client, crashed))["volumeID"] == crashed_uid
    for name, uid in inflight:
        assert (await wait_status(cluster_client, name))["volumeID"] == uid
    lvs = set(node.lvs("vg1")) - {"pool0"}
    assert lvs == {crashed_uid, *(uid for _, uid in inflight)}


async def test_capacity_annotations_follow_lvm_and_node_finalizer(
    control_plane: ControlPlane, uml_nodes: UmlNodes, cluster_client: AsyncClient
) -> None:
    node = await node_with_topolvm(control_plane, uml_nodes, cluster_client)
    annos = await node_annotations(cluster_client, node.name)
    vg_free = int(
        node.lvm(
            "vgs", "vg1", "--noheadings", "--units", "b", "--nosuffix", "-o", "vg_free"
        ).strip()
    )
    spare = GiB  # THICK has spare-gb: 1
    assert int(annos["capacity.topolvm.io/ssd"]) == vg_free - spare
    assert annos["capacity.topolvm.io/00default"] == annos["capacity.topolvm.io/ssd"]
    assert int(annos["capacity.topolvm.io/thin"]) == 10 * GiB  # 2 GiB pool x 5
    obj = await api.get(cluster_client, Node, node.name)
    assert obj is not None and NORMAL.node_finalizer in obj["metadata"]["finalizers"]

    # An LV made behind topolvm-node's back shows up in the annotation (lvmd's Watch).
    node.lvm("lvcreate", "-n", "outside", "-L", f"{GiB}b", "-W", "y", "-y", "vg1")
    before = int(annos["capacity.topolvm.io/ssd"])

    async def lowered() -> bool:
        return (
            int((await node_annotations(cluster_client, node.name))["capacity.topolvm.io/ssd"])
            == before - GiB
        )

    await eventually_async("annotation after an LV made outside", lowered, timeout=90)

    # Deleting the Node: the finalizer holds it, and topolvm-node stops exporting.
    await cluster_client.delete(Node, node.name)
    pending = await api.get(cluster_client, Node, node.name)
    assert pending is not None and pending["metadata"].get("deletionTimestamp")
    assert NORMAL.node_finalizer in pending["metadata"]["finalizers"]

"""topolvm-node (embedded lvmd) in a UML node with real LVM, against the real kube-apiserver:
the LogicalVolume reconciler, the capacity annotations, the node finalizer and the metrics.

Most tests share one node (``shared_node``, module scope) and give their LogicalVolumes unique
names; tests that restart topolvm-node, delete the Node or read exact capacities get their own.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import (
    NodeSet,
    UmlNodes,
    node_annotations,
    session_controller_paused,
    unique,
)
from tests.helpers import eventually
from tests.lvm_fixtures import THICK, THIN
from topolvm.constants import LEGACY, NORMAL, Names
from topolvm.k8s import api

pytestmark = pytest.mark.cluster
GiB = 1 << 30
LV = api.logicalvolume_resource(NORMAL)


@pytest.fixture(scope="module")
def shared_node(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[UmlNode]:
    """One UML node for the module: vg1 (10 GiB) with thin pool0 (2 GiB), topolvm-node up."""
    nodes = NodeSet(control_plane, unique("shared"), tmp_path_factory.mktemp("shared-node"))
    try:
        (node,) = nodes.make(1, vg_gib=[10])
        node.lvm("lvcreate", "-T", "vg1/pool0", "-L", f"{2 * GiB}b", "-y")
        node.start_topolvm_node(control_plane, [THICK, THIN])
        deadline = time.monotonic() + 60
        while "capacity.topolvm.io/ssd" not in control_plane.kubectl(
            "get", "node", node.name, "-o", "jsonpath={.metadata.annotations}"
        ):
            assert time.monotonic() < deadline, f"no annotations; log:\n{node.node_log()}"
            time.sleep(0.3)
        yield node
    finally:
        nodes.close()


async def node_with_topolvm(cp: ControlPlane, uml_nodes: UmlNodes, client: AsyncClient) -> UmlNode:
    """One UML node: vg1 (6 GiB) with thin pool0 (2 GiB), topolvm-node running, annotations up."""
    (node,) = uml_nodes(1, vg_gib=[6])
    node.lvm("lvcreate", "-T", "vg1/pool0", "-L", f"{2 * GiB}b", "-y")
    node.start_topolvm_node(cp, [THICK, THIN])
    await eventually(
        "capacity annotations",
        lambda: node_annotations(client, node.name),
        details=node.node_log,
    )
    return node


async def create_lv(
    client: AsyncClient, node: str, size: int | str, names: Names = NORMAL, **spec: str
) -> tuple[str, str]:
    return await create_lv_with(client, node, size, spec, names)


async def create_lv_with(
    client: AsyncClient, node: str, size: int | str, spec: dict[str, str], names: Names = NORMAL
) -> tuple[str, str]:
    """A LogicalVolume with a unique name; returns (name, uid)."""
    name = unique("lv")
    obj = {
        "apiVersion": f"{names.group}/v1",
        "kind": "LogicalVolume",
        "metadata": {"name": name},
        "spec": {"name": name, "nodeName": node, "size": str(size), **spec},
    }
    res = api.logicalvolume_resource(names)
    created = api.to_dict(await client.create(res.from_dict(obj)))
    return name, created["metadata"]["uid"]


async def wait_status(
    client: AsyncClient,
    name: str,
    ready: Callable[[dict[str, Any]], bool] | None = None,
    names: Names = NORMAL,
) -> dict[str, Any]:
    res = api.logicalvolume_resource(names)

    async def check() -> dict[str, Any] | None:
        obj = await api.get(client, res, name)
        st = (obj or {}).get("status") or {}
        done = ready(st) if ready else bool(st.get("volumeID") or st.get("code"))
        return st if done else None

    result: dict[str, Any] = await eventually(f"status of {name}", check)
    return result


async def lv_object(client: AsyncClient, name: str, names: Names = NORMAL) -> dict[str, Any]:
    obj = await api.get(client, api.logicalvolume_resource(names), name)
    assert obj is not None, f"LogicalVolume {name} not found"
    return obj


async def delete_and_wait(client: AsyncClient, *names: str) -> None:
    for n in names:
        await client.delete(LV, n)
    await eventually("LogicalVolumes gone", lambda: _all_gone(client, list(names)))


async def _all_gone(client: AsyncClient, names: list[str]) -> bool:
    return all([await api.get(client, LV, n) is None for n in names])


async def test_create_sets_status_finalizer_label_and_rounds_to_extents(
    shared_node: UmlNode, cluster_client: AsyncClient
) -> None:
    name, uid = await create_lv(cluster_client, shared_node.name, "1023Mi")  # 4 MiB extents
    status = await wait_status(cluster_client, name)
    assert status == {"volumeID": uid, "currentSize": "1Gi"}
    obj = await lv_object(cluster_client, name)
    assert obj["metadata"]["finalizers"] == [NORMAL.lv_finalizer]
    assert obj["metadata"]["labels"] == {"app.kubernetes.io/created-by": "topolvm-controller"}
    assert int(shared_node.lvs("vg1")[uid]["lv_size"]) == GiB
    await delete_and_wait(cluster_client, name)
    assert uid not in shared_node.lvs("vg1")


async def test_lv_for_another_node_is_left_alone(
    shared_node: UmlNode, cluster_client: AsyncClient
) -> None:
    other, _ = await create_lv(cluster_client, "some-other-node", GiB)
    mine, mine_uid = await create_lv(cluster_client, shared_node.name, GiB)
    await wait_status(cluster_client, mine)
    obj = await lv_object(cluster_client, other)
    assert "status" not in obj and "finalizers" not in obj["metadata"]
    assert not any(lv.startswith(obj["metadata"]["uid"]) for lv in shared_node.lvs("vg1"))
    await delete_and_wait(cluster_client, mine, other)
    assert mine_uid not in shared_node.lvs("vg1")


async def test_resize_grows_the_lv_and_keeps_a_concurrent_writers_change(
    shared_node: UmlNode, cluster_client: AsyncClient
) -> None:
    name, uid = await create_lv(cluster_client, shared_node.name, GiB)
    await wait_status(cluster_client, name)
    touched = {"metadata": {"annotations": {"example.com/touched": "yes"}}}
    await api.patch_merge(cluster_client, LV, name, touched)
    await api.patch_merge(cluster_client, LV, name, {"spec": {"size": str(2 * GiB)}})
    await wait_status(cluster_client, name, lambda st: st.get("currentSize") == "2Gi")
    assert int(shared_node.lvs("vg1")[uid]["lv_size"]) == 2 * GiB
    obj = await lv_object(cluster_client, name)
    assert obj["metadata"]["annotations"] == {"example.com/touched": "yes"}
    await delete_and_wait(cluster_client, name)


async def test_create_failure_is_final_with_code_and_message(
    control_plane: ControlPlane, uml_nodes: UmlNodes, cluster_client: AsyncClient
) -> None:
    node = await node_with_topolvm(control_plane, uml_nodes, cluster_client)
    # vg1 has 6 GiB: pool0 takes 2, "filler" 2.5, so a 2 GiB request (1 GiB spare) fails.
    node.lvm("lvcreate", "-n", "filler", "-L", f"{5 * GiB // 2}b", "-W", "y", "-y", "vg1")
    name, uid = await create_lv(cluster_client, node.name, 2 * GiB)
    status = await wait_status(cluster_client, name)
    assert status["code"] == 8  # RESOURCE_EXHAUSTED
    assert "no enough space" in status["message"] and "volumeID" not in status
    # Room again, and a reconcile of the object: the failed create is not retried.
    node.lvm("lvremove", "-y", "vg1/filler")
    await api.patch_merge(cluster_client, LV, name, {"metadata": {"annotations": {"x": "1"}}})
    await asyncio.sleep(2)
    assert uid not in node.lvs("vg1")
    assert (await lv_object(cluster_client, name))["status"] == status
    await delete_and_wait(cluster_client, name)


@pytest.mark.parametrize(
    ("spec", "code", "text"),
    [
        ({"deviceClass": "nvme"}, 5, "device-class not found"),  # NOT_FOUND
        # a thick snapshot is an LV of its own, filled by a copy: it needs the VG's room
        ({"source": "THICK_SOURCE", "accessType": "ro", "size": "1000Gi"}, 8, "no enough space"),
    ],
    ids=["unknown-device-class", "snapshot-of-thick-past-the-vg"],
)
async def test_requests_lvmd_refuses_get_its_code(
    shared_node: UmlNode, cluster_client: AsyncClient, spec: dict[str, str], code: int, text: str
) -> None:
    made = []
    if spec.get("source") == "THICK_SOURCE":
        thick, _ = await create_lv(cluster_client, shared_node.name, GiB)
        await wait_status(cluster_client, thick)
        made.append(thick)
        spec = {**spec, "source": thick}
    name, _ = await create_lv_with(cluster_client, shared_node.name, GiB, spec)
    status = await wait_status(cluster_client, name)
    assert status["code"] == code and text in status["message"]
    await delete_and_wait(cluster_client, name, *made)


async def test_thin_snapshot_and_clone(shared_node: UmlNode, cluster_client: AsyncClient) -> None:
    src, src_uid = await create_lv(cluster_client, shared_node.name, GiB, deviceClass="thin")
    await wait_status(cluster_client, src)
    snap, snap_uid = await create_lv(
        cluster_client, shared_node.name, GiB, deviceClass="thin", source=src, accessType="ro"
    )
    clone, clone_uid = await create_lv(
        cluster_client, shared_node.name, 2 * GiB, deviceClass="thin", source=src, accessType="rw"
    )
    assert await wait_status(cluster_client, snap) == {"volumeID": snap_uid, "currentSize": "1Gi"}
    assert await wait_status(cluster_client, clone) == {
        "volumeID": clone_uid,
        "currentSize": "2Gi",
    }
    lvs = shared_node.lvs("vg1")
    assert lvs[snap_uid]["origin"] == src_uid and lvs[clone_uid]["origin"] == src_uid
    assert lvs[snap_uid]["lv_attr"][1] == "r" and lvs[clone_uid]["lv_attr"][1] == "w"
    assert lvs[snap_uid]["pool_lv"] == "pool0"
    await delete_and_wait(cluster_client, snap, clone, src)
    assert not {src_uid, snap_uid, clone_uid} & set(shared_node.lvs("vg1"))


async def test_delete_when_the_lv_is_already_gone(
    shared_node: UmlNode, cluster_client: AsyncClient
) -> None:
    name, uid = await create_lv(cluster_client, shared_node.name, GiB)
    await wait_status(cluster_client, name)
    shared_node.lvm("lvremove", "-y", f"vg1/{uid}")
    await delete_and_wait(cluster_client, name)


async def test_pending_deletion_annotation_is_left_alone(
    shared_node: UmlNode, cluster_client: AsyncClient
) -> None:
    name, uid = await create_lv(cluster_client, shared_node.name, GiB)
    await wait_status(cluster_client, name)
    await api.patch_merge(
        cluster_client,
        LV,
        name,
        {"metadata": {"annotations": {"topolvm.io/pendingdeletion": "true"}, "finalizers": []}},
    )
    await asyncio.sleep(1.5)  # reconciles of the patched object leave it alone
    assert (await lv_object(cluster_client, name))["metadata"].get("finalizers") is None
    await delete_and_wait(cluster_client, name)
    await asyncio.sleep(0.5)
    assert uid in shared_node.lvs("vg1")  # the node's cleanup path never removes LVs itself
    shared_node.lvm("lvremove", "-y", f"vg1/{uid}")


def metrics(node: UmlNode) -> dict[tuple[str, str], float]:
    """topolvm-node's /metrics in the guest: (name, device_class) -> value for this node."""
    from prometheus_client.parser import text_string_to_metric_families

    text = node.http_get(8080, "/metrics")
    return {
        (s.name, s.labels["device_class"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("node") == node.name and "device_class" in s.labels
    }


async def test_metrics_describe_the_volume_group_and_thin_pool(shared_node: UmlNode) -> None:
    vgs = json.loads(
        shared_node.lvm("vgs", "vg1", "--reportformat", "json", "--units", "b", "--nosuffix",
                        "-o", "vg_size,vg_free")
    )["report"][0]["vg"][0]  # fmt: skip
    samples = await eventually(
        "metrics", lambda: asyncio.to_thread(metrics, shared_node), timeout=30
    )
    assert samples["topolvm_volumegroup_size_bytes", "ssd"] == int(vgs["vg_size"])
    assert samples["topolvm_thinpool_size_bytes", "thin"] == 2 * GiB
    assert samples["topolvm_thinpool_overprovisioned_available", "thin"] > 0
    for metric in ("topolvm_thinpool_data_percent", "topolvm_thinpool_metadata_percent"):
        assert 0 <= samples[metric, "thin"] <= 100
    assert ("topolvm_thinpool_size_bytes", "ssd") not in samples


async def test_legacy_group_and_names(
    control_plane: ControlPlane, uml_nodes: UmlNodes, cluster_client: AsyncClient
) -> None:
    (node,) = uml_nodes(1, vg_gib=[4])
    node.start_topolvm_node(control_plane, [THICK], "--legacy")
    name, uid = await create_lv(cluster_client, node.name, GiB, names=LEGACY)
    assert (await wait_status(cluster_client, name, names=LEGACY))["volumeID"] == uid
    obj = await lv_object(cluster_client, name, LEGACY)
    assert obj["metadata"]["finalizers"] == [LEGACY.lv_finalizer]
    assert await api.get(cluster_client, LV, name) is None  # nothing in the topolvm.io group
    annos = await eventually(
        "legacy annotations", lambda: node_annotations(cluster_client, node.name)
    )
    assert "capacity.topolvm.cybozu.com/00default" in annos
    assert not any(k.startswith("capacity.topolvm.io/") for k in annos)
    node_obj = await api.get(cluster_client, Node, node.name)
    assert node_obj is not None and node_obj["metadata"]["finalizers"] == [LEGACY.node_finalizer]


async def test_restart_mid_create_creates_each_lv_once(
    control_plane: ControlPlane, uml_nodes: UmlNodes, cluster_client: AsyncClient
) -> None:
    node = await node_with_topolvm(control_plane, uml_nodes, cluster_client)
    # The crash window: the LV exists, its status was never written.
    node.stop_topolvm_node(sig="SIGKILL")
    crashed, crashed_uid = await create_lv(cluster_client, node.name, GiB)
    node.lvm("lvcreate", "-n", crashed_uid, "-L", f"{GiB}b", "-W", "y", "-y", "vg1")
    # And creates in flight when the process is killed: kill it as soon as the first LV of a
    # burst exists, so the others are queued or half done.
    node.start_topolvm_node(control_plane, [THICK, THIN])
    inflight = [await create_lv(cluster_client, node.name, GiB // 4) for _ in range(4)]
    uids = {uid for _, uid in inflight}

    def first_lv_made() -> bool:
        return bool(uids & set(node.lvs("vg1")))

    await eventually("the first LV of the burst", lambda: asyncio.to_thread(first_lv_made))
    node.stop_topolvm_node(sig="SIGKILL")
    node.start_topolvm_node(control_plane, [THICK, THIN])
    assert (await wait_status(cluster_client, crashed))["volumeID"] == crashed_uid
    statuses = {name: await wait_status(cluster_client, name) for name, _ in inflight}
    for name, uid in inflight:
        assert statuses[name]["volumeID"] == uid
    lvs = set(node.lvs("vg1")) - {"pool0"}
    assert lvs == {crashed_uid, *uids}
    # A restart of a node with nothing left to do changes nothing.
    node.stop_topolvm_node()
    node.start_topolvm_node(control_plane, [THICK, THIN])
    await eventually(
        "capacity annotations again", lambda: node_annotations(cluster_client, node.name)
    )
    await asyncio.sleep(2)
    assert set(node.lvs("vg1")) - {"pool0"} == lvs
    for name, _ in inflight:
        assert (await lv_object(cluster_client, name))["status"] == statuses[name]


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
    assert obj is not None and obj["metadata"]["finalizers"] == [NORMAL.node_finalizer]
    samples = await asyncio.to_thread(metrics, node)
    assert samples["topolvm_volumegroup_available_bytes", "ssd"] == vg_free - spare
    assert samples["topolvm_thinpool_overprovisioned_available", "thin"] == 10 * GiB

    # An LV made behind topolvm-node's back shows up in the annotation (lvmd's Watch).
    node.lvm("lvcreate", "-n", "outside", "-L", f"{GiB}b", "-W", "y", "-y", "vg1")
    before = int(annos["capacity.topolvm.io/ssd"])

    async def lowered() -> bool:
        return (
            int((await node_annotations(cluster_client, node.name))["capacity.topolvm.io/ssd"])
            == before - GiB
        )

    # the kernel's device event, not the periodic report (every 600 s)
    await eventually("annotation after an LV made outside", lowered, timeout=15)
    samples = await asyncio.to_thread(metrics, node)
    assert samples["topolvm_volumegroup_available_bytes", "ssd"] == vg_free - spare - GiB

    # Deleting the Node: the finalizer holds it, and topolvm-node stops exporting. (A running
    # topolvm-controller would clean the Node up at once, LogicalVolumes included: paused.)
    with session_controller_paused():
        await cluster_client.delete(Node, node.name)
        pending = await api.get(cluster_client, Node, node.name)
        assert pending is not None and pending["metadata"].get("deletionTimestamp")
        assert NORMAL.node_finalizer in pending["metadata"]["finalizers"]
        # The next change lvmd reports makes the exporter stop; LogicalVolumes still reconcile.
        name, _ = await create_lv(cluster_client, node.name, GiB)
        await wait_status(cluster_client, name)
        await eventually(
            "the exporter to stop",
            lambda: asyncio.to_thread(lambda: "no more capacity updates" in node.node_log(lines=0)),
        )

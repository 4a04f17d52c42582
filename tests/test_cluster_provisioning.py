"""PVC → CSIStorageCapacity → kube-scheduler → CreateVolume → LogicalVolume → LV → mount, on
the real control plane with the real csi-provisioner and UML nodes with real LVM (spec §13:
scheduling by capacity, filesystems, block, minimum allocations)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import unique
from tests.helpers import eventually
from tests.lvm_fixtures import THICK
from tests.provisioning import (
    GiB,
    MiB,
    Scenario,
    bound,
    claim,
    pod,
    pvc,
    scheduled,
    shared_nodes,
    unschedulable_message,
)
from topolvm.k8s import api

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def three_nodes(
    control_plane: ControlPlane, driver: DriverStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[UmlNode]]:
    """Three UML nodes with about 2, 11 and 4 GiB free in device class ssd (1 GiB spare)."""
    with shared_nodes(
        control_plane, tmp_path_factory.mktemp("prov"), "prov", [3, 12, 5], [THICK]
    ) as nodes:
        yield nodes


@pytest.fixture
async def three(
    control_plane: ControlPlane,
    three_nodes: list[UmlNode],
    cluster_client: AsyncClient,
) -> AsyncIterator[Scenario]:
    """A scenario on :func:`three_nodes` that must leave them as it found them."""
    nodes = three_nodes
    s = Scenario(control_plane, cluster_client, nodes)
    await s.record()
    try:
        yield s
    finally:
        await s.clean()


async def test_pod_lands_where_its_volume_fits_and_a_second_one_does_not_fit(
    three: Scenario,
) -> None:
    s = three
    sc = s.sc(fs_type="xfs")
    first, second = unique("data"), unique("data")
    app1, app2 = unique("app"), unique("app")
    s.apply(claim(first, sc, "6Gi"), pod(app1, s.group, [first]))
    assert await scheduled(s.client, app1) == s.nodes[1].name
    pvc = await bound(s.client, first)
    assert pvc["status"]["capacity"]["storage"] == "6Gi"
    [fs] = await s.running(app1)
    roomy = s.nodes[1]
    assert roomy.mounts()[fs.target]["fstype"] == "xfs"
    assert int(roomy.lvs("vg1")[fs.volume_id]["lv_size"]) == 6 * GiB

    # 11 - 6 = 5 GiB left there, 2 and 4 elsewhere: a second 6Gi claim fits nowhere.
    s.apply(claim(second, sc, "6Gi"), pod(app2, s.group, [second]))
    message = await unschedulable_message(s.client, app2, "did not have enough free storage")
    assert "did not have enough free storage" in message, message


@pytest.mark.parametrize(
    ("fs_type", "request_size", "expected"),
    [("xfs", "100Mi", 300 * MiB), ("btrfs", "100Mi", 200 * MiB), ("ext4", "1Mi", 32 * MiB)],
)
async def test_filesystems_and_minimum_allocations(
    three: Scenario, fs_type: str, request_size: str, expected: int
) -> None:
    s = three
    sc = s.sc(fs_type=fs_type)
    data, app = unique("data"), unique("app")
    s.apply(claim(data, sc, request_size), pod(app, s.group, [data]))
    node = await scheduled(s.client, app)
    pvc = await bound(s.client, data)
    assert pvc["status"]["capacity"]["storage"] == f"{expected // MiB}Mi"
    [fs] = await s.running(app)
    uml = next(n for n in s.nodes if n.name == node)
    assert uml.mounts()[fs.target]["fstype"] == fs_type
    s.exec(app, f"echo hello > /{data}/file && sync")  # in the container
    assert uml.exec("cat", f"{fs.target}/file").stdout == "hello\n"  # on the volume


async def test_block_volume_gets_the_block_minimum(three: Scenario) -> None:
    s = three
    sc = s.sc(fs_type=None)
    raw, app = unique("raw"), unique("app")
    s.apply(claim(raw, sc, "1Mi", block=True), pod(app, s.group, block=[raw]))
    node = await scheduled(s.client, app)
    pvc = await bound(s.client, raw)
    assert pvc["status"]["capacity"]["storage"] == "8Mi"
    [dev] = await s.running(app)
    uml = next(n for n in s.nodes if n.name == node)
    assert int(uml.exec("blockdev", "--getsize64", dev.target).stdout) == 8 * MiB
    assert int(s.exec(app, f"blockdev --getsize64 /dev/{raw}")) == 8 * MiB  # in the container


async def _grow(s: Scenario, name: str, size: str) -> None:
    await api.patch_merge(
        s.client, PersistentVolumeClaim, name,
        {"spec": {"resources": {"requests": {"storage": size}}}}, namespace="default",
    )  # fmt: skip


async def _resize_pending(s: Scenario, name: str) -> None:
    async def check() -> bool:
        obj = await pvc(s.client, name)
        conds = (obj or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == "FileSystemResizePending" for c in conds)

    await eventually(f"{name} waits for the node's part of the resize", check, timeout=90)


def _df(node: UmlNode, target: str) -> int:
    return int(node.exec("df", "-B1", "--output=size", target).stdout.split()[-1])


def _df_in(s: Scenario, pod_name: str, path: str) -> int:
    """The filesystem's size as ``df`` in the pod's container reports it."""
    return int(s.exec(pod_name, f"df -k {path} | tail -1").split()[-5]) * 1024


async def test_online_then_offline_resize(three: Scenario) -> None:
    s = three
    sc = s.sc(fs_type="xfs")
    data, app = unique("data"), unique("app")
    s.apply(claim(data, sc, "1Gi"), pod(app, s.group, [data]))
    node_name = await scheduled(s.client, app)
    node = next(n for n in s.nodes if n.name == node_name)
    await bound(s.client, data)
    [fs] = await s.running(app)
    s.exec(app, f"echo kept > /{data}/file && sync")

    # online: csi-resizer -> ControllerExpandVolume raises the LV; the kubelet has the node
    # grow xfs under the running container
    await _grow(s, data, "2Gi")
    await s.expanded(data)
    assert int(node.lvs("vg1")[fs.volume_id]["lv_size"]) == 2 * GiB
    assert _df(node, fs.target) > GiB + GiB // 2
    assert _df_in(s, app, f"/{data}") > GiB + GiB // 2
    claimed = await pvc(s.client, data)
    assert claimed is not None and claimed["status"]["capacity"]["storage"] == "2Gi"

    # offline: no pod; the filesystem grows when the next pod publishes it
    await s.delete_pod(app)
    await _grow(s, data, "3Gi")
    await _resize_pending(s, data)
    assert int(node.lvs("vg1")[fs.volume_id]["lv_size"]) == 3 * GiB
    app2 = unique("app")
    s.apply(pod(app2, s.group, [data]))
    assert await scheduled(s.client, app2) == node_name
    [fs2] = await s.running(app2)
    assert _df(node, fs2.target) > 2 * GiB + GiB // 2
    assert s.exec(app2, f"cat /{data}/file") == "kept\n"


async def test_immediate_binding_then_the_pod_follows_its_volume(three: Scenario) -> None:
    s = three
    sc = s.sc(fs_type="ext4", binding="Immediate")
    data, app = unique("data"), unique("app")
    s.apply(claim(data, sc, "1Gi"))
    bound_claim = await bound(s.client, data)
    pv = await api.get(s.client, PersistentVolume, bound_claim["spec"]["volumeName"])
    assert pv is not None
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    [volume_node] = terms[0]["matchExpressions"][0]["values"]
    assert volume_node in {n.name for n in s.nodes}
    s.apply(pod(app, s.group, [data]))
    assert await scheduled(s.client, app) == volume_node


async def test_generic_ephemeral_volume_lives_and_dies_with_its_pod(three: Scenario) -> None:
    s = three
    sc = s.sc(fs_type="xfs")
    app = unique("app")
    template = {"spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": sc,
                         "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    s.apply(pod(app, s.group, ephemeral=template))
    claim_name = f"{app}-scratch"
    await scheduled(s.client, app)
    await bound(s.client, claim_name)
    [fs] = await s.running(app)
    assert fs.pvc == claim_name
    await s.delete_pod(app)

    async def claim_gone() -> bool:
        return await pvc(s.client, claim_name) is None

    await eventually("the ephemeral claim deleted with its pod", claim_gone, timeout=90)


async def test_unknown_device_class_never_schedules(three: Scenario) -> None:
    s = three
    sc = s.sc(device_class="not-found-device")
    data, app = unique("data"), unique("app")
    s.apply(claim(data, sc, "1Gi"), pod(app, s.group, [data]))
    message = await unschedulable_message(s.client, app, "did not have enough free storage")
    assert "did not have enough free storage" in message, message

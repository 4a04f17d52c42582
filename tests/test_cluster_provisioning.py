"""PVC → CSIStorageCapacity → kube-scheduler → CreateVolume → LogicalVolume → LV → mount, on
the real control plane with the real csi-provisioner and UML nodes with real LVM (spec §13:
scheduling by capacity, filesystems, block, minimum allocations)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from lightkube import AsyncClient

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.kubelet import KubeletStandIn
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import UmlNodes, unique
from tests.lvm_fixtures import THICK
from tests.provisioning import (
    GiB,
    MiB,
    Scenario,
    bound,
    claim,
    pod,
    scheduled,
    unschedulable_message,
)

pytestmark = pytest.mark.cluster


@pytest.fixture
async def three(
    control_plane: ControlPlane,
    driver: DriverStack,
    uml_nodes: UmlNodes,
    kubelet: Callable[[list[UmlNode]], KubeletStandIn],
    cluster_client: AsyncClient,
) -> AsyncIterator[Scenario]:
    """Three UML nodes with about 2, 11 and 4 GiB free in device class ssd (1 GiB spare)."""
    nodes = uml_nodes(3, vg_gib=[3, 12, 5])
    for n in nodes:
        n.start_topolvm_node(control_plane, [THICK])
    s = Scenario(control_plane, cluster_client, nodes, kubelet(nodes))
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
    [fs] = await s.kubelet.start_pod(app1)  # type: ignore[union-attr]
    roomy = s.nodes[1]
    assert roomy.mounts()[fs.target]["fstype"] == "xfs"
    assert int(roomy.lvs("vg1")[fs.volume_id]["lv_size"]) == 6 * GiB

    # 11 - 6 = 5 GiB left there, 2 and 4 elsewhere: a second 6Gi claim fits nowhere.
    s.apply(claim(second, sc, "6Gi"), pod(app2, s.group, [second]))
    message = await unschedulable_message(s.client, app2)
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
    [fs] = await s.kubelet.start_pod(app)  # type: ignore[union-attr]
    uml = next(n for n in s.nodes if n.name == node)
    assert uml.mounts()[fs.target]["fstype"] == fs_type
    uml.exec("sh", "-c", f"echo hello > {fs.target}/file && sync")
    assert uml.exec("cat", f"{fs.target}/file").stdout == "hello\n"


async def test_block_volume_gets_the_block_minimum(three: Scenario) -> None:
    s = three
    sc = s.sc(fs_type=None)
    raw, app = unique("raw"), unique("app")
    s.apply(claim(raw, sc, "1Mi", block=True), pod(app, s.group, block=[raw]))
    node = await scheduled(s.client, app)
    pvc = await bound(s.client, raw)
    assert pvc["status"]["capacity"]["storage"] == "8Mi"
    [dev] = await s.kubelet.start_pod(app)  # type: ignore[union-attr]
    uml = next(n for n in s.nodes if n.name == node)
    assert int(uml.exec("blockdev", "--getsize64", dev.target).stdout) == 8 * MiB

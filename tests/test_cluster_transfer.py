"""Data that leaves its node (docs/transfer.md), end to end: pods on real kubelets write random
bytes and a filesystem tree on node A; restores and clones on node B read them back identically,
from thin and thick snapshots and volumes; a snapshot kept on node C by its class outlives node A
(powered off, its Node deleted). The copies run between the nodes' topolvm-node processes over
their TLS transfer ports, authenticated with the nodes' ServiceAccount tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from lightkube import AsyncClient

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import unique
from tests.lvm_fixtures import THICK, THIN
from tests.provisioning import GiB, Scenario, bound, claim, shared_nodes
from tests.transfer_helpers import (
    MiB,
    from_snapshot,
    logical_volume_of,
    metric,
    on_node,
    read_sums,
    ready_snapshot,
    snapshot,
    snapshot_class,
    write_data,
)
from topolvm.k8s.lvobject import CopyPhase

pytestmark = pytest.mark.cluster


def _pool(node: UmlNode) -> None:
    node.lvm("lvcreate", "-T", "vg1/pool0", "-L", "3g")


@pytest.fixture(scope="module")
def abc_nodes(
    control_plane: ControlPlane, driver: DriverStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[UmlNode]]:
    with shared_nodes(control_plane, tmp_path_factory.mktemp("xfer"), "xfer", [8, 8, 8],
                      [THICK, THIN], prepare=_pool) as nodes:  # fmt: skip
        yield nodes


@pytest.fixture
async def abc(
    control_plane: ControlPlane, abc_nodes: list[UmlNode], cluster_client: AsyncClient
) -> AsyncIterator[Scenario]:
    s = Scenario(control_plane, cluster_client, abc_nodes)
    await s.record()
    try:
        yield s
    finally:
        await s.clean()


async def test_a_thin_snapshot_restores_on_another_node_sending_only_its_blocks(
    abc: Scenario,
) -> None:
    s = abc
    a, b, _ = s.nodes
    thin = s.sc(device_class="thin", fs_type="xfs")
    vsc = unique("vsc")
    s.apply(snapshot_class(vsc))
    src, writer = unique("src"), unique("writer")
    s.apply(claim(src, thin, "1Gi"), on_node(writer, s.group, a.name, [src]))
    await s.running(writer)
    sums = write_data(s, writer, src, mib=96)  # about 10% of the volume
    snap = unique("snap")
    s.apply(snapshot(snap, vsc, src))
    ready = await ready_snapshot(s, snap)
    content = s.cp.kubectl("get", "volumesnapshotcontent",
                           ready["status"]["boundVolumeSnapshotContentName"], "-o", "json")  # fmt: skip
    assert "nodeAffinity" not in content  # KEP-5943: nothing confines its restores to node A

    sent_before = metric(a, "topolvm_transfer_data_bytes_total", role="sender")
    restored, reader = unique("restored"), unique("reader")
    s.apply(claim(restored, thin, "1Gi", source=from_snapshot(snap)),
            on_node(reader, s.group, b.name, [restored]))  # fmt: skip
    [published] = await s.running(reader, timeout=300)
    assert read_sums(s, reader, restored).replace(restored, src) == sums
    target = await logical_volume_of(s, published.volume_id)
    assert target.node_name == b.name and target.copy is not None
    assert target.copy.phase == CopyPhase.DONE and target.copy.source_node == a.name
    sent = metric(a, "topolvm_transfer_data_bytes_total", role="sender") - sent_before
    # the mapped blocks: the data written, the filesystem's metadata and log; not the GiB
    assert 96 * MiB <= sent <= 0.2 * GiB, sent
    assert target.copy.transferred_bytes == sent

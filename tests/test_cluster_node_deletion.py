"""Node deletion cleanup through the whole driver (spec §8.1, §13 "CSI sanity" node deletion):
deleting a Node that carries topolvm-node's finalizer makes topolvm-controller delete the
node's claims (WaitForFirstConsumer, selected there) and LogicalVolumes, then release the Node;
csi-provisioner's DeleteVolume of the released PV then succeeds (the volume is gone)."""

from __future__ import annotations

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, PersistentVolume

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from tests.cluster_fixtures import UmlNodes, unique
from tests.helpers import eventually
from tests.lvm_fixtures import THICK
from tests.provisioning import Scenario, bound, claim, pod, pvc, scheduled
from topolvm.constants import NORMAL
from topolvm.k8s import api

pytestmark = pytest.mark.cluster
LV = api.logicalvolume_resource(NORMAL)


async def test_deleting_a_node_removes_its_claims_and_volumes(
    control_plane: ControlPlane,
    driver: DriverStack,
    uml_nodes: UmlNodes,
    cluster_client: AsyncClient,
) -> None:
    [uml] = uml_nodes(1, vg_gib=[6])
    uml.start_topolvm_node(control_plane, [THICK])
    s = Scenario(control_plane, cluster_client, [uml])
    await s.record()
    node = await api.get(cluster_client, Node, uml.name)
    assert node is not None and NORMAL.node_finalizer in node["metadata"]["finalizers"]
    sc = s.sc(fs_type="xfs")
    data, app = unique("data"), unique("app")
    s.apply(claim(data, sc, "1Gi"), pod(app, s.group, [data]))
    await scheduled(cluster_client, app)
    pv_name = (await bound(cluster_client, data))["spec"]["volumeName"]
    assert await api.get(cluster_client, LV, pv_name) is not None
    uml.stop_topolvm_node()  # the machine is going away
    await s.delete_pod(app)

    control_plane.kubectl("delete", "node", uml.name, "--wait=false")

    async def cleaned() -> bool:
        return (
            await api.get(cluster_client, Node, uml.name) is None
            and await pvc(cluster_client, data) is None
            and await api.get(cluster_client, LV, pv_name) is None
            and await api.get(cluster_client, PersistentVolume, pv_name) is None
        )

    await eventually("Node, claim, LogicalVolume and PV removed", cleaned, timeout=120)
    control_plane.kubectl("delete", "storageclass", sc, check=False)

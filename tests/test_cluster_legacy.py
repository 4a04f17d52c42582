"""Legacy mode (``USE_LEGACY`` / ``--legacy``): the whole path with the topolvm.cybozu.com names
(driver, CRD group, annotations, topology key), next to a topolvm.io driver in the same cluster."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from lightkube import AsyncClient

from devtools import gobuild
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import SIDECAR_BINARIES, DriverStack
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import unique
from tests.helpers import eventually
from tests.lvm_fixtures import THICK
from tests.provisioning import Scenario, bound, claim, pod, scheduled, shared_nodes
from topolvm.constants import LEGACY, NORMAL
from topolvm.k8s import api

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def legacy_driver(
    control_plane: ControlPlane, driver: DriverStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DriverStack]:
    bins = gobuild.ensure(*SIDECAR_BINARIES)
    stack = DriverStack(control_plane, bins, tmp_path_factory.mktemp("legacy-driver"),
                        legacy=True, health_port=18181, metrics_port=18180).start()  # fmt: skip
    try:
        yield stack
    finally:
        stack.stop()
        control_plane.kubectl("delete", "csidriver", LEGACY.plugin, check=False)


@pytest.fixture(scope="module")
def legacy_node(
    control_plane: ControlPlane, legacy_driver: DriverStack,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[UmlNode]]:  # fmt: skip
    """A Kubernetes node whose topolvm-node (legacy) registers with the kubelet: the kubelet
    writes the CSINode and the topology label with the legacy names."""
    with shared_nodes(
        control_plane, tmp_path_factory.mktemp("legacy"), "legacy", [6], [THICK],
        extra=("--legacy",),
    ) as nodes:  # fmt: skip
        yield nodes


@pytest.fixture
async def one(
    control_plane: ControlPlane,
    legacy_node: list[UmlNode],
    cluster_client: AsyncClient,
) -> AsyncIterator[Scenario]:
    s = Scenario(control_plane, cluster_client, legacy_node, names=LEGACY)
    await s.record()
    try:
        yield s
    finally:
        await s.clean()


async def test_legacy_names_end_to_end(one: Scenario) -> None:
    s = one
    uml = s.nodes[0]

    def drivers() -> Any:  # the kubelet writes them once topolvm-node registered
        csinode = json.loads(s.cp.kubectl("get", "csinode", uml.name, "-o", "json"))
        return csinode["spec"].get("drivers")

    registered = await eventually("the kubelet's CSINode entry", drivers, timeout=60)
    assert registered == [
        {"name": LEGACY.plugin, "nodeID": uml.name, "topologyKeys": [LEGACY.topology_key]}
    ]
    node = json.loads(s.cp.kubectl("get", "node", uml.name, "-o", "json"))
    assert node["metadata"]["labels"][LEGACY.topology_key] == uml.name
    sc = s.sc(fs_type="xfs")
    data, app = unique("data"), unique("app")
    s.apply(claim(data, sc, "1Gi"), pod(app, s.group, [data]))
    assert await scheduled(s.client, app) == uml.name
    obj = await bound(s.client, data)
    lv = await api.get(s.client, api.logicalvolume_resource(LEGACY), obj["spec"]["volumeName"])
    assert lv is not None and lv["apiVersion"] == "topolvm.cybozu.com/v1"
    normal = api.logicalvolume_resource(NORMAL)
    assert await api.get(s.client, normal, obj["spec"]["volumeName"]) is None
    [fs] = await s.running(app)
    assert uml.mounts()[fs.target]["fstype"] == "xfs"
    assert list(uml.lvs("vg1")) == [lv["status"]["volumeID"]]

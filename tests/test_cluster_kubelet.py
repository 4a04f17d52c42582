"""The product as it ships, on real kubelets: the chart installed with helm, its topolvm-node
and controller pods run by containerd on two UML nodes, and user pods (busybox) that write to
and read from their volumes. What a kubelet does that no stand-in did: registration through
topolvm-node's plugin socket (CSINode and topology label from the kubelet), fsGroup, block
devices in a container, NodeExpandVolume under a running container, a kubelet restart with
volumes mounted, and the node plugin's container killed and restarted by its kubelet."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from lightkube.resources.core_v1 import PersistentVolumeClaim

from devtools.testbed import chart
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.kubenode import CONTAINERD_SOCKET, KubeNode
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import GROUP_LABEL, NodeSet, chart_release, unique
from tests.helpers import eventually
from tests.provisioning import NS, GiB, Published, Scenario, bound, claim, pod, runtime_logs
from topolvm.k8s import api

pytestmark = [pytest.mark.cluster, pytest.mark.asyncio(loop_scope="module")]

SSD = {"name": "ssd", "volume-group": "vg1", "default": True, "spare-gb": 1}
VALUES: dict[str, Any] = {
    "lvmd": {"managed": False, "deviceClasses": [SSD]},
    "node": {"lvmdEmbedded": True},
    # Leader election's renew deadline is 10 s by default. In a full CI session, with two
    # cores shared by the control plane and both guests, the controller pod in its
    # single-CPU guest lost its lease every half minute and crash-looped (a renewal or its
    # HTTP probe not answered within the deadline), so no claim was provisioned. This module
    # tests what the kubelet does; the lease is given room here.
    "controller": {"replicaCount": 1, "args": [
        "--leader-election-lease-duration=60s", "--leader-election-renew-deadline=45s",
        "--leader-election-retry-period=5s"]},
    "storageClasses": [{"name": "kubelet-xfs", "storageClass": {
        "fsType": "xfs", "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": True}}],
}  # fmt: skip
SC = "kubelet-xfs"


@dataclass
class Cluster:
    nodes: list[UmlNode]
    kubes: dict[str, KubeNode]
    release: chart.Release

    def diagnose(self) -> str:
        """The chart's pods, events and controller log's tail, for a wait that timed out."""
        logs = self.release.logs()
        ctl = "\n".join(f"--- {k}\n{v[-3000:]}" for k, v in logs.items() if "controller" in k)
        return f"{self.release.describe()}\n{ctl}"

    def node_pod(self, node: str) -> dict[str, Any]:
        """The chart's topolvm-node pod on that node (its DaemonSet's, by component label)."""
        component = "app.kubernetes.io/component"
        [found] = [p for p in self.release.pods() if p["spec"].get("nodeName") == node
                   and p["metadata"]["labels"].get(component) == "node"]  # fmt: skip
        return found


@pytest.fixture(scope="module")
def cluster(
    control_plane: ControlPlane, driver: DriverStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Two Kubernetes nodes (8 GiB vg1 each) and the chart on them."""
    nodes = NodeSet(control_plane, unique("kl"), tmp_path_factory.mktemp("kubelet"))
    try:
        made = nodes.make(2, vg_gib=[8, 8], kubelet=True, driver_images=True)
        with chart_release(control_plane, driver, "topolvm-kubelet") as release:
            values = chart.merged(VALUES, chart.testbed_values({GROUP_LABEL: nodes.prefix}))
            release.install(values, "--take-ownership")
            release.wait_running(3)  # a node pod on each node, one controller pod
            yield Cluster(made, nodes.bed.kubes, release)
    finally:
        nodes.close()


@pytest_asyncio.fixture(loop_scope="module")
async def s(control_plane: ControlPlane, cluster: Cluster) -> AsyncIterator[Scenario]:
    client = api.make_client(str(control_plane.kubeconfig))
    scenario = Scenario(control_plane, client, cluster.nodes, diagnose=cluster.diagnose)
    await scenario.record()
    try:
        yield scenario
    finally:
        try:
            await scenario.clean()
        finally:
            await client.close()


async def _app_with_a_file(s: Scenario, text: str) -> tuple[str, str, Published, UmlNode]:
    """A pod with a new 1 GiB claim, running, that wrote ``text`` into ``/<claim>/f``: the
    claim, the pod, what its kubelet published and the node."""
    data, app = unique("data"), unique("app")
    s.apply(claim(data, SC, "1Gi"), pod(app, s.group, [data]))
    [fs] = await s.running(app)
    s.exec(app, f"echo {text} > /{data}/f && sync")
    return data, app, fs, _node_of(s, app)


def _node_of(s: Scenario, pod_name: str) -> UmlNode:
    obj = json.loads(s.cp.kubectl("get", "pod", pod_name, "-n", NS, "-o", "json"))
    return next(n for n in s.nodes if n.name == obj["spec"]["nodeName"])


async def test_the_kubelet_registers_the_driver(s: Scenario, cluster: Cluster) -> None:
    for node in cluster.nodes:
        csinode = json.loads(s.cp.kubectl("get", "csinode", node.name, "-o", "json"))
        [entry] = csinode["spec"]["drivers"]
        assert entry["name"] == "topolvm.io" and entry["nodeID"] == node.name
        assert entry["topologyKeys"] == ["topology.topolvm.io/node"]
        obj = json.loads(s.cp.kubectl("get", "node", node.name, "-o", "json"))
        assert obj["metadata"]["labels"]["topology.topolvm.io/node"] == node.name
        info = obj["status"]["nodeInfo"]
        assert info["kubeletVersion"].startswith("v1.37.")
        assert info["containerRuntimeVersion"].startswith("containerd://2.")


async def test_data_outlives_its_pod_and_fs_group_applies(s: Scenario) -> None:
    data, writer, reader = unique("data"), unique("writer"), unique("reader")
    security = {"runAsUser": 1000, "fsGroup": 2000}
    s.apply(claim(data, SC, "1Gi"),
            pod(writer, s.group, [data], security=security,
                script=f"head -c 1048576 /dev/urandom > /{data}/blob && sync && "
                       f"sha256sum /{data}/blob > /{data}/sum && sleep 1000000"))  # fmt: skip
    [fs] = await s.running(writer)
    node = _node_of(s, writer)
    await eventually("the writer's checksum", lambda: s.exec(writer, f"cat /{data}/sum"))
    written = s.exec(writer, f"cat /{data}/sum")
    # fsGroup: the volume's root and the new files belong to group 2000, writable by the pod
    assert s.exec(writer, f"stat -c '%g' /{data} /{data}/blob").split() == ["2000", "2000"]
    assert s.exec(writer, "id -u").strip() == "1000"

    await s.delete_pod(writer)
    assert fs.target not in node.mounts()  # unpublished by the kubelet
    assert fs.volume_id in node.lvs("vg1")  # the LV is kept

    s.apply(pod(reader, s.group, [data], security=security))
    await s.running(reader)
    assert s.exec(reader, f"sha256sum /{data}/blob") == written


async def test_a_block_volume_inside_a_container(s: Scenario) -> None:
    raw, app = unique("raw"), unique("app")
    s.apply(claim(raw, SC, "64Mi", block=True), pod(app, s.group, block=[raw]))
    [dev] = await s.running(app)
    assert dev.block
    assert int(s.exec(app, f"blockdev --getsize64 /dev/{raw}")) == 64 << 20
    s.exec(app, f"echo -n block-bytes | dd of=/dev/{raw} bs=512 conv=sync 2>/dev/null && sync")
    node = _node_of(s, app)
    got = node.exec("dd", f"if={dev.target}", "bs=11", "count=1", "status=none").stdout
    assert got == "block-bytes"


async def test_online_expansion_seen_by_df_in_the_container(s: Scenario) -> None:
    data, app = unique("data"), unique("app")
    s.apply(claim(data, SC, "1Gi"), pod(app, s.group, [data]))
    await s.running(app)
    before = int(s.exec(app, f"df -k /{data} | tail -1").split()[-5])
    await api.patch_merge(s.client, PersistentVolumeClaim, data,
                          {"spec": {"resources": {"requests": {"storage": "2Gi"}}}},
                          namespace=NS)  # fmt: skip
    await s.expanded(data)
    after = int(s.exec(app, f"df -k /{data} | tail -1").split()[-5])
    assert before * 1024 < GiB < 3 * GiB // 2 < after * 1024, (before, after)


async def test_kubelet_restart_with_volumes_mounted(s: Scenario, cluster: Cluster) -> None:
    data, app, fs, node = await _app_with_a_file(s, "before")
    kube = cluster.kubes[node.name]
    for sig in ("SIGTERM", "SIGKILL"):  # a restart, then a crash
        await asyncio.to_thread(kube.restart, "kubelet", sig)
        await asyncio.to_thread(kube.wait_ready)
        await s.running(app)

        def read() -> str:  # "" until the restarted kubelet knows the pod again
            return s.cp.kubectl("exec", app, "-n", NS, "--", "cat", f"/{data}/f", check=False)

        got = await eventually(f"{app} answers exec after the kubelet's {sig}",
                               lambda: asyncio.to_thread(read), timeout=120)  # fmt: skip
        assert got == "before\n"
    assert list(node.mounts()).count(fs.target) == 1
    s.exec(app, f"echo after > /{data}/f && sync")
    assert node.exec("cat", f"{fs.target}/f").stdout == "after\n"
    events = s.cp.kubectl("get", "events", "-n", NS, "--field-selector",
                          f"involvedObject.name={app}", "-o", "json")  # fmt: skip
    warnings = [e["message"] for e in json.loads(events)["items"] if e["type"] == "Warning"]
    assert not [w for w in warnings if "mount" in w.lower()], warnings


async def test_node_plugin_container_killed_and_restarted(s: Scenario, cluster: Cluster) -> None:
    data, app, fs, node = await _app_with_a_file(s, "kept")
    plugin = cluster.node_pod(node.name)
    [status] = plugin["status"]["containerStatuses"]
    restarts = status["restartCount"]
    container = status["containerID"].removeprefix("containerd://")
    ctr = [str(cluster.kubes[node.name].bins["ctr"]), f"--address={CONTAINERD_SOCKET}",
           "-n", "k8s.io"]  # fmt: skip
    node.exec(*ctr, "tasks", "kill", "--signal", "SIGKILL", container)

    def restarted() -> bool:
        [st] = cluster.node_pod(node.name)["status"]["containerStatuses"]
        return bool(st["restartCount"] > restarts and st.get("ready"))

    await eventually("the kubelet restarted topolvm-node", lambda: asyncio.to_thread(restarted),
                     timeout=180, details=cluster.release.describe)  # fmt: skip
    assert fs.target in node.mounts()  # the running pod kept its mount
    assert s.exec(app, f"cat /{data}/f") == "kept\n"
    # and new claims provision and mount on that node
    more, app2 = unique("data"), unique("app")
    placed = pod(app2, s.group, [more])
    placed["spec"]["nodeSelector"]["kubernetes.io/hostname"] = node.name
    s.apply(claim(more, SC, "512Mi"), placed)
    await bound(s.client, more, timeout=180)
    await s.running(app2)
    s.exec(app2, f"echo new > /{more}/f")


async def test_module_has_its_own_nodes(cluster: Cluster) -> None:
    """The chart's DaemonSet stays on this module's nodes (the nodeSelector of the test bed)."""
    on = {p["spec"].get("nodeName") for p in cluster.release.pods()}
    assert on == {n.name for n in cluster.nodes}


async def test_a_stuck_pods_diagnostics_read_the_nodes_runtime(cluster: Cluster) -> None:
    """What a pod that does not start prints first (provisioning.runtime_logs): each node's
    pod-runtime processes, the pod calls containerd is in (from its goroutine dump) and the
    kubelet's and containerd's last lines. On healthy nodes: no call in progress."""
    said = runtime_logs(cluster.nodes)
    for node in cluster.nodes:
        assert f"{node.name} containerd is in: none of RunPodSandbox" in said, said
        assert f"{node.name} kubelet (running):\n" in said, said
        assert f"{node.name} containerd (running):\n" in said, said
    assert "host kernel: " in said, said

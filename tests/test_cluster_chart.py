"""The Helm chart installed into the real control plane: every object it renders is accepted,
and the controller (with the chart's csi-provisioner, csi-resizer and csi-snapshotter) and
topolvm-node run exactly as the chart starts them, with their ServiceAccounts' tokens, through a
whole volume life cycle (create, mount, resize, snapshot, delete, node deletion) with no 403.
Then ``helm upgrade`` into extender mode and back adds and removes the webhook configuration.

No kubelet runs the chart's pods (devtools.testbed.chartpods runs their containers); the
session's own controller and sidecars are paused meanwhile, and its CSIDriver is taken over by
the release (``--take-ownership``) and given back afterwards.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, PersistentVolume, Pod

from devtools import gobuild
from devtools.testbed.chartpods import (
    ControllerPod,
    Release,
    SchedulerPod,
    forbidden_lines,
    scheduler_stanza,
    start_node_pod,
)
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack, csidriver
from devtools.testbed.kubelet import KubeletStandIn
from devtools.testbed.process import http_get
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import UmlNodes, session_controller_paused, unique
from tests.helpers import eventually
from tests.lvm_fixtures import THICK, THIN
from tests.provisioning import NS, Scenario, bound, claim, pod, pvc, scheduled
from topolvm.constants import NORMAL
from topolvm.k8s import api

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "topolvm"
RELEASE_NS = "topolvm-chart"
LV = api.logicalvolume_resource(NORMAL)
VALUES: dict[str, Any] = {
    "lvmd": {"managed": False, "deviceClasses": [THICK, {**THIN, "spare-gb": 0}]},
    "node": {"lvmdEmbedded": True},
    "controller": {"replicaCount": 1},
    "storageClasses": [
        {"name": "chart-ssd", "storageClass": {"fsType": "xfs",
                                               "volumeBindingMode": "WaitForFirstConsumer",
                                               "allowVolumeExpansion": True}},
        {"name": "chart-thin", "storageClass": {
            "fsType": "ext4", "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": True,
            "additionalParameters": {"topolvm.io/device-class": "thin"}}},
    ],
}  # fmt: skip


@pytest.fixture
def release(control_plane: ControlPlane, driver: DriverStack) -> Iterator[Release]:
    rel = Release(control_plane, CHART, unique("tl"), RELEASE_NS)
    with session_controller_paused():
        try:
            yield rel
        finally:
            try:
                rel.uninstall()
            finally:
                control_plane.apply(csidriver(driver.plugin))  # the session's, taken over


async def controller_pod_name(client: AsyncClient, release: Release) -> str:
    """A Pod of the chart's controller Deployment (kube-controller-manager makes them)."""

    async def check() -> str | None:
        items, _ = await api.list_all(
            client, Pod, namespace=release.namespace,
            labels={"app.kubernetes.io/instance": release.name,
                    "app.kubernetes.io/component": "controller"},
        )  # fmt: skip
        return str(items[0]["metadata"]["name"]) if items else None

    def details() -> str:
        return release.cp.kubectl("get", "deployments,replicasets,events", "-n",
                                  release.namespace, check=False)  # fmt: skip

    name: str = await eventually("a controller Pod object", check, timeout=60, details=details)
    return name


@pytest.fixture
async def running(
    release: Release,
    uml_nodes: UmlNodes,
    cluster_client: AsyncClient,
    tmp_path: Path,
) -> AsyncIterator[tuple[ControllerPod, list[UmlNode]]]:
    nodes = uml_nodes(2, vg_gib=[8, 8])
    out = release.install(VALUES, "--take-ownership")
    assert "Storage Capacity Tracking" in out
    [cm] = [d for d in release.manifest() if d["kind"] == "ConfigMap"
            and "lvmd.yaml" in d.get("data", {})]  # fmt: skip
    for n in nodes:
        n.lvm("lvcreate", "-T", "vg1/pool0", "-L", "2g")
        start_node_pod(release, n, cm["data"]["lvmd.yaml"])
    bins = gobuild.ensure("csi-provisioner", "csi-resizer", "csi-snapshotter")
    pod_name = await controller_pod_name(cluster_client, release)
    controller = ControllerPod(release, bins, tmp_path / "controller", pod_name).start()
    try:
        yield controller, nodes
    finally:
        controller.stop()
        for n in nodes:
            n.stop_topolvm_node()


def logs_of(controller: ControllerPod, nodes: list[UmlNode]) -> dict[str, str]:
    logs = controller.logs()
    for n in nodes:
        logs[n.name] = n.node_log(lines=0)
    return logs


async def test_chart_runs_a_volume_life_cycle_with_service_account_tokens(
    running: tuple[ControllerPod, list[UmlNode]],
    kubelet: Callable[[list[UmlNode]], KubeletStandIn],
    cluster_client: AsyncClient,
    control_plane: ControlPlane,
) -> None:
    controller, nodes = running
    s = Scenario(control_plane, cluster_client, nodes, kubelet(nodes))
    await s.record()
    try:
        # create and mount (thick, xfs), then resize online
        data, app = unique("data"), unique("app")
        s.apply(claim(data, "chart-ssd", "1Gi"), pod(app, s.group, [data]))
        await scheduled(cluster_client, app, timeout=180)
        pv_name = (await bound(cluster_client, data))["spec"]["volumeName"]
        await s.kubelet.start_pod(app)  # type: ignore[union-attr]
        grow = {"spec": {"resources": {"requests": {"storage": "2Gi"}}}}
        s.cp.kubectl("patch", "pvc", data, "-n", NS, "--type=merge", "-p", json.dumps(grow))

        async def pending() -> bool:  # the chart's csi-resizer -> ControllerExpandVolume
            obj = await pvc(cluster_client, data)
            conds = (obj or {}).get("status", {}).get("conditions") or []
            return any(c["type"] == "FileSystemResizePending" for c in conds)

        await eventually("the controller's part of the resize", pending, timeout=120)
        await s.kubelet.expand_pvc(app, data)  # type: ignore[union-attr]
        claimed = await pvc(cluster_client, data)
        assert claimed is not None and claimed["status"]["capacity"]["storage"] == "2Gi"

        # a thin volume and a snapshot of it, through the chart's csi-snapshotter
        thin, app2, vsc, snap = unique("thin"), unique("app"), unique("vsc"), unique("snap")
        s.apply(claim(thin, "chart-thin", "1Gi"), pod(app2, s.group, [thin]))
        await bound(cluster_client, thin, timeout=180)
        s.apply({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
                 "metadata": {"name": vsc}, "driver": "topolvm.io", "deletionPolicy": "Delete"},
                {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                 "metadata": {"name": snap, "namespace": NS},
                 "spec": {"volumeSnapshotClassName": vsc,
                          "source": {"persistentVolumeClaimName": thin}}})  # fmt: skip

        def ready() -> bool:
            out = s.cp.kubectl("get", "volumesnapshot", snap, "-n", NS, "-o", "json", check=False)
            return bool(out and json.loads(out).get("status", {}).get("readyToUse"))

        await eventually(f"snapshot {snap} ready", lambda: asyncio.to_thread(ready), timeout=120)

        # delete the first volume: csi-provisioner's DeleteVolume removes PV and LogicalVolume
        await s.delete_pod(app)
        s.cp.kubectl("delete", "pvc", data, "-n", NS, "--wait=false")

        async def deleted() -> bool:
            return (await api.get(cluster_client, PersistentVolume, pv_name) is None
                    and await api.get(cluster_client, LV, pv_name) is None)  # fmt: skip

        await eventually("PV and LogicalVolume deleted", deleted, timeout=120)
    finally:
        await s.clean()  # snapshots, claims, classes: asserts no LV and no annotation change left

    # node deletion: the controller deletes the node's claims and volumes, then the Node goes
    doomed = nodes[1]
    last, app3 = unique("data"), unique("app")
    placed = pod(app3, s.group, [last])
    placed["spec"]["nodeSelector"]["kubernetes.io/hostname"] = doomed.name
    control_plane.apply(claim(last, "chart-ssd", "1Gi"), placed)
    await bound(cluster_client, last, timeout=180)
    doomed.stop_topolvm_node()
    control_plane.kubectl("delete", "pod", app3, "-n", NS, "--grace-period=0", "--force")
    control_plane.kubectl("delete", "node", doomed.name, "--wait=false")

    async def cleaned() -> bool:
        return (await api.get(cluster_client, Node, doomed.name) is None
                and await pvc(cluster_client, last) is None)  # fmt: skip

    await eventually("the Node and its claim removed", cleaned, timeout=120)

    denied = {name: lines for name, text in logs_of(controller, nodes).items()
              if (lines := forbidden_lines(text))}  # fmt: skip
    assert not denied, denied


EXTENDER: dict[str, Any] = {
    **VALUES,
    "scheduler": {"enabled": True},
    "webhook": {"certManager": False, "podMutatingWebhook": {"enabled": True}},
}


def webhook_configurations(cp: ControlPlane, release: Release) -> list[dict[str, Any]]:
    out = cp.kubectl("get", "mutatingwebhookconfigurations", "-o", "json")
    mine = {"app.kubernetes.io/instance": release.name}
    return [w for w in json.loads(out)["items"]
            if mine.items() <= w["metadata"].get("labels", {}).items()]  # fmt: skip


async def test_upgrade_to_extender_mode_and_back_leaves_no_webhook_behind(
    release: Release,
    control_plane: ControlPlane,
    cluster_client: AsyncClient,
    tmp_path: Path,
) -> None:
    cp = control_plane
    release.install(VALUES, "--take-ownership")
    assert not webhook_configurations(cp, release)

    notes = release.upgrade(EXTENDER)
    assert "Scheduler extender" in notes and "kind: KubeSchedulerConfiguration" in notes
    assert len(webhook_configurations(cp, release)) == 1
    assert "WARNING" not in notes
    # the controller, as its ServiceAccount, makes its certificates and writes the caBundle
    pod_name = await controller_pod_name(cluster_client, release)
    bins = gobuild.ensure("csi-provisioner", "csi-resizer", "csi-snapshotter")
    controller = ControllerPod(release, bins, tmp_path / "controller", pod_name).start()
    try:

        def ca_bundle() -> bool:
            [h] = webhook_configurations(cp, release)
            return all(w["clientConfig"].get("caBundle") for w in h["webhooks"])

        await eventually("the caBundle written", lambda: asyncio.to_thread(ca_bundle), timeout=60)
        # The chart's topolvm-scheduler, as its ServiceAccount, behind a kube-scheduler given
        # the stanza the NOTES print: a pod scheduled through it, and /status says it is wired.
        scheduler = SchedulerPod(release, tmp_path / "scheduler").start()
        profile = unique("chart-extender")
        try:
            await eventually("the extender serving /status",
                             lambda: asyncio.to_thread(http_get, f"{scheduler.url}/status"),
                             timeout=60)  # fmt: skip
            cp.start_scheduler(profile, scheduler_stanza(notes, scheduler.url))
            node, name, ns = unique("ext-node"), unique("via-extender"), unique("ext-ns")
            cp.add_node(node)
            # The webhook's Service is unreachable here (no kube-proxy): a namespace it skips.
            cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": ns, "labels": {NORMAL.webhook_ignore_label: "ignore"}}})  # fmt: skip
            spec = {"schedulerName": profile, "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{"name": "c", "image": "registry.invalid/c:1"}]}  # fmt: skip
            cp.apply({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": name, "namespace": ns}, "spec": spec})  # fmt: skip

            async def on_node() -> object:
                obj = await api.get(cluster_client, Pod, name, namespace=ns)
                return (obj or {}).get("spec", {}).get("nodeName")

            try:
                assert await eventually("the pod scheduled", on_node, timeout=60) == node
                status = json.loads(await asyncio.to_thread(http_get, f"{scheduler.url}/status"))
                assert status["wired"].startswith("yes"), status
            finally:
                cp.kubectl("delete", "namespace", ns, "--wait=false")
                cp.kubectl("delete", "pod", name, "-n", ns, "--force", "--grace-period=0")
                cp.kubectl("delete", "node", node, "--wait=false")
        finally:
            cp.stop_scheduler(profile)
            scheduler.stop()
        assert not forbidden_lines(scheduler.log()), scheduler.log()
    finally:
        controller.stop()
    denied = {n: lines for n, text in controller.logs().items()
              if (lines := forbidden_lines(text))}  # fmt: skip
    assert not denied, denied

    notes = release.upgrade(VALUES)
    assert "Storage Capacity Tracking" in notes
    assert not webhook_configurations(cp, release), "a stale MutatingWebhookConfiguration"
    # nothing intercepts pod creation any more: a plain pod is admitted and scheduled
    name, node = unique("after"), unique("plain-node")
    cp.add_node(node)  # a Node object only: somewhere to schedule to
    spec = {"containers": [{"name": "c", "image": "registry.invalid/c:1"}],
            "nodeSelector": {"kubernetes.io/hostname": node}}  # fmt: skip
    cp.apply({"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": name, "namespace": NS}, "spec": spec})  # fmt: skip
    try:

        async def placed() -> bool:
            obj = await api.get(cluster_client, Pod, name, namespace=NS)
            return bool(obj and obj["spec"].get("nodeName"))

        await eventually(f"{name} scheduled", placed, timeout=60)
        obj = await api.get(cluster_client, Pod, name, namespace=NS)
        assert obj is not None and "topolvm.io/capacity" not in json.dumps(obj["spec"])
    finally:
        cp.kubectl("delete", "pod", name, "-n", NS, "--grace-period=0", "--force", check=False)
        cp.kubectl("delete", "node", node, "--wait=false", check=False)
        cp.kubectl("delete", "csinode", node, "--wait=false", check=False)

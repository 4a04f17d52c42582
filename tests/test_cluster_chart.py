"""The Helm chart as it ships: ``helm install`` with the test bed's values (image tags, pull
policy, built-in kubelet registration and liveness endpoints, a node selector:
devtools/testbed/chart.py) on real Kubernetes nodes, whose kubelets run the chart's pods in
containerd with the securityContext, mounts and probes the chart renders. Users' busybox pods
then take volumes through a whole life cycle (create, mount, write, online resize, thin snapshot
and restore, delete, node deletion) with no 403 in any container's log. ``helm upgrade`` into
extender mode runs topolvm-scheduler as the chart's Deployment and the pod webhook (reached by
the API server at its Service's endpoint), and back again leaves no webhook behind.

Each test has its own nodes; the session's own controller and sidecars are paused meanwhile,
and its CSIDriver is taken over by the release (``--take-ownership``) and given back afterwards.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, PersistentVolume, Pod

from devtools.testbed import chart
from devtools.testbed.chart import Release, forbidden_lines
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.process import HarnessError, http_get
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import GROUP_LABEL, UmlNodes, chart_release, record_line, unique
from tests.helpers import eventually
from tests.lvm_fixtures import THICK, THIN
from tests.provisioning import NS, GiB, Scenario, bound, claim, events_for, pod, pvc, scheduled
from topolvm.constants import NORMAL
from topolvm.k8s import api

pytestmark = pytest.mark.cluster

Obj = dict[str, Any]
LV = api.logicalvolume_resource(NORMAL)
COMPONENT = "app.kubernetes.io/component"
VALUES: Obj = {
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
# The control plane runs on the host, not on nodes: the DaemonSet type (host network on the
# control-plane nodes, reached at 127.0.0.1) cannot apply, so the Deployment behind a Service.
EXTENDER: Obj = {
    **VALUES,
    "scheduler": {"enabled": True, "type": "deployment", "affinity": None,
                  "service": {"type": "ClusterIP"}, "deployment": {"replicaCount": 1}},
    "webhook": {"certManager": False, "podMutatingWebhook": {"enabled": True}},
}  # fmt: skip


@pytest.fixture
def release(control_plane: ControlPlane, driver: DriverStack) -> Iterator[Release]:
    """A release in a namespace of its own (list ``uml_nodes`` first, so that their kubelets
    still stop its pods at the end)."""
    with chart_release(control_plane, driver, "topolvm-chart") as rel:
        yield rel


def chart_nodes(uml_nodes: UmlNodes, vg_gib: list[float]) -> list[UmlNode]:
    """Kubernetes nodes with the chart's images, each with thin pool ``vg1/pool0`` (2 GiB) for
    device class ``thin`` besides ``ssd``."""
    nodes = uml_nodes(len(vg_gib), vg_gib=vg_gib, kubelet=True, driver_images=True)
    for n in nodes:
        n.lvm("lvcreate", "-T", "vg1/pool0", "-L", "2g")
    return nodes


def with_testbed(values: Obj, nodes: list[UmlNode]) -> Obj:
    return chart.merged(values, chart.testbed_values({GROUP_LABEL: nodes[0].labels[GROUP_LABEL]}))


def contains(actual: Any, rendered: Any) -> bool:
    """``rendered`` is in ``actual``: every key of a dict, every item of a list (the API server
    adds defaults and the ServiceAccount token's volume, but drops nothing)."""
    if isinstance(rendered, dict):
        return isinstance(actual, dict) and all(
            k in actual and contains(actual[k], v) for k, v in rendered.items()
        )
    if isinstance(rendered, list):
        return isinstance(actual, list) and all(any(contains(a, r) for a in actual)
                                                for r in rendered)  # fmt: skip
    return bool(actual == rendered)


async def running_as_rendered(release: Release, expected: int) -> list[Obj]:
    """Until ``expected`` pods of the release run (none terminating), every container ready;
    each has the securityContext, volumes, mounts and probes its workload in the release's
    manifest renders."""

    def settled() -> bool:
        return not [p for p in release.pods() if p["metadata"].get("deletionTimestamp")]

    await eventually("no pod of the release terminating", lambda: asyncio.to_thread(settled),
                     timeout=180, details=release.describe)  # fmt: skip
    pods: list[Obj] = await asyncio.to_thread(release.wait_running, expected, 600)
    workloads = [d for d in release.manifest() if d["kind"] in ("Deployment", "DaemonSet")]
    templates = {
        d["metadata"]["labels"][COMPONENT]: d["spec"]["template"]["spec"] for d in workloads
    }
    for p in pods:
        name, got = p["metadata"]["name"], p["spec"]
        want = templates[p["metadata"]["labels"][COMPONENT]]
        for key in ("serviceAccountName", "securityContext", "hostPID", "volumes"):
            if key in want:
                assert contains(got.get(key), want[key]), (name, key, want[key], got.get(key))
        for c in want["containers"]:
            [run] = [r for r in got["containers"] if r["name"] == c["name"]]
            assert (run["image"], run["command"]) == (c["image"], c["command"]), name
            for key in ("securityContext", "volumeMounts", "ports", "livenessProbe",
                        "readinessProbe"):  # fmt: skip
                if key in c:
                    assert contains(run.get(key), c[key]), (name, c["name"], key, c[key])
    return pods


async def rolled_out(release: Release, component: str) -> None:
    """Until the component's Deployment has rolled out (``kubectl rollout status``)."""
    name = release.workload("Deployment", component)["metadata"]["name"]

    def done() -> bool:
        out = release.cp.kubectl("rollout", "status", f"deployment/{name}", "-n",
                                 release.namespace, "--timeout=1s", check=False)  # fmt: skip
        return "successfully rolled out" in out

    await eventually(f"{name} rolled out", lambda: asyncio.to_thread(done), timeout=600,
                     details=release.describe)  # fmt: skip


def healthy(release: Release) -> None:
    """No container of the release restarted, and no liveness probe failed twice: a broken
    probe fails every period (60 s); one failure may be a slow start on a busy UML node (the
    first probe comes 10 s after the start) and restarts nothing (failureThreshold 3)."""
    restarts = {f"{p['metadata']['name']}/{s['name']}": s["restartCount"]
                for p in release.pods() for s in p["status"].get("containerStatuses") or []
                if s["restartCount"]}  # fmt: skip
    assert not restarts, f"{restarts}\n{release.describe()}"
    out = release.cp.kubectl("get", "events", "-n", release.namespace, "-o", "json",
                             "--field-selector=reason=Unhealthy")  # fmt: skip
    liveness = [(e["involvedObject"]["name"], e.get("count") or 1, e["message"])
                for e in json.loads(out)["items"]
                if e["message"].startswith("Liveness")]  # fmt: skip
    assert not [f for f in liveness if f[1] > 1], liveness


def no_forbidden(logs: dict[str, str]) -> None:
    denied = {name: lines for name, text in logs.items() if (lines := forbidden_lines(text))}
    assert not denied, denied


def node_named(nodes: list[UmlNode], name: str) -> UmlNode:
    return next(n for n in nodes if n.name == name)


async def _bound_after_copy(client: AsyncClient, claim_name: str) -> str:
    """How long after its copy was done a restored claim bound, with the chart's csi-provisioner
    settings (a retry backoff up to 5 minutes): the controller's copy-done nudge makes it retry
    at once (docs/mobility.md). From the LogicalVolume's ``status.copy.completionTime`` and the
    PV's creation, both whole seconds."""
    volume = (await bound(client, claim_name))["spec"]["volumeName"]
    pv, lv = await api.get(client, PersistentVolume, volume), await api.get(client, LV, volume)
    assert pv is not None and lv is not None
    done = datetime.datetime.fromisoformat(lv["status"]["copy"]["completionTime"])
    made = datetime.datetime.fromisoformat(pv["metadata"]["creationTimestamp"])
    return (
        f"a restore onto another node through the chart's sidecars: its claim bound "
        f"{(made - done).total_seconds():.0f} s after its copy was done (whole-second stamps; "
        "target <= 2 s)"
    )


async def test_chart_pods_run_a_volume_life_cycle(
    uml_nodes: UmlNodes, release: Release, cluster_client: AsyncClient, control_plane: ControlPlane
) -> None:
    cp, client = control_plane, cluster_client
    nodes = chart_nodes(uml_nodes, [8, 8])
    notes = release.install(with_testbed(VALUES, nodes), "--take-ownership")
    assert "Storage Capacity Tracking" in notes
    await running_as_rendered(release, 3)  # topolvm-node on each node, the controller
    s = Scenario(cp, client, nodes)
    await s.record()
    try:
        # create, mount and write (thick, xfs), then grow it under the running container
        data, app = unique("data"), unique("app")
        s.apply(claim(data, "chart-ssd", "1Gi"), pod(app, s.group, [data]))
        [fs] = await s.running(app, timeout=300)
        node = node_named(nodes, await scheduled(client, app))
        s.exec(app, f"echo written > /{data}/file && sync")
        assert node.exec("cat", f"{fs.target}/file").stdout == "written\n"  # on the LV
        grow = {"spec": {"resources": {"requests": {"storage": "2Gi"}}}}
        cp.kubectl("patch", "pvc", data, "-n", NS, "--type=merge", "-p", json.dumps(grow))
        await s.expanded(data, timeout=180)  # the chart's csi-resizer, then the kubelet
        assert int(node.lvs("vg1")[fs.volume_id]["lv_size"]) == 2 * GiB
        seen = int(s.exec(app, f"df -k /{data} | tail -1").split()[-5]) * 1024  # in the container
        assert seen > GiB + GiB // 2
        own_node_only(cp, release, node.name, (await bound(client, data))["spec"]["volumeName"])

        # a thin volume, a snapshot through the chart's csi-snapshotter, a restore read back
        thin, writer, vsc, snap = unique("thin"), unique("app"), unique("vsc"), unique("snap")
        s.apply(claim(thin, "chart-thin", "1Gi"), pod(writer, s.group, [thin]))
        await s.running(writer, timeout=300)
        s.exec(writer, f"echo before > /{thin}/file && sync")
        s.apply({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
                 "metadata": {"name": vsc}, "driver": "topolvm.io", "deletionPolicy": "Delete"},
                {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                 "metadata": {"name": snap, "namespace": NS},
                 "spec": {"volumeSnapshotClassName": vsc,
                          "source": {"persistentVolumeClaimName": thin}}})  # fmt: skip

        def ready() -> bool:
            out = cp.kubectl("get", "volumesnapshot", snap, "-n", NS, "-o", "json", check=False)
            return bool(out and json.loads(out).get("status", {}).get("readyToUse"))

        await eventually(f"snapshot {snap} ready", lambda: asyncio.to_thread(ready), timeout=180)
        s.exec(writer, f"echo after >> /{thin}/file && sync")
        restored, reader = unique("restored"), unique("app")
        source = {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": snap}
        # restored on the other node: the chart's node pods copy it between their transfer
        # ports (pod IPs, projected tokens, TokenReview) and report to the claim's Events
        here = await scheduled(client, writer)
        reading = pod(reader, s.group, [restored])
        other = next(n.name for n in nodes if n.name != here)
        reading["spec"]["nodeSelector"]["kubernetes.io/hostname"] = other
        s.apply(claim(restored, "chart-thin", "1Gi", source=source), reading)
        await s.running(reader, timeout=300)
        assert s.exec(reader, f"cat /{restored}/file") == "before\n"
        copied = await events_for(client, "PersistentVolumeClaim", restored)
        assert any(e.startswith("CopyDone:") for e in copied), copied
        record_line(await _bound_after_copy(client, restored))

        # delete the first volume: csi-provisioner's DeleteVolume removes PV, LogicalVolume, LV
        pv_name = (await bound(client, data))["spec"]["volumeName"]
        await s.delete_pod(app)
        cp.kubectl("delete", "pvc", data, "-n", NS, "--wait=false")

        async def deleted() -> bool:
            return (await api.get(client, PersistentVolume, pv_name) is None
                    and await api.get(client, LV, pv_name) is None)  # fmt: skip

        await eventually("PV and LogicalVolume deleted", deleted, timeout=180)
        assert fs.volume_id not in node.lvs("vg1")
    finally:
        await s.clean()  # snapshots, claims, classes: asserts no LV and no annotation change left

    # node deletion: a drained node whose kubelet stopped is deleted; the controller deletes
    # the claims scheduled there and the node's volumes, then the Node goes
    doomed = nodes[1]
    last, app4 = unique("data"), unique("app")
    placed = pod(app4, s.group, [last])
    placed["spec"]["nodeSelector"]["kubernetes.io/hostname"] = doomed.name
    cp.apply(claim(last, "chart-ssd", "1Gi"), placed)
    try:
        await s.running(app4, timeout=300)
        lv_name = (await bound(client, last))["spec"]["volumeName"]
        await s.delete_pod(app4)  # drained: its kubelet unpublishes the volume
        logs = release.logs()  # kubectl logs reads through the kubelets: before one stops
        doomed.signal("kubelet", "SIGTERM", wait=30)
        cp.kubectl("delete", "node", doomed.name, "--wait=false")

        async def cleaned() -> bool:
            return (await api.get(client, Node, doomed.name) is None
                    and await pvc(client, last) is None
                    and await api.get(client, LV, lv_name) is None)  # fmt: skip

        await eventually("the Node, its claim and its LogicalVolume removed", cleaned,
                         timeout=180)  # fmt: skip
    finally:
        cp.kubectl("delete", "pvc", last, "-n", NS, "--wait=false", check=False)
    logs.update({k: v for k, v in release.logs().items() if v})  # the doomed node's: unreadable
    no_forbidden(logs)
    healthy(release)


def own_node_only(cp: ControlPlane, release: Release, node: str, lv: str) -> None:
    """node.ownNodeOnly: with a token of topolvm-node's ServiceAccount bound to its pod on
    ``node`` (as its own), it may annotate its own Node, but not another Node, and may not
    change a spec of a LogicalVolume of its node (say, point a copy at another node's volume)."""
    [mine] = [p for p in release.pods() if p["spec"].get("nodeName") == node
              and p["metadata"]["labels"].get("app.kubernetes.io/component") == "node"]  # fmt: skip
    token = cp.kubectl(
        "create", "token", mine["spec"]["serviceAccountName"], "-n", release.namespace,
        "--bound-object-kind=Pod", f"--bound-object-name={mine['metadata']['name']}",
        f"--bound-object-uid={mine['metadata']['uid']}",
    ).strip()  # fmt: skip
    config = cp.write_kubeconfig(cp.workdir / f"node-account-{node}", cp.server, token)

    def as_node(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(cp.bins["kubectl"]), f"--kubeconfig={config}", *args],
                              capture_output=True, text=True, check=False, timeout=60)  # fmt: skip

    other = next(n for n in json.loads(cp.kubectl("get", "nodes", "-o", "json"))["items"]
                 if n["metadata"]["name"] != node)["metadata"]["name"]  # fmt: skip
    denied = as_node("annotate", "node", other, "topolvm.io/transfer-endpoint=10.0.0.1:9850",
                     "--overwrite")  # fmt: skip
    assert denied.returncode != 0 and f"may change its own Node only, not {other}" in denied.stderr
    allowed = as_node("annotate", "node", node, "example.com/own-node-only=1")
    assert allowed.returncode == 0, allowed.stderr
    as_node("annotate", "node", node, "example.com/own-node-only-")
    spec = json.dumps({"spec": {"copy": {"source": "another-nodes-volume"}}})
    denied = as_node("patch", f"logicalvolumes.{NORMAL.group}", lv, "--type=merge", "-p", spec)
    assert denied.returncode != 0 and "status and metadata of its own node" in denied.stderr


def webhook_configurations(cp: ControlPlane, release: Release) -> list[Obj]:
    out = cp.kubectl("get", "mutatingwebhookconfigurations", "-o", "json")
    mine = {"app.kubernetes.io/instance": release.name}
    return [w for w in json.loads(out)["items"]
            if mine.items() <= w["metadata"].get("labels", {}).items()]  # fmt: skip


def scheduler_stanza(notes: str, url: str) -> list[Obj]:
    """The ``extenders`` of the KubeSchedulerConfiguration the chart's NOTES print, with the
    extender's URL replaced by ``url``: the host's kube-scheduler has no cluster DNS."""
    lines = notes.splitlines()
    start = next(i for i, line in enumerate(lines) if "apiVersion: kubescheduler" in line)
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    config = yaml.safe_load("\n".join(line[4:] for line in lines[start:end]))
    extenders: list[Obj] = config["extenders"]
    for e in extenders:
        e["urlPrefix"] = url
    return extenders


def extender_endpoint(release: Release) -> str | None:
    """``http://<address>:<port>`` of a ready endpoint of the scheduler's Service."""
    name = release.workload("Deployment", "scheduler")["metadata"]["name"]
    out = release.cp.kubectl("get", "endpointslices", "-n", release.namespace, "-o", "json",
                             "-l", f"kubernetes.io/service-name={name}")  # fmt: skip
    for eps in json.loads(out)["items"]:
        for ep in eps.get("endpoints") or []:
            if ep.get("conditions", {}).get("ready") and eps.get("ports"):
                return f"http://{ep['addresses'][0]}:{eps['ports'][0]['port']}"
    return None


async def test_upgrade_to_extender_mode_and_back_leaves_no_webhook_behind(
    uml_nodes: UmlNodes, release: Release, cluster_client: AsyncClient, control_plane: ControlPlane
) -> None:
    cp, client = control_plane, cluster_client
    nodes = chart_nodes(uml_nodes, [6, 6])
    release.install(with_testbed(VALUES, nodes), "--take-ownership")
    await running_as_rendered(release, 3)
    assert not webhook_configurations(cp, release)

    notes = release.upgrade(with_testbed(EXTENDER, nodes))
    assert "Scheduler extender: topolvm-scheduler (deployment)" in notes, notes
    assert "kind: KubeSchedulerConfiguration" in notes and "WARNING" not in notes
    assert len(webhook_configurations(cp, release)) == 1
    await rolled_out(release, "controller")
    await rolled_out(release, "scheduler")
    await running_as_rendered(release, 4)  # + topolvm-scheduler

    def ca_bundle() -> bool:  # the controller, as its ServiceAccount, wrote it
        [h] = webhook_configurations(cp, release)
        return all(w["clientConfig"].get("caBundle") for w in h["webhooks"])

    await eventually("the caBundle written", lambda: asyncio.to_thread(ca_bundle), timeout=120)
    # The host's kube-scheduler gets the stanza the NOTES print, at the Service's endpoint.
    url: str = await eventually("a ready endpoint of the extender's Service",
                                lambda: asyncio.to_thread(extender_endpoint, release),
                                timeout=120)  # fmt: skip
    profile = unique("chart-extender")
    cp.start_scheduler(profile, scheduler_stanza(notes, url))
    s = Scenario(cp, client, nodes)
    await s.record()
    try:
        data, app = unique("data"), unique("app")
        s.apply(claim(data, "chart-ssd", "1Gi"))
        s.pods.append(app)

        def created() -> bool:  # the webhook's endpoint may lag its readiness a moment
            try:
                cp.apply(pod(app, s.group, [data], scheduler=profile))
            except HarnessError as exc:
                if "failed calling webhook" not in str(exc):
                    raise
                return False
            return True

        await eventually("the pod admitted", lambda: asyncio.to_thread(created), timeout=60)
        obj = await api.get(client, Pod, app, namespace=NS)
        assert obj is not None
        mutated = obj["metadata"].get("annotations") or {}
        assert mutated.get(NORMAL.capacity_annotation("")) == str(GiB), mutated  # the webhook's
        await s.running(app, timeout=300)
        status = json.loads(await asyncio.to_thread(http_get, f"{url}/status"))
        assert status["wired"].startswith("yes"), status  # kube-scheduler called the extender
    finally:
        await s.clean()
        cp.stop_scheduler(profile)
    no_forbidden(release.logs())
    healthy(release)

    notes = release.upgrade(with_testbed(VALUES, nodes))
    assert "Storage Capacity Tracking" in notes
    assert not webhook_configurations(cp, release), "a stale MutatingWebhookConfiguration"
    await rolled_out(release, "controller")

    def no_scheduler_pods() -> bool:
        return not [p for p in release.pods() if p["metadata"]["labels"][COMPONENT] == "scheduler"]

    await eventually("the scheduler's pods gone", lambda: asyncio.to_thread(no_scheduler_pods),
                     timeout=180)  # fmt: skip
    # nothing intercepts pod creation any more: a pod with a volume is created as written
    s = Scenario(cp, client, nodes)
    await s.record()
    try:
        data, app = unique("data"), unique("app")
        s.apply(claim(data, "chart-ssd", "1Gi"), pod(app, s.group, [data]))
        obj = await api.get(client, Pod, app, namespace=NS)
        assert obj is not None and not (obj["metadata"].get("annotations") or {})
        await s.running(app, timeout=300)
    finally:
        await s.clean()
    no_forbidden(release.logs())

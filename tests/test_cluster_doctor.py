"""``topolvm doctor`` on the real control plane: for each check, the broken state is built for
real (objects applied, the real kube-scheduler, csi-provisioner and topolvm-controller producing
their real events), the finding is asserted, then the state is healed and the finding is gone.
The seed's outage is replayed in test_cluster_doctor_seed.py."""

from __future__ import annotations

import base64
import datetime
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import AsyncClient

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from tests.cluster_fixtures import UmlNodes, session_controller_paused, unique
from tests.doctor_helpers import (
    Made,
    about,
    doctor,
    logical_volume,
    made,
    one,
    pod,
    pvc,
    run,
    sc,
)
from tests.helpers import eventually
from tests.lvm_fixtures import THICK, THIN
from topolvm.controller.webhookcerts import new_bundle, new_ca

pytestmark = pytest.mark.cluster
GiB = 1 << 30
TOPOLOGY = "topology.topolvm.io/node"


@pytest.fixture
def objs(control_plane: ControlPlane) -> Iterator[Made]:
    yield from made(control_plane)


def hook_configuration(name: str, ns: str, ca: bytes = b"") -> dict[str, object]:
    """Upstream's pod hook by Service, for the test's namespace only."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "pod-hook.topolvm.io", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"namespace": ns, "name": "topolvm-controller",
                                         "path": "/pod/mutate"},
                             "caBundle": base64.b64encode(ca).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"]}],
            "failurePolicy": "Fail", "sideEffects": "None",
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
        }],
    }  # fmt: skip


async def test_marker_left_on_pods_after_the_mode_switch(
    control_plane: ControlPlane, driver: DriverStack, objs: Made
) -> None:
    ns, node = objs.namespace(), objs.node({"capacity.topolvm.io/ssd": str(GiB)})
    marked = pod("marked", ns, nodeSelector={"kubernetes.io/hostname": node})
    one_marker = {"topolvm.io/capacity": "1"}
    marked["spec"]["containers"][0]["resources"] = {"requests": one_marker, "limits": one_marker}
    objs.apply(marked)

    async def reported() -> object:
        _, doc = await doctor(control_plane, "-n", ns)
        found = about(doc, "marker-left-on-pods", "marked")
        return found and "Insufficient topolvm.io/capacity" in json.dumps(found) and found[0]

    finding = await eventually("the marker finding", reported, timeout=60)
    # no controller would recreate it: no delete command, but the advice to re-create it
    assert finding["fixes"][0]["commands"] == []
    assert f"no controller owns pod {ns}/marked" in finding["fixes"][0]["summary"]
    control_plane.kubectl("delete", "pod", "-n", ns, "marked")
    objs.apply(pod("plain", ns, nodeSelector={"kubernetes.io/hostname": node}))
    code, doc = await doctor(control_plane, "-n", ns)
    assert (code, doc["findings"]) == (0, []), doc


async def test_webhook_without_a_controller_or_with_a_wrong_ca_bundle(
    control_plane: ControlPlane, objs: Made
) -> None:
    ns = objs.namespace()
    now = datetime.datetime.now(datetime.UTC)
    served = new_bundle([f"topolvm-controller.{ns}.svc"], [], now)
    other_ca, _ = new_ca(now)
    conf = unique("hook")
    objs.apply(hook_configuration(conf, ns, other_ca))
    _, doc = await doctor(control_plane)
    finding = one(doc, "webhook-unserved", conf)
    assert finding["severity"] == "error"
    assert f"Service {ns}/topolvm-controller does not exist" in finding["evidence"]
    assert f"kubectl delete mutatingwebhookconfiguration {conf}" in finding["fixes"][0]["commands"]

    # A controller behind the Service (a ready endpoint), serving a certificate that the
    # configuration's caBundle (another CA) does not verify.
    objs.apply(
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "topolvm-controller", "namespace": ns},
         "spec": {"ports": [{"port": 443, "targetPort": 9443}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "topolvm-controller-1", "namespace": ns,
                      "labels": {"kubernetes.io/service-name": "topolvm-controller"}},
         "addressType": "IPv4", "ports": [{"port": 9443}],
         "endpoints": [{"addresses": ["10.0.0.99"], "conditions": {"ready": True}}]},
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
         "metadata": {"name": "topolvm-webhook-tls", "namespace": ns},
         "data": served.secret_data()},
    )  # fmt: skip
    _, doc = await doctor(control_plane)
    finding = one(doc, "webhook-unserved", conf)
    assert "caBundle does not verify" in finding["title"]

    objs.apply(hook_configuration(conf, ns, served.ca_crt))
    _, doc = await doctor(control_plane)
    assert about(doc, "webhook-unserved", conf) == []


async def test_csidriver_missing_needing_an_attacher_or_without_capacity(
    control_plane: ControlPlane, objs: Made
) -> None:
    """The legacy group's driver, so that the session's CSIDriver topolvm.io stays as it is."""
    driver, klass = "topolvm.cybozu.com", unique("legacy-sc")
    objs.apply(sc(klass, provisioner=driver))
    _, doc = await doctor(control_plane)
    assert "does not exist" in one(doc, "csidriver", driver)["title"]
    # The StorageClass names a group whose driver does not run (topolvm.io does).
    assert about(doc, "storageclass", klass)[0]["title"].endswith("the driver runs as topolvm.io")

    csidriver = {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                 "metadata": {"name": driver},
                 "spec": {"attachRequired": True, "storageCapacity": False}}  # fmt: skip
    objs.apply(csidriver)
    _, doc = await doctor(control_plane)
    titles = sorted(f["title"] for f in about(doc, "csidriver", driver))
    assert titles == [f"CSIDriver {driver} has attachRequired: true",
                      f"CSIDriver {driver} has storageCapacity off"]  # fmt: skip
    assert one(doc, "legacy-mixture", driver)["title"].startswith("CSIDrivers of both")

    control_plane.kubectl("delete", "csidriver", driver)
    csidriver["spec"] = {"attachRequired": False, "storageCapacity": True}
    objs.apply(csidriver)
    _, doc = await doctor(control_plane)
    assert about(doc, "csidriver", driver) == []
    assert about(doc, "storageclass", klass) == []


async def test_capacity_objects_missing_or_stale(
    control_plane: ControlPlane, driver: DriverStack, objs: Made
) -> None:
    """csi-provisioner (which publishes CSIStorageCapacity) is stopped for the test, as when it
    runs without --enable-capacity; the objects are then written by hand. The session's
    CSIDriver topolvm.io has storageCapacity on."""
    with session_controller_paused():
        node = objs.node({"capacity.topolvm.io/ssd": str(10 * GiB)})
        klass = unique("cap-sc")
        objs.apply(sc(klass))
        _, doc = await doctor(control_plane)  # just made: csi-provisioner gets time to publish
        assert about(doc, "capacity-objects", klass) == []
        _, doc = await doctor(control_plane, "--stale-after=1ms")
        missing = one(doc, "capacity-objects", klass)
        assert (
            missing["severity"] == "error" and {"kind": "Node", "name": node} in missing["objects"]
        )

        ns = objs.namespace()

        def capacity(size: int) -> dict[str, object]:
            return {"apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
                    "metadata": {"name": "cap", "namespace": ns}, "storageClassName": klass,
                    "capacity": str(size),
                    "nodeTopology": {"matchLabels": {TOPOLOGY: node}}}  # fmt: skip

        objs.apply(capacity(1 * GiB))
        _, doc = await doctor(control_plane, "--stale-after=1ms")
        stale = one(doc, "capacity-objects", klass)
        assert "stale" in stale["title"] and "says 1.0 GiB" in stale["evidence"][0]
        _, doc = await doctor(control_plane)  # written just now: not stale yet
        assert about(doc, "capacity-objects", klass) == []

        objs.apply(capacity(10 * GiB))
        _, doc = await doctor(control_plane, "--stale-after=1ms")
        assert about(doc, "capacity-objects", klass) == []


async def test_storage_classes_that_cannot_work(control_plane: ControlPlane, objs: Made) -> None:
    objs.node({"capacity.topolvm.io/ssd": str(GiB), "capacity.topolvm.io/00default": str(GiB)})
    immediate, unknown, foreign, good = (unique(f"sc-{r}") for r in ("imm", "dc", "key", "ok"))
    objs.apply(
        sc(immediate, binding="Immediate"),
        sc(unknown, device_class="nvme-does-not-exist"),
        sc(foreign, device_class=None, parameters={"topolvm.cybozu.com/device-class": "ssd"}),
        sc(good),
    )
    _, doc = await doctor(control_plane)
    assert "volumeBindingMode is Immediate" in one(doc, "storageclass", immediate)["title"]
    assert "exists on no node" in one(doc, "storageclass", unknown)["title"]
    assert "belongs to the other API group" in one(doc, "storageclass", foreign)["title"]
    assert about(doc, "storageclass", good) == []


async def test_pvc_provisioning_failed_for_lack_of_room(
    control_plane: ControlPlane, driver: DriverStack, objs: Made
) -> None:
    """The real csi-provisioner calls the real topolvm-controller, which answers
    RESOURCE_EXHAUSTED: the node the class allows has 1 GiB free, the PVC wants 5 GiB."""
    node = objs.node({"capacity.topolvm.io/ssd": str(GiB)})
    ns, klass = objs.namespace(), unique("small-sc")
    topology = [{"matchLabelExpressions": [
        {"key": "topology.topolvm.io/node", "values": [node]}]}]  # fmt: skip
    objs.apply(sc(klass, binding="Immediate", allowedTopologies=topology))
    objs.apply(pvc("big", ns, klass, "5Gi"), pvc("waiting", ns, unique("no-such-class")))

    async def reported() -> object:
        _, doc = await doctor(control_plane, "-n", ns)
        return about(doc, "pvc-provisioning", "big")

    [finding] = await eventually("the provisioning finding", reported, timeout=120)
    assert finding["title"] == f"PVC {ns}/big Pending: no room for the volume"
    assert "ResourceExhausted" in finding["evidence"][0]
    assert f"node {node}: 1.0 GiB free in device class ssd" in finding["evidence"][1]
    _, doc = await doctor(control_plane, "-n", ns)
    assert about(doc, "pvc-provisioning", "waiting") == []  # Pending, but nothing failed


async def test_logical_volumes_failed_stuck_or_orphaned(
    control_plane: ControlPlane, objs: Made
) -> None:
    with session_controller_paused():  # its cleanup would delete the orphan
        node = objs.node()
        failed, stuck, orphan, fine = (unique(f"lv-{r}") for r in ("fail", "stuck", "orph", "ok"))
        objs.apply(
            logical_volume(failed, node), logical_volume(fine, node),
            logical_volume(stuck, node, finalizers=["topolvm.io/logicalvolume"]),
            logical_volume(orphan, unique("deleted-node")),
        )  # fmt: skip
        control_plane.kubectl(
            "patch", "logicalvolumes.topolvm.io", failed, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"code": 8, "message": "no enough space left on VG"}}),
        )  # fmt: skip
        control_plane.kubectl("delete", "logicalvolumes.topolvm.io", stuck, "--wait=false")
        _, doc = await doctor(control_plane, "--stuck-after=1ms")
        assert "creation failed (8)" in one(doc, "logicalvolume", failed)["title"]
        assert "no enough space" in one(doc, "logicalvolume", failed)["evidence"][0]
        assert "stuck in deletion" in one(doc, "logicalvolume", stuck)["title"]
        assert "the node no longer exists" in one(doc, "logicalvolume", orphan)["title"]
        assert about(doc, "logicalvolume", fine) == []
        _, doc = await doctor(control_plane)  # deleted just now: not stuck yet
        assert about(doc, "logicalvolume", stuck) == []


async def test_node_capacity_missing_or_not_refreshed(
    control_plane: ControlPlane, objs: Made
) -> None:
    node = objs.node()  # registered for topolvm.io (CSINode), no annotations
    _, doc = await doctor(control_plane)
    assert "no capacity.topolvm.io/ annotations" in one(doc, "node-capacity", node)["title"]

    control_plane.kubectl("annotate", "node", node, f"capacity.topolvm.io/ssd={GiB}")
    ns = objs.namespace()
    node_pod = pod("topolvm-node-x", ns, nodeName=node)
    node_pod["spec"]["containers"][0]["name"] = "topolvm-node"
    objs.apply(node_pod)  # bound to the node, never started: no kubelet runs it
    _, doc = await doctor(control_plane)
    finding = one(doc, "node-capacity", node)
    assert finding["severity"] == "warning" and "not refreshed" in finding["title"]

    running = {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}]}}  # fmt: skip
    control_plane.kubectl("patch", "pod", "-n", ns, "topolvm-node-x", "--subresource=status",
                          "--type=merge", "-p", json.dumps(running))  # fmt: skip
    _, doc = await doctor(control_plane)
    assert about(doc, "node-capacity", node) == []


async def test_thin_pool_filling_up_read_from_topolvm_node_metrics(
    control_plane: ControlPlane, uml_nodes: UmlNodes, objs: Made
) -> None:
    """topolvm-node runs in a UML guest with a real thin pool; its pod object points at the
    guest, so the API server's pod proxy reaches its /metrics as in a cluster. Writing 230 MiB
    into a 256 MiB pool fills it past 80 %."""
    [node] = uml_nodes(1, vg_gib=[4])
    node.lvm("lvcreate", "-T", "vg1/pool0", "-L", "256m")
    node.start_topolvm_node(control_plane, [THICK, {**THIN, "spare-gb": 0}])
    ns = objs.namespace()
    node_pod = pod("topolvm-node-uml", ns, nodeName=node.name)
    node_pod["spec"]["containers"][0].update(
        name="topolvm-node", command=["topolvm", "node", "--metrics-bind-address=:8080"]
    )
    objs.apply(node_pod)
    running = {"status": {"phase": "Running", "podIP": node.address,
                          "podIPs": [{"ip": node.address}],
                          "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip
    control_plane.kubectl("patch", "pod", "-n", ns, "topolvm-node-uml", "--subresource=status",
                          "--type=merge", "-p", json.dumps(running))  # fmt: skip

    async def metrics_read() -> object:
        _, doc = await doctor(control_plane)
        return "thinpool" in doc["checks"] and not about(doc, "node-capacity", node.name) and doc

    doc = await eventually("the node's metrics read", metrics_read, timeout=60, interval=1)
    assert about(doc, "thinpool", node.name) == []  # an empty pool

    node.lvm("lvcreate", "-T", "vg1/pool0", "-V", "1g", "-n", "fill")
    node.exec("dd", "if=/dev/zero", "of=/dev/vg1/fill", "bs=1M", "count=230", "oflag=direct")
    node.lvm("lvcreate", "-T", "vg1/pool0", "-V", "64m", "-n", "poke")  # lvmd reports anew

    async def reported() -> object:
        _, doc = await doctor(control_plane)
        return about(doc, "thinpool", node.name)

    [finding] = await eventually("the thin pool finding", reported, timeout=90, interval=1)
    assert finding["title"].startswith(f"node {node.name}: thin pool of device class thin is data")
    assert f"pod {ns}/topolvm-node-uml: topolvm_thinpool_data_percent" in finding["evidence"][0]


async def test_pod_with_node_name_and_a_wait_for_first_consumer_pvc(
    control_plane: ControlPlane, objs: Made
) -> None:
    node, ns, klass = objs.node(), objs.namespace(), unique("wffc-sc")
    objs.apply(sc(klass), pvc("data", ns, klass))
    objs.apply(pod("pinned", ns, "data", nodeName=node))
    _, doc = await doctor(control_plane, "--pod", "pinned", "-n", ns)
    finding = one(doc, "pod-nodename", "pinned")
    assert {"kind": "PersistentVolumeClaim", "name": "data", "namespace": ns} in finding["objects"]

    # The same pod with a PVC bound to a pre-provisioned PV is fine.
    pv = unique("static-pv")
    objs.apply({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                         "hostPath": {"path": "/tmp/x"}, "storageClassName": ""}})  # fmt: skip
    static = pvc("static", ns, "")
    static["spec"]["volumeName"] = pv
    objs.apply(static, pod("pinned2", ns, "static", nodeName=node))

    async def bound() -> bool:
        out = control_plane.kubectl("get", "pvc", "-n", ns, "static", "-o", "json")
        return bool(json.loads(out)["status"].get("phase") == "Bound")

    await eventually("the static PVC bound", bound, timeout=60)
    _, doc = await doctor(control_plane, "--pod", "pinned2", "-n", ns)
    assert about(doc, "pod-nodename", "pinned2") == []


async def test_legacy_logical_volumes_without_their_driver(
    control_plane: ControlPlane, driver: DriverStack, objs: Made
) -> None:
    node, lv = objs.node(), unique("legacy-lv")
    objs.apply(logical_volume(lv, node, group="topolvm.cybozu.com"))
    _, doc = await doctor(control_plane)
    finding = one(doc, "legacy-mixture", lv)
    assert "of topolvm.cybozu.com, whose driver does not run" in finding["title"]
    control_plane.kubectl("delete", "logicalvolumes.topolvm.cybozu.com", lv)
    _, doc = await doctor(control_plane)
    assert about(doc, "legacy-mixture", lv) == []


async def test_kubectl_plugin_text_output_and_what_rbac_hides(
    control_plane: ControlPlane, cluster_client: AsyncClient, objs: Made, tmp_path: Path
) -> None:
    """``kubectl topolvm doctor`` through the real kubectl's plugin mechanism; a user who may
    read only Nodes gets every check that needs more as "could not check", naming what it
    could not read; orphan-lvs (the Nodes' annotation) still decides, so the exit code is 0
    (2 only when no check could decide anything, as for a pod that does not exist)."""
    plugins = tmp_path / "bin"
    plugins.mkdir()
    (plugins / "kubectl-topolvm").symlink_to(Path(sys.executable).parent / "topolvm")
    env = {**os.environ, "PATH": f"{plugins}:{os.environ['PATH']}", "NO_COLOR": "1"}
    kubectl = str(control_plane.bins["kubectl"])
    code, out, err = await run(
        kubectl, "topolvm", "doctor", f"--kubeconfig={control_plane.kubeconfig}",
        "--pod", "nope", "-n", "default", env=env,
    )  # fmt: skip
    assert code == 2, (out, err)
    assert "could not check: pod default/nope not found" in err

    nodes_only = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]
    kubeconfig = objs.account(nodes_only, tmp_path)
    code, doc = await doctor(control_plane, kubeconfig=kubeconfig)
    assert code == 0, doc
    undecided = {f["check"]: f["cause"] for f in doc["findings"]}
    assert all(f["severity"] == "undecided" for f in doc["findings"])
    assert "cannot read pods: 403" in undecided["marker-without-extender"]
    assert "legacy-mixture" in undecided and "orphan-lvs" not in undecided
    assert set(doc["checks"]) - set(undecided) == {"orphan-lvs"}

    code, out, _ = await run(kubectl, "topolvm", "doctor", f"--kubeconfig={kubeconfig}", env=env)
    assert code == 0 and "COULD NOT CHECK" in out and "\033[" not in out, out


def documented_role() -> dict[str, Any]:
    """The ClusterRole docs/troubleshooting.md gives doctor's users."""
    text = (Path(__file__).parent.parent / "docs" / "troubleshooting.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    role: dict[str, Any] = yaml.safe_load(block)
    return role


async def test_the_documented_cluster_role_lets_doctor_read_everything(
    control_plane: ControlPlane, driver: DriverStack, objs: Made, tmp_path: Path
) -> None:
    kubeconfig = objs.account(documented_role()["rules"], tmp_path)
    _, doc = await doctor(control_plane, kubeconfig=kubeconfig)
    assert [f for f in doc["findings"] if f["severity"] == "undecided"] == []

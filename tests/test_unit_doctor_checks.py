"""Each ``topolvm doctor`` check on its own, over snapshots built in doctor_scenarios.py: the
broken state gives the finding (with its evidence and fix), the healthy one none. The same
states are built on the real control plane in test_cluster_doctor.py."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest
from cryptography import x509

from tests import doctor_scenarios as s
from topolvm.controller.webhookcerts import new_ca, new_serving_cert
from topolvm.doctor import checks
from topolvm.doctor.checks import all_checks
from topolvm.doctor.checks.webhook_unserved import verifies
from topolvm.doctor.collect import metrics_port, thin_pools
from topolvm.doctor.model import Finding, Severity
from topolvm.doctor.run import diagnose
from topolvm.doctor.scope import Scope
from topolvm.doctor.snapshot import Obj, Snapshot

GiB = 1 << 30
SEED_FREE = 257693843456
INSUFFICIENT = "0/1 nodes are available: 1 Insufficient topolvm.io/capacity."


def run(check_id: str, snap: Snapshot) -> list[Finding]:
    [check] = [c for c in all_checks() if c.id == check_id]
    return check.run(snap)


def test_every_module_in_the_checks_package_is_a_registered_check() -> None:
    modules = [m.name for m in pkgutil.iter_modules(checks.__path__)]
    defined = [importlib.import_module(f"{checks.__name__}.{m}").CHECK.id for m in modules]
    registered = [c.id for c in all_checks()]
    assert sorted(defined) == sorted(registered) and len(set(registered)) == len(registered)
    assert registered[0] == "marker-without-extender"  # the seed's case is reported first


def test_the_troubleshooting_guide_shows_every_check() -> None:
    guide = (Path(__file__).parent.parent / "docs" / "troubleshooting.md").read_text()
    missing = [c.id for c in all_checks() if f"[{c.id}]" not in guide]
    assert missing == []


def seed(hook: bool = True, message: str = INSUFFICIENT) -> Snapshot:
    pods = [s.pod(f"vault-{i}", "vault", (f"data-vault-{i}", f"audit-vault-{i}"),
                  marker=True, message=message) for i in range(3)]  # fmt: skip
    return s.snapshot(
        *s.node("worker-1", SEED_FREE), s.csidriver(), s.sc(), *pods, *s.endpoints(),
        s.capacity("topolvm-provisioner", "worker-1", SEED_FREE), *([s.hook()] if hook else []),
        s.event("Pod", "vault-0", "FailedScheduling", INSUFFICIENT, ns="vault"),
    )  # fmt: skip


def test_marker_without_extender_names_the_seed_and_both_fixes() -> None:
    [f] = run("marker-without-extender", seed())
    assert (
        f.cause == "pod webhook adds topolvm.io/capacity but kube-scheduler has no extender for it"
    )
    assert f.severity == Severity.ERROR and f.title.startswith("3 pod(s) in vault Pending")
    assert "pod vault/vault-0: FailedScheduling (x3): " + INSUFFICIENT in f.evidence
    assert "node worker-1 has free space: ssd 240.0 GiB" in f.evidence
    assert "no Node advertises topolvm.io/capacity in status.allocatable" in f.evidence
    assert "no topolvm-scheduler pod runs in the cluster" in f.evidence
    sct, extender = f.fixes
    assert sct.commands == (
        "kubectl delete mutatingwebhookconfiguration topolvm-hook",
        "kubectl delete pod -n vault vault-0 vault-1 vault-2",
    )
    assert "their controllers recreate them" in sct.summary
    assert extender.commands == ("topolvm scheduler print-config --managed-resource",)


def test_marker_without_extender_shows_what_the_extender_says_on_status() -> None:
    snap = seed()
    wired = "unknown: no /predicate or /prioritize call since start 3600s ago. ..."
    snap.objects["scheduler-status"] = [
        {"metadata": {"name": "topolvm-scheduler-x", "namespace": "topolvm-system"},
         "status": {"mode": "managed-resource", "wired": wired}},
        {"metadata": {"name": "topolvm-scheduler-y", "namespace": "topolvm-system"},
         "error": "GET /api/v1/...: 404 not found"},
    ]  # fmt: skip
    [f] = run("marker-without-extender", snap)
    assert (
        f"topolvm-scheduler pod topolvm-system/topolvm-scheduler-x: /status mode "
        f"managed-resource, wired: {wired}" in f.evidence
    )
    assert any("topolvm-scheduler-y: /status not readable (GET" in e for e in f.evidence)


def test_marker_without_extender_quiet_when_the_scheduler_does_not_complain() -> None:
    assert run("marker-without-extender", _no_event(seed())) == []
    assert run("marker-without-extender", seed(hook=False)) == []  # the next check's case


def _no_event(snap: Snapshot) -> Snapshot:
    """Marked pods, but kube-scheduler has not said Insufficient (an extender manages it)."""
    snap.objects["events"] = []
    for p in snap["pods"]:
        p["status"]["conditions"] = []
    return snap


def test_marker_left_on_pods_after_the_webhook_is_gone() -> None:
    [f] = run("marker-left-on-pods", seed(hook=False))
    assert f.fixes[0].commands == ("kubectl delete pod -n vault vault-0 vault-1 vault-2",)
    assert run("marker-left-on-pods", seed(hook=True)) == []
    healthy = s.snapshot(*s.node("w"), s.pod("p", marker=False))
    assert run("marker-left-on-pods", healthy) == []


def test_webhook_without_endpoints_or_with_a_ca_bundle_that_does_not_verify() -> None:
    ca, secret = s.tls_secret()
    [f] = run("webhook-unserved", s.snapshot(s.hook(ca=ca)))
    assert "Service topolvm-system/topolvm-controller does not exist" in f.evidence
    [f] = run("webhook-unserved", s.snapshot(s.hook(ca=ca), *s.endpoints(ready=False)))
    assert "has no ready endpoint" in f.evidence[1] and f.cluster_wide
    [f] = run("webhook-unserved", s.snapshot(s.hook(ca=s.other_ca()), *s.endpoints(), secret))
    assert "caBundle does not verify" in f.title
    assert run("webhook-unserved", s.snapshot(s.hook(ca=ca), *s.endpoints(), secret)) == []


def test_csidriver_missing_attach_required_or_capacity_off() -> None:
    [f] = run("csidriver", s.snapshot(s.sc()))
    assert f.title == "CSIDriver topolvm.io does not exist"
    titles = [
        f.title
        for f in run("csidriver", s.snapshot(s.sc(), s.csidriver(capacity=False, attach=True)))
    ]
    assert titles == ["CSIDriver topolvm.io has attachRequired: true",
                      "CSIDriver topolvm.io has storageCapacity off"]  # fmt: skip
    # The extender's marker mode (a pod webhook) does not need capacity tracking.
    assert run("csidriver", s.snapshot(s.sc(), s.csidriver(capacity=False), s.hook())) == []
    assert run("csidriver", s.snapshot(s.sc(), s.csidriver())) == []


def test_capacity_objects_missing_or_stale() -> None:
    base = (*s.node("w1", 100 * GiB), s.sc(), s.csidriver())
    [f] = run("capacity-objects", s.snapshot(*base))
    assert f.severity == Severity.ERROR and "no CSIStorageCapacity for 1 node(s)" in f.title
    [f] = run("capacity-objects", s.snapshot(*base, s.capacity("topolvm-provisioner", "w1", GiB)))
    assert "stale" in f.title and "says 1.0 GiB for node w1" in f.evidence[0]
    fresh = s.capacity("topolvm-provisioner", "w1", GiB, written="2026-11-24T11:59:00Z")
    assert run("capacity-objects", s.snapshot(*base, fresh)) == []  # not refreshed yet: fine
    good = s.capacity("topolvm-provisioner", "w1", 100 * GiB)
    assert run("capacity-objects", s.snapshot(*base, good)) == []


def test_storage_classes_that_cannot_work() -> None:
    nodes = s.node("w1")
    drivers = s.csidriver()
    found = run("storageclass", s.snapshot(
        *nodes, drivers, s.sc("immediate", binding="Immediate"), s.sc("nvme", dc="nvme"),
        s.sc("legacy", provisioner="topolvm.cybozu.com"),
        s.sc("mixed", dc=None, params={"topolvm.cybozu.com/device-class": "ssd"}),
        s.sc("near", params={"topolvm.io/device-class": "ssd",
                             "topolvm.io/restore-placement": "nearby"}),
    ))  # fmt: skip
    titles = sorted(f.title for f in found)
    assert titles == [
        "StorageClass immediate: volumeBindingMode is Immediate",
        "StorageClass legacy: provisioner topolvm.cybozu.com, but the driver runs as topolvm.io",
        "StorageClass mixed: device class (default) exists on no node",
        "StorageClass mixed: parameter topolvm.cybozu.com/device-class belongs to the other API "
        "group",
        "StorageClass near: parameter topolvm.io/restore-placement is not valid",
        "StorageClass nvme: device class nvme exists on no node",
    ]
    [near] = [f for f in found if "near" in f.title]
    assert near.evidence == ("StorageClass near: topolvm.io/restore-placement must be "
                             "source-node or anywhere, got 'nearby'",)  # fmt: skip
    assert run("storageclass", s.snapshot(*nodes, drivers, s.sc())) == []
    fine = s.sc(
        "far", params={"topolvm.io/device-class": "ssd", "topolvm.io/restore-placement": "anywhere"}
    )
    assert run("storageclass", s.snapshot(*nodes, drivers, fine)) == []


def test_pvc_provisioning_failures_name_the_node_and_its_free_bytes() -> None:
    selected = {"volume.kubernetes.io/selected-node": "w1"}
    exhausted = ("failed to provision volume with StorageClass \"topolvm-provisioner\": rpc error: "
                 "code = ResourceExhausted desc = node w1 has 3221225472 bytes free")  # fmt: skip
    missing = "rpc error: code = NotFound desc = device-class not found: nvme"
    snap = s.snapshot(
        *s.node("w1", 3 * GiB), s.sc(),
        s.pvc("big", annotations=selected), s.event("PersistentVolumeClaim", "big",
                                                    "ProvisioningFailed", exhausted),
        s.pvc("odd", annotations=selected), s.event("PersistentVolumeClaim", "odd",
                                                    "ProvisioningFailed", missing),
        s.pvc("waiting"),
    )  # fmt: skip
    big, odd = run("pvc-provisioning", snap)
    assert big.title == "PVC app/big Pending: no room for the volume"
    assert (
        "selected node w1: 3.0 GiB free in device class ssd; the PVC requests 10.0 GiB"
        in big.evidence
    )
    assert odd.title == "PVC app/odd Pending: device class ssd not found on the node"


def test_logical_volumes_failed_stuck_or_on_a_deleted_node() -> None:
    snap = s.snapshot(
        *s.node("w1"), s.lv("failed", "w1", code=8), s.lv("stuck", "w1", deleting=s.OLD),
        s.lv("orphan", "gone"), s.lv("fine", "w1"),
        s.lv("new-deleting", "w1", deleting="2026-11-24T11:59:00Z"),
    )  # fmt: skip
    titles = [f.title for f in run("logicalvolume", snap)]
    assert titles == [
        "LogicalVolume failed (topolvm.io) on node w1: creation failed (8)",
        "LogicalVolume stuck (topolvm.io) on node w1: stuck in deletion for 1h0m",
        "LogicalVolume orphan (topolvm.io) on node gone: the node no longer exists",
    ]


def test_node_capacity_missing_or_frozen() -> None:
    [f] = run("node-capacity", s.snapshot(*s.node("w1", free=None)))
    assert f.title == "node w1: no capacity.topolvm.io/ annotations"
    down = s.pod("topolvm-node-abc", "topolvm-system", node_name="w1", container="topolvm-node",
                 phase="Pending", owned=True)  # fmt: skip
    [f] = run("node-capacity", s.snapshot(*s.node("w1"), down))
    assert f.severity == Severity.WARNING and "not refreshed" in f.title
    up = s.pod("topolvm-node-abc", "topolvm-system", node_name="w1", container="topolvm-node",
               phase="Running", ready=True)  # fmt: skip
    assert run("node-capacity", s.snapshot(*s.node("w1"), up)) == []
    assert run("node-capacity", s.snapshot(*s.node("other", free=None, csi=False))) == []


def test_pod_with_node_name_and_an_unbound_wait_for_first_consumer_claim() -> None:
    snap = s.snapshot(s.sc(), s.pvc("data"), s.pod("pinned", claims=("data",), node_name="w1"))
    [f] = run("pod-nodename", snap)
    assert "nodeSelector kubernetes.io/hostname: w1" in f.fixes[0].summary
    scheduled = s.pvc("data", annotations={"volume.kubernetes.io/selected-node": "w1"})
    assert (
        run(
            "pod-nodename",
            s.snapshot(s.sc(), scheduled, s.pod("p", claims=("data",), node_name="w1")),
        )
        == []
    )


def test_legacy_mixtures() -> None:
    both = s.snapshot(s.csidriver(), s.csidriver("topolvm.cybozu.com"))
    [f] = run("legacy-mixture", both)
    assert f.title == "CSIDrivers of both API groups are registered"
    orphaned = s.snapshot(s.csidriver(), s.lv("old", "w1", kind="legacy-logicalvolumes"))
    [f] = run("legacy-mixture", orphaned)
    assert f.title == "1 LogicalVolume(s) of topolvm.cybozu.com, whose driver does not run"
    assert run("legacy-mixture", s.snapshot(s.csidriver(), s.lv("new", "w1"))) == []


def test_thin_pools_above_the_thresholds() -> None:
    snap = s.snapshot(s.metrics("w1", "thin", 85.0, 10.0), s.metrics("w2", "thin", 50.0, 97.5),
                      s.metrics("w3", "thin", 79.9, 79.9))  # fmt: skip
    found = {f.subjects[0].name: f for f in run("thinpool", snap)}
    assert sorted(found) == ["w1", "w2"]
    assert found["w1"].severity == Severity.WARNING and "is data 85.0% full" in found["w1"].title
    assert found["w2"].severity == Severity.ERROR and "metadata 97.5%" in found["w2"].title


def test_topolvm_node_metrics_are_parsed_for_thin_pools_and_the_port_found() -> None:
    text = (
        "# TYPE topolvm_thinpool_data_percent gauge\n"
        'topolvm_thinpool_data_percent{device_class="thin",node="w1"} 91.5\n'
        "# TYPE topolvm_thinpool_metadata_percent gauge\n"
        'topolvm_thinpool_metadata_percent{device_class="thin",node="w1"} 12\n'
        'topolvm_volumegroup_size_bytes{device_class="ssd",node="w1"} 1e+10\n'
    )
    assert thin_pools(text) == [
        {"device_class": "thin", "data_percent": 91.5, "metadata_percent": 12.0}
    ]
    container = {"name": "topolvm-node", "command": ["topolvm", "node"],
                 "args": ["--metrics-bind-address", "0.0.0.0:9090"]}  # fmt: skip
    assert metrics_port({"spec": {"containers": [container]}}) == 9090
    assert metrics_port({"spec": {"containers": [{"name": "topolvm-node"}]}}) == 8080


@pytest.mark.parametrize("check", [c.id for c in all_checks()])
def test_an_empty_cluster_is_healthy_for_every_check(check: str) -> None:
    assert run(check, s.snapshot()) == []


def test_a_failed_resize_is_a_warning_and_never_suggests_deleting_the_volume() -> None:
    resized = s.lv("in-use", "w1", code=8)
    resized[1]["status"].update(volumeID="vol-1", currentSize="10Gi")
    [f] = run("logicalvolume", s.snapshot(*s.node("w1"), resized))
    assert f.severity == Severity.WARNING and f.title.endswith("resize failed (8)")
    assert f.fixes[0].commands == () and "Do not delete" in f.fixes[0].summary


def test_finalizers_are_dropped_only_for_volumes_whose_node_is_gone() -> None:
    snap = s.snapshot(*s.node("w1"), s.lv("a", "w1", deleting=s.OLD),
                      s.lv("b", "gone", deleting=s.OLD))  # fmt: skip
    on_live, on_gone = run("logicalvolume", snap)
    assert not any("finalizers" in c for c in on_live.fixes[0].commands)
    assert any("finalizers" in c for c in on_gone.fixes[0].commands)


def test_pods_no_controller_owns_are_not_in_the_delete_command() -> None:
    snap = seed()
    snap["pods"][2]["metadata"].pop("ownerReferences")
    [f] = run("marker-without-extender", snap)
    assert "kubectl delete pod -n vault vault-0 vault-1" in f.fixes[0].commands
    assert "no controller owns pod vault/vault-2" in f.fixes[0].summary


def test_marked_pods_get_one_finding_per_namespace() -> None:
    snap = seed()
    other = s.pod("web-0", "shop", marker=True, message=INSUFFICIENT)
    snap.objects["pods"].append(other[1])
    found = run("marker-without-extender", snap)
    assert [f.title.split(" Pending")[0] for f in found] == ["1 pod(s) in shop",
                                                              "3 pod(s) in vault"]  # fmt: skip


def test_a_certificate_from_an_intermediate_ca_verifies() -> None:
    root_crt, root_key = new_ca(s.NOW)
    mid_crt, mid_key = s.intermediate(root_crt, root_key)
    leaf, _ = new_serving_cert(mid_crt, mid_key, ["x.ns.svc"], now=s.NOW)
    load = x509.load_pem_x509_certificates
    assert verifies(load(root_crt), [*load(leaf), *load(mid_crt)])
    assert not verifies(load(root_crt), load(leaf))  # without the intermediate
    assert not verifies(load(s.other_ca()), [*load(leaf), *load(mid_crt)])


def test_unreadable_secrets_leave_only_the_ca_comparison_undecided() -> None:
    snap = s.snapshot(s.hook(ca=s.other_ca()))  # no Service: still reported
    snap.unreadable["secrets"] = "403 Forbidden"
    [f] = run("webhook-unserved", snap)
    assert f.severity == Severity.ERROR and "does not exist" in f.evidence[1]
    snap = s.snapshot(s.hook(ca=s.other_ca()), *s.endpoints())
    snap.unreadable["secrets"] = "403 Forbidden"
    [f] = run("webhook-unserved", snap)
    assert f.severity == Severity.UNDECIDED and f.cause == "cannot read secrets: 403 Forbidden"


def test_new_nodes_get_time_before_a_missing_capacity_object_counts() -> None:
    fresh = s.node("w9", 100 * GiB)
    fresh[0][1]["metadata"]["creationTimestamp"] = "2026-11-24T11:59:30Z"
    assert run("capacity-objects", s.snapshot(*fresh, s.sc(), s.csidriver())) == []


def test_a_capacity_object_is_not_stale_while_the_annotation_just_changed() -> None:
    node = s.node("w1", 100 * GiB)
    node[0][1]["metadata"]["managedFields"] = [{
        "manager": "topolvm", "time": "2026-11-24T11:59:50Z",
        "fieldsV1": {"f:metadata": {"f:annotations": {"f:capacity.topolvm.io/ssd": {}}}},
    }]  # fmt: skip
    old = s.capacity("topolvm-provisioner", "w1", GiB)
    assert run("capacity-objects", s.snapshot(*node, s.sc(), s.csidriver(), old)) == []


def test_the_running_topolvm_node_pod_wins_during_a_rollout() -> None:
    old = s.pod("topolvm-node-old", "t", node_name="w1", container="topolvm-node",
                phase="Running", ready=True)  # fmt: skip
    new = s.pod("topolvm-node-new", "t", node_name="w1", container="topolvm-node")
    assert run("node-capacity", s.snapshot(*s.node("w1"), old, new)) == []


def test_null_fields_do_not_break_checks() -> None:
    claim = s.pvc("big", annotations={"volume.kubernetes.io/selected-node": "w1"})
    claim[1]["spec"]["resources"]["requests"] = None
    lv = s.lv("x", "w1")
    lv[1]["status"]["code"] = None
    failed = s.event("PersistentVolumeClaim", "big", "ProvisioningFailed", "boom")
    snap = s.snapshot(*s.node("w1"), s.sc(), s.csidriver(), claim, lv, failed)
    snap["pvcs"][0]["metadata"]["annotations"] = None
    report = diagnose(snap, Scope("app", pvc="big"))
    assert "pvc-provisioning" in [f.check for f in report.findings]
    assert [f.cause for f in report.findings if f.severity == Severity.UNDECIDED] == []


def test_events_of_an_earlier_pod_of_the_same_name_are_not_evidence() -> None:
    snap = seed(message="")
    snap["pods"][0]["metadata"]["uid"] = "new-uid"
    snap["events"][0]["involvedObject"]["uid"] = "old-uid"
    assert run("marker-without-extender", snap) == []


def _copying(name: str, phase: str, message: str, node: str = "w2", source: str = "snap-1",
             done: int = 3 * GiB, total: int = 10 * GiB) -> tuple[str, Obj]:  # fmt: skip
    kind, lv = s.lv(f"pvc-{name}-uid", node)
    lv["metadata"]["annotations"] = {"topolvm.io/claim": f"app/{name}"}
    lv["spec"]["copy"] = {"source": source}
    lv["status"] = {"volumeID": "x", "copy": {
        "phase": phase, "message": message, "sourceNode": "w1", "doneBytes": done,
        "totalBytes": total, "bytesPerSecond": 80 << 20, "attempts": 2}}  # fmt: skip
    return kind, lv


def test_a_claim_waiting_on_a_copy_shows_its_progress_or_names_the_unreachable_node() -> None:
    snap = s.snapshot(
        *s.node("w1"), *s.node("w2"), s.sc(), s.lv("snap-1", "w1"),
        s.pvc("copying"), _copying("copying", "Copying", "copying snap-1 on w1"),
        s.pvc("stuck"), _copying("stuck", "Pending", "waiting: node w1's transfer port "
                                 "10.0.0.1:9850: [Errno 111] Connection refused; next try in 60s"),
        s.pvc("failed"), _copying("failed", "Failed", "copy failed: the digest differs"),
        s.pvc("bound", phase="Bound"), _copying("bound", "Copying", ""),
    )  # fmt: skip
    findings = {f.title.split(" Pending")[0]: f for f in run("copy-progress", snap)}
    assert set(findings) == {"PVC app/copying", "PVC app/stuck", "PVC app/failed"}
    progress = findings["PVC app/copying"]
    assert progress.severity is Severity.WARNING
    assert progress.title.endswith("30% (3.0 GiB of 10.0 GiB, 80.0 MiB/s)")
    stuck = findings["PVC app/stuck"]
    assert stuck.title == "PVC app/stuck Pending: its copy waits for node w1"
    assert "Connection refused" in stuck.cause
    assert findings["PVC app/failed"].severity is Severity.ERROR

    gone = s.snapshot(*s.node("w2"), s.sc(), s.pvc("stuck"), _copying("stuck", "Pending", ""))
    [f] = run("copy-progress", gone)
    assert f.severity is Severity.ERROR and "node w1 is gone (no Node object)" in f.cause


def test_a_restore_copied_without_the_pod_webhook_says_how_it_would_stay_local() -> None:
    """A restore's copy in progress, with no pod hook of the plugin: the finding says that the
    pod webhook would have placed the pod on the source's node. With the hook, or for a claim
    that is not a restore (a move's), or when the webhooks could not be read: no such line."""
    restored = s.pvc("restored")
    restored[1]["spec"]["dataSource"] = {"apiGroup": "snapshot.storage.k8s.io",
                                         "kind": "VolumeSnapshot", "name": "snap"}  # fmt: skip
    objs = (*s.node("w1"), *s.node("w2"), s.sc(), s.lv("snap-1", "w1"), restored,
            _copying("restored", "Copying", "copying snap-1 on w1"),
            s.pvc("moved"), _copying("moved", "Copying", "copying snap-1 on w1"))  # fmt: skip

    def hints(snap: Snapshot) -> dict[str, bool]:
        return {f.title.split(" Pending")[0]: any("pod webhook" in x.summary for x in f.fixes)
                for f in run("copy-progress", snap)}  # fmt: skip

    without = s.snapshot(*objs)
    assert hints(without) == {"PVC app/restored": True, "PVC app/moved": False}
    [hint] = [x.summary for f in run("copy-progress", without) for x in f.fixes
              if "pod webhook" in x.summary]  # fmt: skip
    assert "node w2, not to its source's node w1" in hint
    assert "webhook.podMutatingWebhook.enabled=true" in hint
    assert hints(s.snapshot(*objs, s.hook())) == {"PVC app/restored": False,
                                                  "PVC app/moved": False}  # fmt: skip
    # webhooks that cannot be read: no hint, and the check still runs (it does not need them)
    unread = s.snapshot(*objs)
    del unread.objects["webhooks"]
    unread.unreadable["webhooks"] = "forbidden"
    assert hints(unread)["PVC app/restored"] is False
    report = diagnose(unread, Scope("app"))
    assert sorted(f.title for f in report.findings if f.check == "copy-progress") == [
        "PVC app/moved Pending: a copy from node w1 fills its volume, 30% (3.0 GiB of 10.0 GiB, "
        "80.0 MiB/s)",
        "PVC app/restored Pending: a copy from node w1 fills its volume, 30% (3.0 GiB of 10.0 "
        "GiB, 80.0 MiB/s)",
    ]
    # a StorageClass whose restores may go anywhere: the webhook would not have preferred w1
    anywhere = s.sc(params={"topolvm.io/restore-placement": "anywhere"})
    others = tuple(o for o in objs if o[0] != "storageclasses")
    assert hints(s.snapshot(*others, anywhere))["PVC app/restored"] is False
    # a value the webhook cannot read (the storage-classes check names it): no hint either
    invalid = s.sc(params={"topolvm.io/restore-placement": "nearby"})
    assert hints(s.snapshot(*others, invalid))["PVC app/restored"] is False
    explicit = s.sc(params={"topolvm.io/restore-placement": "source-node"})
    assert hints(s.snapshot(*others, explicit))["PVC app/restored"] is True

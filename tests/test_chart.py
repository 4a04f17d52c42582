"""The Helm chart (charts/topolvm): lint, render every documented mode, check what each mode
renders, that every ``topolvm`` command line in it parses with our CLI, and that the schema
rejects a misspelled key by name. helm 4 comes from devtools.helm; no cluster is needed."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import gobuild
from tests.chart_helpers import (
    CHART,
    MODES,
    argv_of,
    container,
    containers,
    kinds,
    notes,
    render,
    run_helm,
    topolvm_argv,
    values_args,
)
from topolvm.cli import build_parser
from topolvm.config.lvmd import load_lvmd_config


@pytest.mark.parametrize("mode", MODES)
def test_lint_is_clean_in_every_mode(mode: str) -> None:
    res = run_helm("lint", "--strict", str(CHART), *values_args(mode), check=False)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("mode", MODES)
def test_every_topolvm_command_line_parses(mode: str) -> None:
    docs = render(mode)
    parser = build_parser()
    argvs = [a for c in containers(docs) if (a := topolvm_argv(c)) is not None]
    probes = [
        a
        for c in containers(docs)
        if (cmd := c.get("livenessProbe", {}).get("exec", {}).get("command"))
        and cmd[0].endswith("topolvm")
        and (a := cmd[1:])
    ]
    assert argvs, "no topolvm container rendered"
    for argv in argvs + probes:
        parser.parse_args(argv)  # exits (SystemExit) on an unknown flag


@pytest.mark.parametrize("mode", MODES)
def test_lvmd_configs_load(mode: str, tmp_path: Path) -> None:
    for name, cm in kinds(render(mode), "ConfigMap").items():
        if "lvmd.yaml" in cm.get("data", {}):
            path = tmp_path / f"{name}.yaml"
            path.write_text(cm["data"]["lvmd.yaml"])
            assert load_lvmd_config(path).device_classes, name


def test_default_is_storage_capacity_tracking_without_webhook_or_scheduler() -> None:
    docs = render()
    [driver] = kinds(docs, "CSIDriver").values()
    assert driver["metadata"]["name"] == "topolvm.io"
    assert driver["spec"]["storageCapacity"] is True
    assert driver["spec"]["attachRequired"] is False and driver["spec"]["podInfoOnMount"] is True
    assert not kinds(docs, "MutatingWebhookConfiguration")
    assert not [d for d in docs if "scheduler" in d["metadata"]["name"]]
    [prov] = container(docs, "csi-provisioner")
    assert {"--enable-capacity", "--capacity-ownerref-level=2"} <= set(argv_of(prov))
    [ctl] = container(docs, "topolvm-controller")
    assert "--enable-webhooks=false" in topolvm_argv(ctl)  # type: ignore[operator]
    assert "--pod-webhook-marker" not in str(ctl)
    assert "Storage Capacity Tracking" in notes() and "WARNING" not in notes()
    [sc] = kinds(docs, "StorageClass").values()
    assert sc["provisioner"] == "topolvm.io"
    assert sc["volumeBindingMode"] == "WaitForFirstConsumer"
    assert sc["parameters"]["csi.storage.k8s.io/fstype"] == "xfs"


def test_capacity_tracking_off_follows_into_the_csidriver_and_provisioner() -> None:
    docs = render(None, ("controller.storageCapacityTracking.enabled=false",))
    [driver] = kinds(docs, "CSIDriver").values()
    assert driver["spec"]["storageCapacity"] is False
    [prov] = container(docs, "csi-provisioner")
    assert "--enable-capacity" not in argv_of(prov)
    assert "pods are\n  placed without capacity checks" in notes(
        None, ("controller.storageCapacityTracking.enabled=false",)
    )


@pytest.mark.parametrize("mode", ["extender-daemonset", "extender-deployment"])
def test_extender_modes_print_the_kube_scheduler_stanza(mode: str) -> None:
    docs = render(mode)
    kind = "DaemonSet" if mode.endswith("daemonset") else "Deployment"
    assert [n for n in kinds(docs, kind) if n.endswith("scheduler")]
    text = notes(mode)
    assert "Scheduler extender" in text
    stanza = text.split("kind: KubeSchedulerConfiguration", 1)[1]
    assert "filterVerb: predicate" in stanza and "prioritizeVerb: prioritize" in stanza
    assert ("managedResources" in stanza) == mode.endswith("deployment")  # marker mode there
    assert "topolvm scheduler print-config" in text


def test_marker_mode_needs_the_scheduler() -> None:
    res = run_helm("template", "t", str(CHART), "--set",
                   "webhook.podMutatingWebhook.enabled=true,webhook.podMutatingWebhook.marker=true",
                   check=False)  # fmt: skip
    assert res.returncode != 0
    assert "webhook.podMutatingWebhook.marker" in res.stderr and "scheduler.enabled" in res.stderr


def test_two_controllers_without_leader_election_are_refused() -> None:
    """Both replicas would run the reconcilers and drive the same VolumeMoves at once."""
    res = run_helm("template", "t", str(CHART), "--set", "controller.leaderElection.enabled=false",
                   check=False)  # fmt: skip
    assert res.returncode != 0
    assert ("controller.leaderElection.enabled=false needs controller.replicaCount=1, not 2"
            in res.stderr), res.stderr  # fmt: skip
    one = render(None, ("controller.leaderElection.enabled=false", "controller.replicaCount=1"))
    [deployment] = [d for d in kinds(one, "Deployment").values()
                    if d["metadata"]["name"].endswith("-controller")]  # fmt: skip
    assert deployment["spec"]["replicas"] == 1
    assert "--leader-election=false" in argv_of(container(one, "topolvm-controller")[0])
    # without leader election the old controller stops before the new one starts
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


def controller_deployment(sets: tuple[str, ...]) -> dict[str, Any]:
    [deployment] = [d for d in kinds(render(None, sets), "Deployment").values()
                    if d["metadata"]["name"].endswith("-controller")]  # fmt: skip
    return deployment


def test_without_leader_election_only_a_recreate_update_is_allowed() -> None:
    """A rolling update starts the new controller before the old one stops: without leader
    election both would reconcile the same VolumeMoves for a while. The chart sets Recreate
    unless told a strategy; a strategy of another type is refused, naming the key."""
    alone = ("controller.leaderElection.enabled=false", "controller.replicaCount=1")
    for strategy in (("controller.updateStrategy.type=RollingUpdate",),
                     ("controller.updateStrategy.rollingUpdate.maxSurge=0",)):  # fmt: skip
        res = run_helm("template", "t", str(CHART), *values_args(None, alone + strategy),
                       check=False)  # fmt: skip
        assert res.returncode != 0, strategy
        assert ("controller.leaderElection.enabled=false needs controller.updateStrategy of type "
                "Recreate" in res.stderr), res.stderr  # fmt: skip
    told = controller_deployment((*alone, "controller.updateStrategy.type=Recreate"))
    assert told["spec"]["strategy"] == {"type": "Recreate"}
    # with leader election: the chart leaves the strategy alone, whatever it is
    assert "strategy" not in controller_deployment(())["spec"]
    rolling = controller_deployment(("controller.updateStrategy.rollingUpdate.maxSurge=0",))
    assert rolling["spec"]["strategy"] == {"rollingUpdate": {"maxSurge": 0}}


def test_webhook_without_extender_renders_with_a_warning_naming_the_keys() -> None:
    text = notes(None, ("webhook.podMutatingWebhook.enabled=true",))
    assert "WARNING: webhook.podMutatingWebhook.enabled=true while scheduler.enabled=false" in text


def test_webhook_certificate_modes() -> None:
    cm = render("webhook-certmanager")
    assert kinds(cm, "Certificate") and kinds(cm, "Issuer")
    [ctl] = container(cm, "topolvm-controller")
    assert "--cert-dir=/certs" in topolvm_argv(ctl)  # type: ignore[operator]

    own = render("webhook-selfmanaged")
    assert not kinds(own, "Certificate")
    [ctl] = container(own, "topolvm-controller")
    argv = topolvm_argv(ctl)
    assert argv is not None and "--cert-dir=" in argv
    [hook] = kinds(own, "MutatingWebhookConfiguration").values()
    assert f"--webhook-configuration-name={hook['metadata']['name']}" in argv
    roles = [d for d in own if d["kind"] in ("Role", "ClusterRole")]
    assert any("secrets" in r.get("resources", []) for role in roles for r in role["rules"])

    bundle = render("webhook-cabundle")
    [hook] = kinds(bundle, "MutatingWebhookConfiguration").values()
    assert hook["webhooks"][0]["clientConfig"]["caBundle"]
    assert not kinds(bundle, "Certificate")


def test_legacy_uses_the_old_group_everywhere() -> None:
    docs = render("legacy")
    [driver] = kinds(docs, "CSIDriver").values()
    assert driver["metadata"]["name"] == "topolvm.cybozu.com"
    for c in container(docs, "topolvm-node") + container(docs, "topolvm-controller"):
        assert {"name": "USE_LEGACY", "value": "true"} in c.get("env", [])
    assert {sc["provisioner"] for sc in kinds(docs, "StorageClass").values()} == {
        "topolvm.cybozu.com"
    }


def test_embedded_lvmd_has_no_lvmd_daemonset() -> None:
    docs = render("lvmd-embedded")
    assert not [n for n in kinds(docs, "DaemonSet") if "lvmd" in n]
    [node] = container(docs, "topolvm-node")
    assert "--embed-lvmd" in topolvm_argv(node)  # type: ignore[operator]


def test_snapshot_off_drops_the_snapshotter() -> None:
    assert container(render(), "csi-snapshotter")
    assert not container(render("no-snapshot"), "csi-snapshotter")


def test_device_classes_reach_lvmd_and_storage_classes(tmp_path: Path) -> None:
    docs = render("device-classes")
    [cm] = [c for c in kinds(docs, "ConfigMap").values() if "lvmd.yaml" in c.get("data", {})]
    path = tmp_path / "lvmd.yaml"
    path.write_text(cm["data"]["lvmd.yaml"])
    assert len(load_lvmd_config(path).device_classes) >= 3


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("controller.storageCapacityTraking.enabled=false", "storageCapacityTraking"),
        ("lvmd.manged=false", "manged"),
        ("scheduler.enabled=yes", "enabled"),
    ],
)
def test_schema_rejects_a_misspelled_key_or_wrong_type_by_name(setting: str, key: str) -> None:
    res = run_helm("template", "t", str(CHART), "--set-string" if "yes" in setting else "--set",
                   setting, check=False)  # fmt: skip
    assert res.returncode != 0
    assert key in res.stderr, res.stderr


# -- the controller's RBAC covers what the pinned sidecars' own manifests ask for ----------------

SIDECAR_RBAC = {
    "csi-provisioner": ("external-provisioner", "deploy/kubernetes/rbac.yaml"),
    "csi-resizer": ("external-resizer", "deploy/kubernetes/rbac.yaml"),
    "csi-snapshotter": ("external-snapshotter",
                        "deploy/kubernetes/csi-snapshotter/rbac-csi-snapshotter.yaml"),
}  # fmt: skip


def module_file(binary: str) -> Path:
    """A file of the sidecar's Go module at the version the tests build (devtools/gomod)."""
    repo, path = SIDECAR_RBAC[binary]
    pkg, version = next((p, v) for p, v in gobuild.versions().items() if f"/{repo}/" in p)
    module = pkg.split("/cmd/")[0]
    cache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True,
                           check=True).stdout.strip()  # fmt: skip
    return Path(cache) / f"{module}@{version}" / path


Grant = tuple[str, str, str]  # (API group, resource, verb)


def grants(rules: list[dict[str, Any]]) -> set[Grant]:
    return {(g, r, v) for rule in rules for g in rule.get("apiGroups", [])
            for r in rule.get("resources", []) for v in rule.get("verbs", [])}  # fmt: skip


def controller_grants(docs: list[dict[str, Any]]) -> tuple[set[Grant], set[Grant]]:
    """(cluster-wide, namespaced) grants of the controller's ServiceAccount in a render."""
    [sa] = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"
            and d["metadata"]["name"].endswith("-controller")]  # fmt: skip
    roles = {(d["kind"], d["metadata"]["name"]): d.get("rules", []) for d in docs
             if d["kind"] in ("ClusterRole", "Role")}  # fmt: skip
    cluster: set[Grant] = set()
    namespaced: set[Grant] = set()
    for b in docs:
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding") and any(
            s.get("name") == sa for s in b.get("subjects", [])
        ):
            rules = grants(roles[(b["roleRef"]["kind"], b["roleRef"]["name"])])
            (cluster if b["kind"] == "ClusterRoleBinding" else namespaced).update(rules)
    return cluster, namespaced


@pytest.mark.parametrize("binary", sorted(SIDECAR_RBAC))
def test_controller_rbac_covers_the_pinned_sidecars_own_rbac(binary: str) -> None:
    path = module_file(binary)
    if not path.exists():
        gobuild.ensure(binary)  # downloads the module
    upstream = [d for d in yaml.safe_load_all(path.read_text()) if d]
    cluster, namespaced = controller_grants(render())
    for doc in upstream:
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        wanted = grants(doc["rules"])
        have = cluster if doc["kind"] == "ClusterRole" else cluster | namespaced
        missing = wanted - have
        assert not missing, f"{binary} {doc['kind']} {doc['metadata']['name']}: {sorted(missing)}"


def test_both_crds_are_rendered_and_never_deleted_by_helm() -> None:
    for mode in (None, "legacy"):
        crds = kinds(render(mode), "CustomResourceDefinition")
        assert set(crds) == {
            "logicalvolumes.topolvm.io", "logicalvolumes.topolvm.cybozu.com",
            "volumemoves.topolvm.io",  # a VolumeMove has no legacy group
        }  # fmt: skip
        for crd in crds.values():
            assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    extra = kinds(render(None, ("crd.annotations.example\\.com/x=y",)), "CustomResourceDefinition")
    assert all(c["metadata"]["annotations"]["example.com/x"] == "y" for c in extra.values())

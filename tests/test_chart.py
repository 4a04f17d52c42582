"""The Helm chart (charts/topolvm): lint, render every documented mode, check what each mode
renders, that every ``topolvm`` command line in it parses with our CLI, and that the schema
rejects a misspelled key by name. helm 4 comes from devtools.helm; no cluster is needed."""

from __future__ import annotations

import functools
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import gobuild
from devtools.helm import helm
from topolvm.cli import build_parser
from topolvm.config.lvmd import load_lvmd_config
from topolvm.node.cli import options_from_args

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "topolvm"
MODES = sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml"))
NS = "topolvm-system"


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm()), *args], capture_output=True, text=True, check=check, timeout=120
    )


def values_args(mode: str | None, sets: tuple[str, ...] = ()) -> list[str]:
    files = ["-f", str(CHART / "ci" / f"{mode}-values.yaml")] if mode else []
    return files + [a for s in sets for a in ("--set", s)]


@functools.cache
def render(mode: str | None = None, sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    out = run_helm("template", "t", str(CHART), "-n", NS, *values_args(mode, sets)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def notes(mode: str | None = None, sets: tuple[str, ...] = ()) -> str:
    res = run_helm("install", "t", str(CHART), "-n", NS, "--dry-run=client",
                   *values_args(mode, sets))  # fmt: skip
    return res.stdout.split("NOTES:", 1)[1]


def kinds(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet"):
            spec = d["spec"]["template"]["spec"]
            out += spec.get("initContainers", []) + spec["containers"]
    return out


def container(docs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [c for c in containers(docs) if c["name"] == name]


def argv_of(c: dict[str, Any]) -> list[str]:
    return [*c.get("command", []), *c.get("args", [])]


def topolvm_argv(c: dict[str, Any]) -> list[str] | None:
    argv = argv_of(c)
    if argv and argv[0].endswith("topolvm"):
        return argv[1:]
    if argv[:2] == ["sh", "-c"] and "topolvm " in argv[2]:
        return shlex.split(argv[2])[1:]
    return None


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


# -- the kubernetes-csi sidecars whose jobs topolvm does itself (csiSidecars) --------------------

BUILTIN_SIDECARS = "builtin-sidecars"


def pod_spec(docs: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    [obj] = [d for n, d in kinds(docs, kind).items() if n.endswith(suffix)]
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def flag(argv: list[str], name: str) -> str | None:
    """The value of ``--name=value`` in ``argv``; "" for a bare ``--name``; None if absent."""
    for arg in argv:
        key, eq, value = arg.partition("=")
        if key == name:
            return value if eq else ""
    return None


def liveness_port(c: dict[str, Any]) -> tuple[str, int]:
    """(path, container port number) the container's liveness probe calls."""
    get = c["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    port = get["port"]
    return get["path"], ports[port] if isinstance(port, str) else port


def test_default_keeps_the_registrar_and_livenessprobe_sidecars() -> None:
    docs = render()
    node = pod_spec(docs, "DaemonSet", "-node")
    names = [c["name"] for c in node["containers"]]
    assert names == ["topolvm-node", "csi-registrar", "liveness-probe"]
    [topolvm, registrar, probe] = node["containers"]
    socket = flag(argv_of(topolvm), "--csi-socket")
    assert flag(argv_of(registrar), "--kubelet-registration-path") == socket
    assert {"name": "registration-dir", "mountPath": "/registration"} in registrar["volumeMounts"]
    node_argv = topolvm_argv(topolvm)
    assert node_argv is not None
    assert flag(node_argv, "--register-with-kubelet") is None
    assert flag(node_argv, "--health-probe-bind-address") is None
    assert "registration-dir" not in {m["name"] for m in topolvm["volumeMounts"]}
    assert liveness_port(topolvm) == ("/healthz", 9808)  # served by the sidecar
    assert flag(argv_of(probe), "--http-endpoint") == ":9808"

    controller = pod_spec(docs, "Deployment", "-controller")
    [ctl] = [c for c in controller["containers"] if c["name"] == "topolvm-controller"]
    [ctl_probe] = [c for c in controller["containers"] if c["name"] == "liveness-probe"]
    assert liveness_port(ctl) == ("/healthz", 9808)
    assert flag(argv_of(ctl_probe), "--http-endpoint") == ":9808"


@pytest.mark.parametrize(
    "kubelet", ["/var/lib/kubelet", "/var/snap/microk8s/common/var/lib/kubelet"]
)
def test_builtin_sidecars_topolvm_registers_and_probes_itself(kubelet: str) -> None:
    sets = () if kubelet == "/var/lib/kubelet" else (f"node.kubeletWorkDirectory={kubelet}",)
    docs = render(BUILTIN_SIDECARS, sets)
    assert not container(docs, "csi-registrar") and not container(docs, "liveness-probe")

    node = pod_spec(docs, "DaemonSet", "-node")
    [topolvm] = node["containers"]
    argv = topolvm_argv(topolvm)
    assert argv is not None
    socket = f"{kubelet}/plugins/topolvm.io/node/csi-topolvm.sock"
    registry = f"{kubelet}/plugins_registry"
    assert flag(argv, "--csi-socket") == socket
    assert flag(argv, "--register-with-kubelet") == ""
    assert flag(argv, "--plugin-registration-path") == registry
    assert flag(argv, "--kubelet-registration-path") == socket
    # the flags mean what they say to our CLI: the kubelet is told the chart's socket path
    options = options_from_args(build_parser().parse_args([*argv, "--nodename=n1"]))
    assert options.registration is not None
    assert options.registration.socket("topolvm.io") == f"{registry}/topolvm.io-reg.sock"
    assert options.registration.endpoint == socket
    # the kubelet's registration folder is the host's, mounted where the flag says
    [volume] = [v for v in node["volumes"] if v["name"] == "registration-dir"]
    assert volume["hostPath"]["path"].rstrip("/") == registry
    [mount] = [m for m in topolvm["volumeMounts"] if m["name"] == "registration-dir"]
    assert mount["mountPath"].rstrip("/") == registry
    # the liveness probe calls topolvm-node's own /healthz
    assert options.health_address == ("0.0.0.0", 9808)
    assert liveness_port(topolvm) == ("/healthz", 9808)

    controller = pod_spec(docs, "Deployment", "-controller")
    [ctl] = [c for c in controller["containers"] if c["name"] == "topolvm-controller"]
    ctl_argv = topolvm_argv(ctl)
    assert ctl_argv is not None
    assert flag(ctl_argv, "--health-probe-bind-address") == ":8081"
    assert liveness_port(ctl) == ("/healthz", 8081)
    assert 9808 not in {p["containerPort"] for p in ctl["ports"]}  # nothing listens there now
    assert "Kubelet registration: by topolvm-node itself" in notes(BUILTIN_SIDECARS)


def test_csi_sidecars_are_dropped_one_at_a_time() -> None:
    docs = render(None, ("csiSidecars.nodeDriverRegistrar=false",))
    assert [c["name"] for c in pod_spec(docs, "DaemonSet", "-node")["containers"]] == [
        "topolvm-node", "liveness-probe",
    ]  # fmt: skip
    [topolvm] = container(docs, "topolvm-node")
    argv = topolvm_argv(topolvm)
    assert argv is not None and flag(argv, "--health-probe-bind-address") is None
    assert flag(argv, "--register-with-kubelet") == ""

    docs = render(None, ("csiSidecars.livenessProbe=false",))
    assert [c["name"] for c in pod_spec(docs, "DaemonSet", "-node")["containers"]] == [
        "topolvm-node", "csi-registrar",
    ]  # fmt: skip
    [topolvm] = container(docs, "topolvm-node")
    argv = topolvm_argv(topolvm)
    assert argv is not None and flag(argv, "--register-with-kubelet") is None
    assert flag(argv, "--health-probe-bind-address") == ":9808"


def test_the_transfer_port_its_token_and_rbac_are_rendered_and_can_be_turned_off() -> None:
    """docs/mobility.md: the node pods serve the transfer port on their IP, carry the projected
    token receivers show, may review tokens; the sidecars pass the claim's name on."""
    docs = render(sets=("node.transfer.bandwidthLimit=100Mi",))
    [node] = container(docs, "topolvm-node")
    argv = topolvm_argv(node)
    assert argv is not None
    assert {"--transfer-bind-address=:9850", "--transfer-bandwidth=100Mi"} <= set(argv)
    options = options_from_args(build_parser().parse_args([*argv, "--nodename=n1"]))
    assert options.transfer.limits.bandwidth == 100 << 20
    assert {"name": "transfer", "containerPort": 9850, "protocol": "TCP"} in node["ports"]
    assert any(e["name"] == "POD_IP" for e in node["env"])
    [ds] = [d for d in kinds(docs, "DaemonSet").values() if "node" in d["metadata"]["name"]]
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    [source] = volumes["transfer-token"]["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "topolvm-transfer"
    mount = next(m for m in node["volumeMounts"] if m["name"] == "transfer-token")
    assert mount["mountPath"] == "/var/run/secrets/topolvm.io/transfer" and mount["readOnly"]
    [role] = [r for n, r in kinds(docs, "ClusterRole").items() if n.endswith("topolvm-node")]
    rules = [
        (tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"]
    ]
    assert (("authentication.k8s.io",), ("tokenreviews",), ("create",)) in rules
    for sidecar in ("csi-provisioner", "csi-snapshotter"):
        assert "--extra-create-metadata" in argv_of(container(docs, sidecar)[0])

    off = render(sets=("node.transfer.enabled=false",))
    [node] = container(off, "topolvm-node")
    assert "--transfer-bind-address=0" in (topolvm_argv(node) or [])
    assert not any(m["name"] == "transfer-token" for m in node["volumeMounts"])


def test_the_node_account_is_confined_to_its_own_node_unless_turned_off() -> None:
    """node.ownNodeOnly (docs/security.md): a ValidatingAdmissionPolicy, bound, that applies to
    topolvm-node's ServiceAccount of this release (the cluster test checks what it denies)."""
    docs = render()
    [policy] = kinds(docs, "ValidatingAdmissionPolicy").values()
    [binding] = kinds(docs, "ValidatingAdmissionPolicyBinding").values()
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    [ds] = [d for d in kinds(docs, "DaemonSet").values() if "node" in d["metadata"]["name"]]
    account = ds["spec"]["template"]["spec"]["serviceAccountName"]
    conditions = {c["name"]: c["expression"] for c in policy["spec"]["matchConditions"]}
    assert f'"system:serviceaccount:{NS}:{account}"' in conditions["topolvm-node"]
    assert not kinds(render(sets=("node.ownNodeOnly=false",)), "ValidatingAdmissionPolicy")

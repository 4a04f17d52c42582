"""The chart's node side (charts/topolvm): the kubernetes-csi sidecars whose jobs topolvm-node
can do itself (csiSidecars), the transfer port, its tokens, RBAC and NetworkPolicy, and the
admission policies that confine topolvm-node's ServiceAccount (docs/security.md). Rendered
only; tests/test_cluster_chart.py and tests/test_cluster_transfer_faults.py run them."""

from __future__ import annotations

import pytest

from tests.chart_helpers import (
    NS,
    argv_of,
    container,
    flag,
    kinds,
    liveness_port,
    notes,
    pod_spec,
    render,
    topolvm_argv,
)
from topolvm.cli import build_parser
from topolvm.node.cli import options_from_args

# -- the kubernetes-csi sidecars whose jobs topolvm does itself (csiSidecars) --------------------

BUILTIN_SIDECARS = "builtin-sidecars"


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
    """docs/mobility.md: the node pods serve the transfer port on their IP, may make tokens
    (TokenRequest) for their own ServiceAccount alone and review tokens; no token shared by all
    nodes is mounted any more; the sidecars pass the claim's name on."""
    docs = render(sets=("node.transfer.bandwidthLimit=100Mi",))
    [node] = container(docs, "topolvm-node")
    argv = topolvm_argv(node)
    assert argv is not None
    assert {"--transfer-bind-address=:9850", "--transfer-bandwidth=100Mi",
            "--transfer-token-expiration=600"} <= set(argv)  # fmt: skip
    options = options_from_args(build_parser().parse_args([*argv, "--nodename=n1"]))
    assert options.transfer.limits.bandwidth == 100 << 20
    assert options.transfer.token_seconds == 600
    assert {"name": "transfer", "containerPort": 9850, "protocol": "TCP"} in node["ports"]
    assert any(e["name"] == "POD_IP" for e in node["env"])
    [ds] = [d for d in kinds(docs, "DaemonSet").values() if "node" in d["metadata"]["name"]]
    account = ds["spec"]["template"]["spec"]["serviceAccountName"]
    volumes = ds["spec"]["template"]["spec"].get("volumes", [])
    assert not [v for v in volumes if "projected" in v]  # tokens are made per source node
    [role] = [r for n, r in kinds(docs, "ClusterRole").items() if n.endswith("topolvm-node")]
    rules = [
        (tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"]
    ]
    assert (("authentication.k8s.io",), ("tokenreviews",), ("create",)) in rules
    assert not any("serviceaccounts/token" in r[1] for r in rules)  # not cluster-wide
    [token_role] = [r for r in kinds(docs, "Role").values() if r["metadata"]["name"] == account]
    assert token_role["metadata"]["namespace"] == NS
    assert token_role["rules"] == [{"apiGroups": [""], "resources": ["serviceaccounts/token"],
                                    "resourceNames": [account], "verbs": ["create"]}]  # fmt: skip
    [binding] = [b for b in kinds(docs, "RoleBinding").values() if b["roleRef"]["name"] == account]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NS}]
    for sidecar in ("csi-provisioner", "csi-snapshotter"):
        assert "--extra-create-metadata" in argv_of(container(docs, sidecar)[0])

    off = render(sets=("node.transfer.enabled=false",))
    [node] = container(off, "topolvm-node")
    assert "--transfer-bind-address=0" in (topolvm_argv(node) or [])
    assert not [r for r in kinds(off, "Role").values() if r["metadata"]["name"] == account]


def test_the_transfer_port_network_policy_admits_only_node_pods_when_asked() -> None:
    """node.transfer.networkPolicy (docs/security.md): off by default; on, the node pods'
    transfer port admits only the node pods of this release, and their other ports stay open."""
    assert not kinds(render(), "NetworkPolicy")
    docs = render(sets=("node.transfer.networkPolicy.enabled=true", "node.transfer.port=9900"))
    [policy] = kinds(docs, "NetworkPolicy").values()
    [ds] = [d for d in kinds(docs, "DaemonSet").values() if "node" in d["metadata"]["name"]]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    selects = policy["spec"]["podSelector"]["matchLabels"]
    assert selects.items() <= pod_labels.items() and policy["metadata"]["namespace"] == NS
    lvmd = [d for n, d in kinds(docs, "DaemonSet").items() if "lvmd" in n]
    for other in lvmd:  # another component's pods are not what it admits
        assert not selects.items() <= other["spec"]["template"]["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    transfer, rest = policy["spec"]["ingress"]
    assert transfer["ports"] == [{"protocol": "TCP", "port": 9900}]
    [peers] = transfer["from"]
    assert peers == {"podSelector": {"matchLabels": selects}}  # same namespace, node pods only
    served = {p["containerPort"] for c in ds["spec"]["template"]["spec"]["containers"]
              for p in c.get("ports", [])}  # fmt: skip
    assert "from" not in rest and {p["port"] for p in rest["ports"]} == served - {9900}
    off = ("node.transfer.networkPolicy.enabled=true", "node.transfer.enabled=false")
    assert not kinds(render(sets=off), "NetworkPolicy")


def test_the_node_account_makes_tokens_only_as_its_node_whatever_own_node_only_says() -> None:
    """The tokens topolvm-node makes (TokenRequest) have a policy of their own, rendered with
    its Role (node.transfer.enabled) whether node.ownNodeOnly is on or off (docs/security.md):
    it matches serviceaccounts/token, denies a requester whose credentials name no node, and
    requires a binding to the requester's own pod (or Node) and transfer audiences; the cluster
    test shows what the API server makes of it."""
    for sets in ((), ("node.ownNodeOnly=false",)):
        docs = render(sets=sets)
        policies = kinds(docs, "ValidatingAdmissionPolicy")
        [name] = [n for n in policies if n.endswith("-tokens")]
        policy = policies[name]
        [binding] = [b for b in kinds(docs, "ValidatingAdmissionPolicyBinding").values()
                     if b["spec"]["policyName"] == name]  # fmt: skip
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert policy["spec"]["failurePolicy"] == "Fail"
        assert policy["spec"]["matchConstraints"]["resourceRules"] == [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
             "resources": ["serviceaccounts/token"]}]  # fmt: skip
        # no condition that would let a requester without a node name through
        [condition] = policy["spec"]["matchConditions"]
        assert "authentication.kubernetes.io/node-name" not in condition["expression"]
        first, binding_rule = policy["spec"]["validations"]
        assert first["expression"] == "variables.node != ''"
        assert "startsWith('topolvm-transfer:')" in binding_rule["expression"]
        [role] = [r for r in kinds(docs, "Role").values() if r["metadata"]["name"] in name]
        assert role["rules"][0]["resources"] == ["serviceaccounts/token"]
    off = render(sets=("node.transfer.enabled=false",))
    assert not [n for n in kinds(off, "ValidatingAdmissionPolicy") if n.endswith("-tokens")]


def test_the_node_account_is_confined_to_its_own_node_unless_turned_off() -> None:
    """node.ownNodeOnly (docs/security.md): a ValidatingAdmissionPolicy, bound, that applies to
    topolvm-node's ServiceAccount of this release (the cluster test checks what it denies);
    turned off, only the tokens' policy is left."""
    docs = render()
    policies = kinds(docs, "ValidatingAdmissionPolicy")
    [name] = [n for n in policies if n.endswith("-own-node")]
    policy = policies[name]
    [binding] = [b for b in kinds(docs, "ValidatingAdmissionPolicyBinding").values()
                 if b["spec"]["policyName"] == name]  # fmt: skip
    assert binding["spec"]["validationActions"] == ["Deny"]
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert not [r for r in rules if "serviceaccounts/token" in r["resources"]]
    [ds] = [d for d in kinds(docs, "DaemonSet").values() if "node" in d["metadata"]["name"]]
    account = ds["spec"]["template"]["spec"]["serviceAccountName"]
    conditions = {c["name"]: c["expression"] for c in policy["spec"]["matchConditions"]}
    assert f'"system:serviceaccount:{NS}:{account}"' in conditions["topolvm-node"]
    off = kinds(render(sets=("node.ownNodeOnly=false",)), "ValidatingAdmissionPolicy")
    assert list(off) == [name.removesuffix("-own-node") + "-tokens"]


# -- IO limits (docs/qos.md) ---------------------------------------------------------------------


def test_io_limits_mount_the_hosts_cgroups_unless_turned_off() -> None:
    for sets, root in (((), "/host/sys/fs/cgroup"), (("node.ioLimits.enabled=false",), "")):
        docs = render(sets=sets)
        [node] = container(docs, "topolvm-node")
        argv = topolvm_argv(node)
        assert argv is not None and flag(argv, "--cgroup-root") == root
        options = options_from_args(build_parser().parse_args([*argv, "--nodename=n1"]))
        assert options.cgroup_root == root
        spec = pod_spec(docs, "DaemonSet", "-node")
        mounted = {"name": "cgroup-dir", "mountPath": "/host/sys/fs/cgroup"} in node["volumeMounts"]
        host = [v for v in spec["volumes"] if v["name"] == "cgroup-dir"]
        assert mounted == bool(root)
        assert host == ([{"name": "cgroup-dir",
                          "hostPath": {"path": "/sys/fs/cgroup", "type": "Directory"}}]
                        if root else [])  # fmt: skip


def test_volume_attributes_classes_are_rendered_only_when_asked() -> None:
    assert not kinds(render(), "VolumeAttributesClass")
    docs = render(sets=(
        "volumeAttributesClasses[0].name=slow",
        "volumeAttributesClasses[0].parameters.topolvm\\.io/write-bytes-per-second=20Mi",
    ))  # fmt: skip
    [vac] = kinds(docs, "VolumeAttributesClass").values()
    assert vac["metadata"]["name"] == "slow" and vac["driverName"] == "topolvm.io"
    assert vac["parameters"] == {"topolvm.io/write-bytes-per-second": "20Mi"}

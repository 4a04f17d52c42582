"""``topolvm doctor``'s report around the checks: scopes, exit codes, what could not be read,
a failing check, the human and JSON output, and the command line's errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import doctor_scenarios as s
from tests.test_unit_doctor_checks import seed
from topolvm.doctor.model import Check, Finding
from topolvm.doctor.render import as_json, as_text
from topolvm.doctor.run import diagnose
from topolvm.doctor.scope import Scope, ScopeError
from topolvm.doctor.snapshot import Snapshot


def mixed() -> Snapshot:
    """The seed's namespace plus an unrelated broken PVC in another namespace."""
    snap = seed()
    for kind, obj in (
        s.pvc("other", ns="shop"),
        s.event(
            "PersistentVolumeClaim",
            "other",
            "ProvisioningFailed",
            "code = ResourceExhausted desc = no",
            ns="shop",
        ),
    ):
        snap.objects[kind].append(obj)
    return snap


def test_exit_code_is_0_healthy_1_findings_2_could_not_check() -> None:
    assert diagnose(s.snapshot(), Scope()).exit_code == 0
    assert diagnose(seed(), Scope()).exit_code == 1
    partly = s.snapshot()
    partly.unreadable["pods"] = "403 Forbidden: pods is forbidden"
    report = diagnose(partly, Scope())
    undecided = {f.check: f.cause for f in report.findings}
    assert (
        undecided["marker-without-extender"] == "cannot read pods: 403 Forbidden: pods is forbidden"
    )
    assert "csidriver" not in undecided  # it does not read pods
    assert report.exit_code == 0  # what could be checked is healthy; the rest is listed
    blind = s.snapshot()
    blind.unreadable.update({k: "403 Forbidden" for k in blind.objects})
    assert diagnose(blind, Scope()).exit_code == 2


def test_a_check_that_fails_is_reported_and_the_others_still_run() -> None:
    def broken(_: Snapshot) -> list[Finding]:
        raise KeyError("spec")

    bad = Check("bad", 99, (), broken, "a check with a bug")
    from topolvm.doctor.checks import all_checks

    report = diagnose(seed(), Scope(), [*all_checks(), bad])
    assert report.findings[0].check == "marker-without-extender"
    assert report.findings[-1].cause == "the check failed: KeyError: 'spec'"


def test_scopes_keep_what_concerns_the_pod_pvc_or_namespace() -> None:
    snap = mixed()
    everything = {f.check for f in diagnose(snap, Scope()).findings}
    assert everything == {"marker-without-extender", "pvc-provisioning"}
    assert {f.check for f in diagnose(snap, Scope("vault")).findings} == {"marker-without-extender"}
    assert {f.check for f in diagnose(snap, Scope("vault", pod="vault-1")).findings} == {
        "marker-without-extender"}  # fmt: skip
    assert {f.check for f in diagnose(snap, Scope("shop", pvc="other")).findings} == {
        "pvc-provisioning"}  # fmt: skip
    with pytest.raises(ScopeError, match="pod vault/nope not found"):
        diagnose(snap, Scope("vault", pod="nope"))


def test_text_groups_by_severity_and_colours_only_on_request() -> None:
    report = diagnose(seed(), Scope())
    plain = as_text(report, 0.42, colour=False)
    lines = plain.splitlines()
    assert lines[0].startswith("topolvm doctor: the whole cluster: 1 error (")
    assert lines[2] == "ERRORS"
    assert "   cause: pod webhook adds topolvm.io/capacity but kube-scheduler has no extender" \
        " for it" in lines  # fmt: skip
    assert "       $ kubectl delete pod -n vault vault-0 vault-1 vault-2" in lines
    assert "\033[" not in plain and "\033[31m" in as_text(report, 0.42, colour=True)
    healthy = as_text(diagnose(s.snapshot(), Scope()), 0.1, colour=False)
    assert healthy.startswith("topolvm doctor: the whole cluster: healthy (")


def test_json_document() -> None:
    doc = json.loads(as_json(diagnose(seed(), Scope("vault")), 0.5))
    assert doc["scope"] == "namespace vault" and doc["healthy"] is False
    first = doc["findings"][0]
    assert set(first) == {"check", "severity", "title", "cause", "evidence", "fixes", "objects"}
    assert {"kind": "Pod", "name": "vault-0", "namespace": "vault"} in first["objects"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "topolvm", "doctor", *args],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def test_an_unreachable_api_server_or_bad_kubeconfig_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "x"}}],
    }))  # fmt: skip
    res = cli(f"--kubeconfig={config}")
    assert res.returncode == 2 and "could not check: cannot reach the Kubernetes API" in res.stderr
    res = cli(f"--kubeconfig={tmp_path / 'missing'}")
    assert res.returncode == 2 and "cannot load Kubernetes client configuration" in res.stderr
    res = cli(f"--kubeconfig={config}", "--context=nope")
    assert res.returncode == 2 and "Context 'nope' not found" in res.stderr
    res = cli(f"--kubeconfig={config}", "--context=c")
    assert res.returncode == 2 and "cannot reach the Kubernetes API" in res.stderr
    res = cli("--stale-after=soon")
    assert res.returncode == 2 and "not a duration: 'soon'" in res.stderr


def test_a_namespace_scope_leaves_out_other_namespaces_on_the_same_node() -> None:
    claim = s.pvc("other", ns="shop", annotations={"volume.kubernetes.io/selected-node": "w1"})
    snap = s.snapshot(
        *s.node("w1"), s.sc(), s.csidriver(), s.capacity("topolvm-provisioner", "w1", 240 << 30),
        s.pod("db-0", "vault", node_name="w1", phase="Running"), claim,
        s.event("PersistentVolumeClaim", "other", "ProvisioningFailed", "ResourceExhausted",
                ns="shop"),
    )  # fmt: skip
    assert [f.check for f in diagnose(snap, Scope()).findings] == ["pvc-provisioning"]
    assert diagnose(snap, Scope("vault")).findings == []
    with pytest.raises(ScopeError, match="namespace typo has no pods and no PVCs"):
        diagnose(snap, Scope("typo"))

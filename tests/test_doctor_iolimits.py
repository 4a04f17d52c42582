"""topolvm doctor's io-limits check (docs/troubleshooting.md): a claim whose
VolumeAttributesClass was refused or waits for a class, and a volume whose node said its limits
are not in force."""

from __future__ import annotations

from tests import doctor_scenarios as s
from topolvm.doctor.checks import all_checks
from topolvm.doctor.model import Finding, Severity
from topolvm.doctor.snapshot import Obj, Snapshot
from topolvm.iolimits import EVENT_NAMESPACE, NODE_CONDITION, NOT_IN_FORCE_REASON


def run(snap: Snapshot) -> list[Finding]:
    [check] = [c for c in all_checks() if c.id == "io-limits"]
    return check.run(snap)


def modified(state: str, target: str = "fast") -> tuple[str, Obj]:
    kind, pvc = s.pvc("data", phase="Bound")
    status = {"status": state, "targetVolumeAttributesClassName": target}
    pvc["status"].update(currentVolumeAttributesClassName="slow", modifyVolumeStatus=status)
    return kind, pvc


def test_a_refused_class_names_the_claim_the_key_and_what_stays_in_force() -> None:
    refused = (
        "rpc error: code = InvalidArgument desc = VolumeAttributesClass parameter "
        "topolvm.io/write-bytes-per-second: 'fast' is not a positive whole quantity or 'max'"
    )
    snap = s.snapshot(
        s.sc(),
        modified("Infeasible"),
        s.event("PersistentVolumeClaim", "data", "VolumeModifyFailed", refused),
    )
    [f] = run(snap)
    assert f.severity == Severity.ERROR
    assert f.title == "PVC app/data: VolumeAttributesClass fast not applied (Infeasible)"
    assert any("still those of class slow" in e for e in f.evidence)
    assert any("topolvm.io/write-bytes-per-second" in e for e in f.evidence)
    assert f.fixes[0].commands == ("kubectl get volumeattributesclass fast -o yaml",)


def test_a_class_that_does_not_exist_is_a_warning_and_a_change_in_progress_is_quiet() -> None:
    [f] = run(s.snapshot(s.sc(), modified("Pending")))
    assert f.severity == Severity.WARNING and "(Pending)" in f.title
    assert run(s.snapshot(s.sc(), modified("InProgress"))) == []
    assert run(s.snapshot(s.sc(), s.pvc("data", phase="Bound"))) == []


def test_a_volume_whose_node_cannot_limit_it_is_named_with_the_nodes_words() -> None:
    kind, lv = s.lv("pvc-1", "w1")
    lv["spec"]["ioLimits"] = {"writeBytesPerSecond": 20 << 20}
    said = "IO limits cannot be put in force on node w1: the kernel has no block throttling"
    event = s.event("LogicalVolume", "pvc-1", NOT_IN_FORCE_REASON, said, ns=EVENT_NAMESPACE)
    [f] = run(s.snapshot((kind, lv), event))
    assert f.title == "LogicalVolume pvc-1: IO limits not in force on node w1"
    assert f"spec.ioLimits: writeBytesPerSecond={20 << 20}" in f.evidence
    assert any(said in e for e in f.evidence)
    # without limits in the spec, an old Event is not a finding
    lv["spec"].pop("ioLimits")
    assert run(s.snapshot((kind, lv), event)) == []


def test_a_volume_on_a_node_whose_condition_says_it_cannot_limit_is_named() -> None:
    kind, lv = s.lv("pvc-2", "w2")
    lv["spec"]["ioLimits"] = {"readIOPS": 200}
    [(nodes, w2)] = s.node("w2", csi=False)
    message = "the kernel of node w2 offers no io controller (cgroup.controllers: cpu memory)"
    w2["status"]["conditions"] = [
        {"type": "Ready", "status": "True"},
        {"type": NODE_CONDITION, "status": "True", "reason": "NoIOController", "message": message},
    ]
    [f] = run(s.snapshot((kind, lv), (nodes, w2)))
    assert f.title == "LogicalVolume pvc-2: IO limits not in force on node w2"
    assert f"Node w2: condition {NODE_CONDITION} True (NoIOController): {message}" in f.evidence
    # a node that can limit (status False) is no finding
    w2["status"]["conditions"][1].update(status="False", reason="CgroupV2IO")
    assert run(s.snapshot((kind, lv), (nodes, w2))) == []

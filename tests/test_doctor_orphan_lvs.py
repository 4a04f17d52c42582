"""``topolvm doctor``'s orphan-lvs check over snapshots: a Node whose topolvm-node listed LVs
that no LogicalVolume claims gives one finding naming each LV, its size and the command that
removes it (through the node's topolvm-node pod when that runs LVM in the host's namespaces);
a Node without the annotation gives none. What topolvm-node writes there is tested in
tests/test_node_orphans.py, against real LVM."""

from __future__ import annotations

from tests import doctor_scenarios as s
from topolvm.constants import NORMAL
from topolvm.doctor.checks import all_checks
from topolvm.doctor.model import Finding, Severity
from topolvm.doctor.snapshot import Snapshot
from topolvm.k8s import orphanlvs
from topolvm.k8s.orphanlvs import Kind, OrphanLv

GiB = 1 << 30
UID = "6a1c2d3e-0000-4000-8000-000000000001"
KEY = orphanlvs.annotation(NORMAL)


def run(snap: Snapshot) -> list[Finding]:
    [check] = [c for c in all_checks() if c.id == "orphan-lvs"]
    return check.run(snap)


def _listing(node: str, value: str | None) -> list[tuple[str, s.Obj]]:
    objs = s.node(node)
    if value is not None:
        objs[0][1]["metadata"]["annotations"][KEY] = value
    return objs


def test_each_lv_is_named_with_its_size_and_the_command_that_removes_it() -> None:
    found = [OrphanLv(UID, "vg1", "ssd", GiB), OrphanLv(f"cut.{UID}", "vg1", "thin", 64 << 20,
                                                         Kind.CUT)]  # fmt: skip
    node_pod = s.pod("topolvm-node-x1", "topolvm-system", node_name="w1",
                     container="topolvm-node", phase="Running", ready=True)  # fmt: skip
    node_pod[1]["spec"]["hostPID"] = True
    [f] = run(s.snapshot(*_listing("w1", orphanlvs.encode(found)), *s.node("w2"), node_pod))
    assert f.severity is Severity.WARNING
    assert f.title == "node w1: 2 LV(s) that no LogicalVolume claims, 1.1 GiB in all"
    assert any(e.startswith(f"LV vg1/{UID} (device class ssd): 1.0 GiB") for e in f.evidence)
    assert any(e.startswith(f"LV vg1/cut.{UID} (device class thin): 64.0 MiB") for e in f.evidence)
    first = f.fixes[0]  # the largest first
    assert first.commands[-1] == (
        "kubectl exec -n topolvm-system topolvm-node-x1 -c topolvm-node -- /usr/bin/nsenter -m "
        f"-u -i -n -p -t 1 /sbin/lvm lvremove -y vg1/{UID}"
    )
    assert [r.name for r in f.subjects] == ["w1"]


def test_without_a_pod_that_runs_lvm_the_command_is_for_the_node_itself() -> None:
    value = orphanlvs.encode([OrphanLv(UID, "vg1", "ssd", GiB)])
    [f] = run(s.snapshot(*_listing("w1", value)))
    assert f.fixes[0].commands == (
        "# on node w1, as root:", f"lvs -o lv_name,lv_size,origin,lv_tags,lv_time vg1/{UID}",
        f"lvremove -y vg1/{UID}",
    )  # fmt: skip


def test_a_long_list_says_how_many_more_there_are() -> None:
    many = [OrphanLv(f"6a1c2d3e-0000-4000-8000-{i:012d}", "vg1", "ssd", GiB) for i in range(25)]
    [f] = run(s.snapshot(*_listing("w1", orphanlvs.encode(many))))
    assert f.title.startswith("node w1: 25 LV(s)") and len(f.fixes) == orphanlvs.LISTED
    assert f.evidence[-1] == "and 5 more (the largest are listed)"


def test_a_damaged_annotation_is_undecided_and_nodes_without_one_are_quiet() -> None:
    [f] = run(s.snapshot(*_listing("w1", "{not json"), *_listing("w2", None)))
    assert f.severity is Severity.UNDECIDED and f.title.endswith("does not decode")
    assert f.fixes[0].commands == (f"kubectl annotate node w1 {KEY}-",)
    assert run(s.snapshot(*_listing("w2", None))) == []

"""LVs on a node that no LogicalVolume claims, as that node's topolvm-node found them and listed
them on its Node (annotation ``<plugin>/orphan-lvs``, :mod:`topolvm.k8s.orphanlvs`): doctor reads
the cluster only and cannot run ``lvs`` on the nodes. Such an LV holds space nothing accounts
for (a thick one as large as a volume can decide whether a drain finishes); topolvm-node never
removes it, since it cannot tell whose it is. Each is named with its size and the command that
removes it, to run once it is known that nothing needs it."""

from __future__ import annotations

from topolvm.constants import Names
from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import BOTH, Obj, Snapshot, annotations_of, name_of, ns_of
from topolvm.k8s import orphanlvs
from topolvm.k8s.orphanlvs import Kind, OrphanLv
from topolvm.units import human

ID = "orphan-lvs"
LVM = "/usr/bin/nsenter -m -u -i -n -p -t 1 /sbin/lvm"  # as the embedded lvmd runs LVM

WHAT = {
    Kind.VOLUME: "named like a LogicalVolume's UID: a volume whose LogicalVolume was deleted "
    "without it (or made by hand, or by another cluster on this VG)",
    Kind.CUT: "named like a copy's point-in-time cut (cut.<UID>) but not tagged topolvm/cut",
    Kind.VERIFY_CUT: "a verification's cut (verify.<UID>) whose digest was reported already",
}


def _commands(snap: Snapshot, node: str, lv: OrphanLv) -> tuple[str, ...]:
    pod: Obj | None = snap.topolvm_node_pod(node)
    if pod is not None and (pod.get("spec") or {}).get("hostPID"):
        run = f"kubectl exec -n {ns_of(pod)} {name_of(pod)} -c topolvm-node -- {LVM}"
        return (f"{run} lvs -o lv_name,lv_size,origin,lv_tags,lv_time {lv.full_name}",
                f"{run} lvremove -y {lv.full_name}")  # fmt: skip
    return (f"# on node {node}, as root:",
            f"lvs -o lv_name,lv_size,origin,lv_tags,lv_time {lv.full_name}",
            f"lvremove -y {lv.full_name}")  # fmt: skip


def _finding(snap: Snapshot, names: Names, node: str, raw: str) -> Finding:
    ref = (Ref("Node", node),)
    key = orphanlvs.annotation(names)
    try:
        found = orphanlvs.decode(raw)
    except ValueError as e:
        return Finding(
            ID, Severity.UNDECIDED, f"node {node}: annotation {key} does not decode",
            "topolvm-node writes it as JSON; something else changed it", (f"{key}: {e}",),
            (Fix("Delete the annotation: topolvm-node writes it again at its next scan.",
                 (f"kubectl annotate node {node} {key}-",)),), ref,
        )  # fmt: skip
    evidence = tuple(
        f"LV {lv.full_name} (device class {lv.device_class or '?'}): {human(lv.size_bytes)}, "
        f"{WHAT.get(lv.kind, lv.kind)}" for lv in found.lvs
    )  # fmt: skip
    if found.count > len(found.lvs):
        evidence += (f"and {found.count - len(found.lvs)} more (the largest are listed)",)
    fixes = tuple(
        Fix(f"Check that nothing needs {lv.full_name} on node {node} ({human(lv.size_bytes)}; "
            "no LogicalVolume names it, so no claim or snapshot of this cluster does), then "
            "remove it.", _commands(snap, node, lv))
        for lv in found.lvs
    )  # fmt: skip
    return Finding(
        ID, Severity.WARNING,
        f"node {node}: {found.count} LV(s) that no LogicalVolume claims, "
        f"{human(found.bytes)} in all",
        "topolvm-node found LVs on its node that no LogicalVolume accounts for; it never "
        "removes them (it cannot tell whose they are), so their space stays taken",
        (f"Node {node} annotation {key}", *evidence), fixes, ref,
    )  # fmt: skip


def run(snap: Snapshot) -> list[Finding]:
    findings = []
    for names in BOTH:
        key = orphanlvs.annotation(names)
        for node in snap["nodes"]:
            raw = annotations_of(node).get(key)
            if raw:
                findings.append(_finding(snap, names, name_of(node), raw))
    return findings


CHECK = Check(
    ID, 9, ("nodes",), run,
    "LVs on a node that no LogicalVolume claims (topolvm-node's scan, on the Node)",
)  # fmt: skip

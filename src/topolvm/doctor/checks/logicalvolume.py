"""LogicalVolume objects (both API groups) that failed (``status.code``), are stuck in
deletion (the finalizer stays: topolvm-node of their node does not run or lvremove fails), or
sit on a Node that no longer exists."""

from __future__ import annotations

from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import BOTH, Snapshot, human_age, meta, name_of

ID = "logicalvolume"
OK_CODES = ("", "0", "OK")


def run(snap: Snapshot) -> list[Finding]:
    findings = []
    nodes = {name_of(n) for n in snap["nodes"]}
    for kind, names in zip(("logicalvolumes", "legacy-logicalvolumes"), BOTH, strict=True):
        resource = f"logicalvolumes.{names.group}"
        for lv in snap[kind]:
            name = name_of(lv)
            spec, status = lv.get("spec") or {}, lv.get("status") or {}
            node = str(spec.get("nodeName", ""))
            subject = (Ref("LogicalVolume", name), Ref("Node", node))
            label = f"LogicalVolume {name} ({names.group}) on node {node}"
            if str(status.get("code", "")) not in OK_CODES:
                findings.append(Finding(
                    ID, Severity.ERROR, f"{label}: creation failed ({status.get('code')})",
                    "lvmd refused to create the volume; the failure is final for this object",
                    (f"{label}: status.code={status.get('code')} "
                     f"status.message={status.get('message', '')!r}",),
                    (Fix("Fix the cause in the message, then delete the PVC (or the "
                         "LogicalVolume) so that provisioning starts over.",
                         (f"kubectl delete {resource} {name}",)),),
                    subject,
                ))  # fmt: skip
            deleting = meta(lv).get("deletionTimestamp")
            age = snap.age(deleting) if deleting else None
            if age is not None and age >= snap.settings.stuck_after:
                pod = snap.topolvm_node_pod(node)
                findings.append(Finding(
                    ID, Severity.ERROR, f"{label}: stuck in deletion for {human_age(age)}",
                    "its finalizer stays until topolvm-node on the node removes the LV, and "
                    + ("that node no longer exists" if node not in nodes
                       else "it has not done so (not running, or lvremove fails)"),
                    (f"{label}: deletionTimestamp {deleting}, finalizers "
                     f"{meta(lv).get('finalizers')}",
                     f"topolvm-node pod on {node}: "
                     + (f"{name_of(pod)} ({(pod.get('status') or {}).get('phase')})"
                        if pod else "none")),
                    (Fix("Bring topolvm-node on the node back (its log names the lvremove "
                         "error). Only if the node and its disk are gone for good, drop the "
                         "finalizer; the LV is then not removed.",
                         (f"kubectl patch {resource} {name} --type=merge "
                          "-p '{\"metadata\":{\"finalizers\":null}}'",)),),
                    subject,
                ))  # fmt: skip
            elif node and node not in nodes and not deleting:
                findings.append(Finding(
                    ID, Severity.WARNING, f"{label}: the node no longer exists",
                    "the Node was deleted without topolvm-controller's node cleanup removing "
                    "its volumes, so this object and its PV/PVC point nowhere",
                    (f"{label}: no Node named {node}",),
                    (Fix("Delete the PVCs that used it (or the LogicalVolume); check that "
                         "topolvm-controller runs (it cleans up after deleted Nodes).",
                         (f"kubectl delete {resource} {name}",)),),
                    subject,
                ))  # fmt: skip
    return findings


CHECK = Check(
    ID, 7, ("logicalvolumes", "legacy-logicalvolumes", "nodes", "pods"), run,
    "LogicalVolumes with status.code, stuck in deletion, or on deleted nodes",
)  # fmt: skip

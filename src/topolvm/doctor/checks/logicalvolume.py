"""LogicalVolume objects (both API groups) that failed (``status.code``: a create that lvmd
refused, or a resize of a volume in use), are stuck in deletion (the finalizer stays:
topolvm-node of their node does not run or lvremove fails), or sit on a Node that no longer
exists."""

from __future__ import annotations

from topolvm.constants import Names
from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import BOTH, Obj, Snapshot, human_age, meta, name_of

ID = "logicalvolume"
DROP_FINALIZER = (
    'kubectl patch {res} {name} --type=merge -p \'{{"metadata":{{"finalizers":null}}}}\''
)


def _failed(lv: Obj, names: Names, label: str, subject: tuple[Ref, ...]) -> Finding | None:
    status = lv.get("status") or {}
    code = status.get("code")
    if code in (None, 0, "", "0", "OK"):
        return None
    evidence = (f"{label}: status.code={code} status.message={status.get('message', '')!r}",)
    if status.get("volumeID") or status.get("currentSize"):
        # The volume exists and holds data: a resize failed. Never suggest deleting it.
        return Finding(
            ID, Severity.WARNING, f"{label}: resize failed ({code})",
            "lvmd could not grow the volume (usually no free space left in the volume group); "
            "the volume itself is intact and topolvm-node retries",
            evidence,
            (Fix("Free space in the node's volume group (or add a disk to it); the resize is "
                 "retried. Do not delete this LogicalVolume: it holds the PVC's data."),),
            subject,
        )  # fmt: skip
    return Finding(
        ID, Severity.ERROR, f"{label}: creation failed ({code})",
        "lvmd refused to create the volume; the failure is final for this object",
        evidence,
        (Fix("Fix the cause in the message, then delete the LogicalVolume (it never held "
             "data): csi-provisioner's next CreateVolume retry starts over.",
             (f"kubectl delete logicalvolumes.{names.group} {name_of(lv)}",)),),
        subject,
    )  # fmt: skip


def run(snap: Snapshot) -> list[Finding]:
    findings = []
    nodes = {name_of(n) for n in snap["nodes"]}
    for kind, names in zip(("logicalvolumes", "legacy-logicalvolumes"), BOTH, strict=True):
        res = f"logicalvolumes.{names.group}"
        for lv in snap[kind]:
            name = name_of(lv)
            node = str((lv.get("spec") or {}).get("nodeName") or "")
            subject = (Ref("LogicalVolume", name),)
            label = f"LogicalVolume {name} ({names.group}) on node {node}"
            node_gone = bool(node) and node not in nodes
            if (failed := _failed(lv, names, label, subject)) is not None:
                findings.append(failed)
            deleting = meta(lv).get("deletionTimestamp")
            age = snap.age(deleting) if deleting else None
            drop = DROP_FINALIZER.format(res=res, name=name)
            if age is not None and age >= snap.settings.stuck_after:
                pod = snap.topolvm_node_pod(node)
                pod_line = (
                    f"topolvm-node pod on {node}: "
                    + (f"{name_of(pod)} ({(pod.get('status') or {}).get('phase')})"
                       if pod else "none")
                )  # fmt: skip
                fix = (
                    Fix("The node is gone, so nothing can remove the LV: drop the finalizer "
                        "(the LV went with the node's disk).", (drop,))
                    if node_gone
                    else Fix("Bring topolvm-node on the node back; its log names the lvremove "
                             "error. Drop the finalizer only if the node's disk is gone for good.",
                             (snap.logs_command("topolvm-node", node),))
                )  # fmt: skip
                findings.append(Finding(
                    ID, Severity.ERROR, f"{label}: stuck in deletion for {human_age(age)}",
                    "its finalizer stays until topolvm-node on the node removes the LV, and "
                    + ("that node no longer exists" if node_gone
                       else "it has not done so (not running, or lvremove fails)"),
                    (f"{label}: deletionTimestamp {deleting}, finalizers "
                     f"{meta(lv).get('finalizers')}", pod_line),
                    (fix,), subject, context=(Ref("Node", node),),
                ))  # fmt: skip
            elif node_gone and not deleting:
                findings.append(Finding(
                    ID, Severity.WARNING, f"{label}: the node no longer exists",
                    "the Node was deleted without topolvm-controller's node cleanup removing "
                    "its volumes, so this object and its PV/PVC point nowhere",
                    (f"{label}: no Node named {node}",),
                    (Fix("Check that topolvm-controller runs (it cleans up after deleted Nodes). "
                         "By hand: delete the PVC that used the volume, then the LogicalVolume, "
                         "and drop its finalizer (no topolvm-node is left to remove it).",
                         (f"kubectl delete {res} {name} --wait=false", drop)),),
                    subject, context=(Ref("Node", node),),
                ))  # fmt: skip
    return findings


CHECK = Check(
    ID, 7, ("logicalvolumes", "legacy-logicalvolumes", "nodes", "pods"), run,
    "LogicalVolumes with status.code, stuck in deletion, or on deleted nodes",
)  # fmt: skip

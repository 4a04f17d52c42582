"""Pending PVCs that wait on a copy (a restore or clone onto another node than its source's,
docs/mobility.md): how far it has come, or why it waits (the source node unreachable, named;
no free slot), or why it failed. Read from the LogicalVolume the copy fills (``status.copy``)
and the source's Node."""

from __future__ import annotations

from topolvm.constants import Names
from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import (
    BOTH,
    Obj,
    Snapshot,
    annotations_of,
    name_of,
    ns_of,
    uid_of,
)
from topolvm.placement import PlacementValueError, prefers_source
from topolvm.units import human

ID = "copy-progress"


def _filling(snap: Snapshot, pvc: Obj) -> tuple[Obj, Names] | None:
    """The LogicalVolume a copy fills for ``pvc``: the claim's annotation on it, or the name
    csi-provisioner gives the volume (``pvc-<claim uid>``)."""
    claim = f"{ns_of(pvc)}/{name_of(pvc)}"
    for kind, names in zip(("logicalvolumes", "legacy-logicalvolumes"), BOTH, strict=True):
        for lv in snap[kind]:
            if annotations_of(lv).get(names.claim_annotation) == claim or (
                uid_of(pvc) and name_of(lv) == f"pvc-{uid_of(pvc)}"
            ):
                copy = (lv.get("status") or {}).get("copy")
                copying = ((lv.get("spec") or {}).get("copy") or {}).get("source")
                if (copy or copying) and (copy or {}).get("phase") != "Done":
                    return lv, names
    return None


def _progress(copy: Obj) -> str:
    done, total = int(copy.get("doneBytes") or 0), int(copy.get("totalBytes") or 0)
    if not total:
        return "not started"
    rate = int(copy.get("bytesPerSecond") or 0)
    speed = f", {human(rate)}/s" if rate else ""
    return f"{done * 100 // total}% ({human(done)} of {human(total)}{speed})"


def run(snap: Snapshot) -> list[Finding]:
    findings = []
    for pvc in snap["pvcs"]:
        if (pvc.get("status") or {}).get("phase") != "Pending":
            continue
        found = _filling(snap, pvc)
        if found is None:
            continue
        lv, names = found
        spec, status = lv.get("spec") or {}, lv.get("status") or {}
        copy = status.get("copy") or {}
        source = str((spec.get("copy") or {}).get("source") or spec.get("source") or "")
        source_lv = snap.get("logicalvolumes", source) or snap.get("legacy-logicalvolumes", source)
        source_node = str(copy.get("sourceNode") or ((source_lv or {}).get("spec") or {}).get(
            "nodeName") or "")  # fmt: skip
        target_node = str(spec.get("nodeName") or "")
        claim = f"PVC {ns_of(pvc)}/{name_of(pvc)}"
        subject = (Ref("PersistentVolumeClaim", name_of(pvc), ns_of(pvc)),)
        context = (Ref("LogicalVolume", name_of(lv)),) + (
            (Ref("Node", source_node),) if source_node else ()
        )
        message = str(copy.get("message") or "")
        evidence = (
            f"LogicalVolume {name_of(lv)} on node {target_node}: status.copy.phase="
            f"{copy.get('phase', 'Pending')}, {_progress(copy)}, "
            f"attempts={copy.get('attempts', 0)}",
            f"status.copy.message: {message or '(none)'}",
            f"source: LogicalVolume {source} on node {source_node or '?'}",
        )
        show = f"kubectl get logicalvolumes.{names.group} {name_of(lv)} -o yaml"
        if copy.get("phase") == "Failed" or status.get("code"):
            findings.append(Finding(
                ID, Severity.ERROR, f"{claim} Pending: its copy failed",
                "the copy that fills its volume failed for good; csi-provisioner starts over "
                "with a new one", evidence,
                (Fix("Read the message: a source that is gone cannot be copied (restore from "
                     "another snapshot); data that did not verify points at a disk or memory "
                     "fault on one of the two nodes.", (show,)),),
                subject, context,
            ))  # fmt: skip
            continue
        node_gone = bool(source_node) and snap.get("nodes", source_node) is None
        if node_gone or message.startswith("waiting:"):
            why = (f"the source node {source_node} is gone (no Node object)" if node_gone
                   else f"the copy cannot go on from node {source_node}: {message}")  # fmt: skip
            findings.append(Finding(
                ID, Severity.ERROR if node_gone else Severity.WARNING,
                f"{claim} Pending: its copy waits for node {source_node}",
                why, evidence,
                (Fix(f"Bring node {source_node} (its topolvm-node and transfer port) back: the "
                     "copy goes on from its last checkpoint. If the node is gone for good, "
                     "delete the claim and restore from a snapshot kept on another node "
                     f"({names.snapshot_node_selector_param} in the VolumeSnapshotClass).",
                     (snap.logs_command("topolvm-node", source_node), show)),),
                subject, context,
            ))  # fmt: skip
            continue
        fixes = [Fix("Nothing to fix: wait for it (the claim's Events show its progress).",
                     (show,))]  # fmt: skip
        if (
            source_node
            and _restored(pvc)
            and _no_pod_hook(snap, names)
            and _may_prefer(snap, pvc, names)
        ):
            fixes.append(Fix(
                f"Next time: this restore or clone is copied because its pod went to node "
                f"{target_node}, not to its source's node {source_node}. With the pod webhook "
                "on (the chart's webhook.podMutatingWebhook.enabled=true) a pod whose claim is "
                "restored or cloned prefers the source's node when it may run there, and the "
                "volume is then a local snapshot or clone, ready at once (docs/mobility.md, "
                '"A restore stays local when it can").',
            ))  # fmt: skip
        findings.append(Finding(
            ID, Severity.WARNING, f"{claim} Pending: a copy from node {source_node} fills its "
            f"volume, {_progress(copy)}",
            f"the claim binds once the copy onto node {target_node} is complete and verified",
            evidence, tuple(fixes), subject, context,
        ))  # fmt: skip
    return findings


def _restored(pvc: Obj) -> bool:
    """A restore or a clone (not a move's claim: a move's copy fills a volume of its own)."""
    spec = pvc.get("spec") or {}
    return bool(spec.get("dataSource") or spec.get("dataSourceRef"))


def _no_pod_hook(snap: Snapshot, names: Names) -> bool:
    """Read, and none of ``names``' plugin: the restore got no preference for its source. (Not
    a kind the check needs: without the webhooks the rest of the check still runs.)"""
    if "webhooks" in snap.unreadable or "webhooks" not in snap.objects:
        return False
    return all(hooked.plugin != names.plugin for _, _, hooked in snap.pod_webhooks())


def _may_prefer(snap: Snapshot, pvc: Obj, names: Names) -> bool:
    """The claim's StorageClass does not turn the preference off (``anywhere``). A snapshot
    class that does is not read here: the hint then says what the class's owner chose."""
    sc = snap.storage_class_of(pvc) or {}
    try:
        return prefers_source(sc.get("parameters"), names)
    except PlacementValueError:  # the StorageClass check says what is wrong with it
        return False


CHECK = Check(
    ID, 7, ("pvcs", "logicalvolumes", "legacy-logicalvolumes", "nodes", "pods"), run,
    "Pending PVCs that wait on a copy from another node: progress, or why it waits or failed",
)  # fmt: skip

"""Pending PVCs of TopoLVM StorageClasses whose provisioning failed: no room
(RESOURCE_EXHAUSTED), a device class the node's lvmd does not have, or another CreateVolume
error, with the node kube-scheduler selected and the free bytes that node reports."""

from __future__ import annotations

import re

from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import (
    Obj,
    Snapshot,
    annotations_of,
    event_line,
    name_of,
    ns_of,
    quantity_bytes,
    uid_of,
)
from topolvm.units import apart, human

ID = "pvc-provisioning"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
NODE_IN_MESSAGE = re.compile(r"\bnode (\S+) has\b")
NOT_FOUND = re.compile(r"device.class not found|device class .* not found", re.IGNORECASE)


def run(snap: Snapshot) -> list[Finding]:
    findings = []
    for pvc in snap["pvcs"]:
        if (pvc.get("status") or {}).get("phase") != "Pending":
            continue
        found = snap.topolvm_class_of(pvc)
        if found is None:
            continue
        sc, names = found
        failed = snap.events(
            "PersistentVolumeClaim", ns_of(pvc), name_of(pvc), "ProvisioningFailed", uid_of(pvc)
        )
        if not failed:
            continue
        last = failed[-1]
        message = str(last.get("message", ""))
        in_message = NODE_IN_MESSAGE.search(message)
        node = annotations_of(pvc).get(SELECTED_NODE) or (in_message and in_message[1]) or ""
        dc = str((sc.get("parameters") or {}).get(names.device_class_param, ""))
        requests = ((pvc.get("spec") or {}).get("resources") or {}).get("requests") or {}
        want = quantity_bytes(requests.get("storage", "0"))
        evidence = [f"PVC {ns_of(pvc)}/{name_of(pvc)}: {event_line(last)}"]
        node_obj = snap.get("nodes", node) if node else None
        if node_obj is not None:
            free = snap.node_free(node_obj, names, dc)
            has, needs = apart(free, want or 0) if free is not None else ("no", human(want or 0))
            evidence.append(
                f"selected node {node}: {has} free in device class {dc or '(default)'}; the PVC "
                f"requests {needs}"
            )
        subject = (Ref("PersistentVolumeClaim", name_of(pvc), ns_of(pvc)),)
        if "ResourceExhausted" in message:
            title, cause, fix = (
                "no room for the volume",
                f"the node{' ' + node if node else ''} has less free space in device class "
                f"{dc or '(default)'} than the PVC requests",
                Fix("Free space on the node (delete unused PVCs), add a disk to the volume "
                    "group, or request less. If kube-scheduler keeps choosing full nodes, check "
                    "Storage Capacity Tracking (the csidriver and capacity-objects checks)."),
            )  # fmt: skip
        elif NOT_FOUND.search(message):
            title, cause, fix = (
                f"device class {dc or '(default)'} not found on the node",
                f"lvmd on {node or 'the node'} has no device class {dc or '(default)'}",
                Fix(f"Fix StorageClass {name_of(sc)}'s {names.device_class_param}, or add the "
                    "class to lvmd's device-classes (Helm: lvmd.deviceClasses)."),
            )  # fmt: skip
        else:
            title, cause, fix = (
                "provisioning failed",
                "CreateVolume returned an error (the event's message names it)",
                Fix("Read topolvm-controller's and topolvm-node's logs for the volume.",
                    (snap.logs_command("topolvm-controller"),)),
            )  # fmt: skip
        findings.append(
            Finding(
                ID,
                Severity.ERROR,
                f"PVC {ns_of(pvc)}/{name_of(pvc)} Pending: {title}",
                cause,
                tuple(evidence),
                (fix,),
                subject,
                context=_node_ref(node_obj),
            )
        )
    return findings


def _node_ref(node: Obj | None) -> tuple[Ref, ...]:
    return () if node is None else (Ref("Node", name_of(node)),)


CHECK = Check(
    ID, 6, ("pvcs", "storageclasses", "events", "nodes"), run,
    "Pending PVCs whose provisioning failed (no room, unknown device class, other errors)",
)  # fmt: skip

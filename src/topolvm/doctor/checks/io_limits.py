"""IO limits (docs/qos.md) that are not in force: a claim whose VolumeAttributesClass could
not be applied (csi-resizer's ControllerModifyVolume refused it: ``Infeasible``, or the class
does not exist: ``Pending``), and a volume whose node said it could not put the limits in
force for its pods (cgroup v1, no io controller, no block throttling, limits turned off)."""

from __future__ import annotations

from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import Snapshot, event_line, name_of, ns_of, uid_of
from topolvm.iolimits import EVENT_NAMESPACE, NODE_CONDITION, NOT_IN_FORCE_REASON

ID = "io-limits"
MODIFY_FAILED = "VolumeModifyFailed"  # csi-resizer's reason


def run(snap: Snapshot) -> list[Finding]:
    return [*_modify_failed(snap), *_not_in_force(snap)]


def _modify_failed(snap: Snapshot) -> list[Finding]:
    findings = []
    for pvc in snap["pvcs"]:
        if snap.topolvm_class_of(pvc) is None:
            continue
        status = (pvc.get("status") or {}).get("modifyVolumeStatus") or {}
        state = status.get("status")
        if state not in ("Infeasible", "Pending"):
            continue
        target = str(status.get("targetVolumeAttributesClassName", ""))
        current = (pvc.get("status") or {}).get("currentVolumeAttributesClassName") or "(none)"
        ref = f"{ns_of(pvc)}/{name_of(pvc)}"
        evidence = [f"PVC {ref}: modifyVolumeStatus {state} for class {target}; the limits in "
                    f"force are still those of class {current}"]  # fmt: skip
        failed = snap.events("PersistentVolumeClaim", ns_of(pvc), name_of(pvc), MODIFY_FAILED,
                             uid_of(pvc))  # fmt: skip
        if failed:
            evidence.append(f"PVC {ref}: {event_line(failed[-1])}")
        if state == "Infeasible":
            cause = (f"topolvm-controller refused VolumeAttributesClass {target}'s parameters "
                     "(INVALID_ARGUMENT: the event names the key); csi-resizer will not retry "
                     "it")  # fmt: skip
            fix = Fix("Name a valid class in the claim's spec.volumeAttributesClassName (or the "
                      "one in force again); the keys and values are in docs/qos.md.",
                      (f"kubectl get volumeattributesclass {target} -o yaml",))  # fmt: skip
        else:
            cause = (f"VolumeAttributesClass {target} is not there yet, or is of another driver: "
                     "the change waits for it")  # fmt: skip
            fix = Fix("Create the class (driverName topolvm.io), or name an existing one.",
                      ("kubectl get volumeattributesclass",))  # fmt: skip
        findings.append(Finding(
            ID, Severity.ERROR if state == "Infeasible" else Severity.WARNING,
            f"PVC {ref}: VolumeAttributesClass {target} not applied ({state})", cause,
            tuple(evidence), (fix,), (Ref("PersistentVolumeClaim", name_of(pvc), ns_of(pvc)),),
        ))  # fmt: skip
    return findings


def _unable_nodes(snap: Snapshot) -> dict[str, str]:
    """Nodes whose condition says they cannot put limits in force: what it says."""
    out = {}
    for node in snap["nodes"]:
        for c in (node.get("status") or {}).get("conditions") or []:
            if c.get("type") == NODE_CONDITION and c.get("status") == "True":
                out[name_of(node)] = (f"condition {NODE_CONDITION} True ({c.get('reason', '')}): "
                                      f"{c.get('message', '')}")  # fmt: skip
    return out


def _not_in_force(snap: Snapshot) -> list[Finding]:
    findings = []
    unable = _unable_nodes(snap)
    for kind in ("logicalvolumes", "legacy-logicalvolumes"):
        for lv in snap[kind]:
            spec = lv.get("spec") or {}
            if not spec.get("ioLimits"):
                continue
            said = snap.events("LogicalVolume", EVENT_NAMESPACE, name_of(lv), NOT_IN_FORCE_REASON)
            node = str(spec.get("nodeName", ""))
            if not said and node not in unable:
                continue
            limits = ", ".join(f"{k}={v}" for k, v in sorted(spec["ioLimits"].items()))
            evidence = [f"spec.ioLimits: {limits}"]
            evidence += [f"node {node}: {event_line(said[-1])}"] if said else []
            evidence += [f"Node {node}: {unable[node]}"] if node in unable else []
            findings.append(Finding(
                ID, Severity.WARNING,
                f"LogicalVolume {name_of(lv)}: IO limits not in force on node {node}",
                "the node cannot write io.max for the pods that mount the volume; they run "
                "without limits",
                tuple(evidence),
                (Fix("Run the node on cgroup v2 with the io controller and a kernel with "
                     "CONFIG_BLK_DEV_THROTTLING, and topolvm-node with the host's cgroups "
                     "mounted (chart: node.ioLimits.enabled true); then restart the pod.",
                     (snap.logs_command("topolvm-node"),)),),
                (Ref("LogicalVolume", name_of(lv)),), context=(Ref("Node", node),),
            ))  # fmt: skip
    return findings


CHECK = Check(
    ID, 14, ("pvcs", "storageclasses", "events", "logicalvolumes", "nodes"), run,
    "Claims whose VolumeAttributesClass was refused, volumes whose IO limits are not in force",
)  # fmt: skip

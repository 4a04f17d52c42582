"""The CSIDriver object of a TopoLVM provisioner that StorageClasses use: missing, needing an
attacher TopoLVM does not run, or with ``storageCapacity`` off while nothing else makes
kube-scheduler look at free space (no extender is evident from the API)."""

from __future__ import annotations

import json

from topolvm.doctor.checks.storageclass import recreate
from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import Snapshot, event_line, name_of, ns_of

ID = "csidriver"
PATCH = 'kubectl patch csidriver {d} --type=merge -p \'{{"spec":{{"{f}":{v}}}}}\''


def exhausted_events(snap: Snapshot, driver: str) -> list[str]:
    out = []
    for e in snap["events"]:
        msg = str(e.get("message", ""))
        if e.get("reason") == "ProvisioningFailed" and "ResourceExhausted" in msg and driver in msg:
            inv = e.get("involvedObject") or {}
            out.append(f"PVC {ns_of(e)}/{inv.get('name')}: {event_line(e)}")
    return out[-3:]


def run(snap: Snapshot) -> list[Finding]:
    findings = []
    drivers = sorted({n.plugin for _, n in snap.topolvm_classes()})
    marker_mode = {n.plugin for _, _, n in snap.pod_webhooks()}
    for d in drivers:
        obj = snap.get("csidrivers", d)
        subject = (Ref("CSIDriver", d),)
        users = [name_of(sc) for sc, n in snap.topolvm_classes() if n.plugin == d]
        if obj is None:
            findings.append(Finding(
                ID, Severity.ERROR, f"CSIDriver {d} does not exist",
                f"without it kubelet waits for a VolumeAttachment that no attacher creates and "
                f"kube-scheduler ignores free space, so pods using {', '.join(users)} get stuck",
                (f"StorageClass(es) {', '.join(users)} use provisioner {d}",),
                (Fix("Install the chart's CSIDriver (Helm renders it), or apply it by hand "
                     "with attachRequired: false and storageCapacity: true.",),),
                subject, cluster_wide=True,
            ))  # fmt: skip
            continue
        spec = obj.get("spec") or {}
        if spec.get("attachRequired", True):
            findings.append(Finding(
                ID, Severity.ERROR, f"CSIDriver {d} has attachRequired: true",
                "TopoLVM runs no external-attacher, so every pod waits for an attach that never "
                "happens",
                (f"CSIDriver {d}: spec.attachRequired is "
                 f"{json.dumps(spec.get('attachRequired', True))}",),
                (Fix("The field is immutable: re-create the CSIDriver with attachRequired: "
                     "false (running pods keep their mounts; the chart renders it so).",
                     recreate("csidriver", d, "spec.attachRequired: false")),),
                subject, cluster_wide=True,
            ))  # fmt: skip
        if not spec.get("storageCapacity") and d not in marker_mode:
            findings.append(Finding(
                ID, Severity.WARNING, f"CSIDriver {d} has storageCapacity off",
                "kube-scheduler does not consider free space unless it calls topolvm-scheduler, "
                "so pods can land on nodes without room and CreateVolume fails",
                (f"CSIDriver {d}: spec.storageCapacity is "
                 f"{json.dumps(spec.get('storageCapacity', False))}",
                 f"no TopoLVM pod webhook for {d} (the extender's marker mode is not in use)",
                 *exhausted_events(snap, d)),
                (Fix("Turn Storage Capacity Tracking on (Helm: "
                     "controller.storageCapacityTracking.enabled=true; csi-provisioner needs "
                     "--enable-capacity), unless kube-scheduler is wired to topolvm-scheduler.",
                     (PATCH.format(d=d, f="storageCapacity", v="true"),)),),
                subject, cluster_wide=True,
            ))  # fmt: skip
    return findings


CHECK = Check(
    ID, 3, ("storageclasses", "csidrivers", "webhooks", "events"), run,
    "CSIDriver missing, attachRequired on, or storageCapacity off without an extender",
)  # fmt: skip

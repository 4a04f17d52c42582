"""Pods created with ``spec.nodeName`` that use a WaitForFirstConsumer TopoLVM PVC (upstream
FAQ): kube-scheduler never sees the pod, so nobody selects a node for the PVC; it stays Pending
and so does the pod."""

from __future__ import annotations

from topolvm.doctor.checks.pvc_provisioning import SELECTED_NODE
from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import Snapshot, annotations_of, claims_of, name_of, ns_of, pod_label

ID = "pod-nodename"


def run(snap: Snapshot) -> list[Finding]:
    findings = []
    for pod in snap["pods"]:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase", "Pending") != "Pending":
            continue
        ns = ns_of(pod)
        stuck = []
        for claim in claims_of(pod):
            pvc = snap.get("pvcs", claim, ns)
            found = snap.topolvm_class_of(pvc) if pvc else None
            if (
                pvc is not None and found is not None
                and (pvc.get("status") or {}).get("phase") == "Pending"
                and found[0].get("volumeBindingMode") == "WaitForFirstConsumer"
                and SELECTED_NODE not in annotations_of(pvc)
            ):  # fmt: skip
                stuck.append(claim)
        if not stuck:
            continue
        findings.append(Finding(
            ID, Severity.ERROR,
            f"{pod_label(pod)}: set spec.nodeName, its PVC(s) {', '.join(stuck)} never bind",
            "a pod with spec.nodeName bypasses kube-scheduler, and a WaitForFirstConsumer PVC "
            "is provisioned only after kube-scheduler selects a node",
            (f"{pod_label(pod)}: spec.nodeName={node}, phase Pending",
             *(f"PVC {ns}/{c}: Pending, no {SELECTED_NODE} annotation" for c in stuck)),
            (Fix("Re-create the pod without spec.nodeName, selecting the node with "
                 f"nodeSelector kubernetes.io/hostname: {node} instead.",
                 (f"kubectl get pod -n {ns} {name_of(pod)} -o yaml > pod.yaml",
                  f"kubectl delete pod -n {ns} {name_of(pod)}")),),
            (Ref("Pod", name_of(pod), ns),
             *(Ref("PersistentVolumeClaim", c, ns) for c in stuck)),
        ))  # fmt: skip
    return findings


CHECK = Check(
    ID, 10, ("pods", "pvcs", "storageclasses"), run,
    "pods with spec.nodeName and a WaitForFirstConsumer PVC (upstream FAQ)",
)  # fmt: skip

"""Pods that still request the marker resource ``<plugin>/capacity`` after the scheduling mode
was switched: no TopoLVM pod webhook exists any more, no Node has the resource, and the pods
were mutated before the switch. Only deleting them (their controller recreates them) helps."""

from __future__ import annotations

from topolvm.doctor.checks.marker_without_extender import (
    delete_pods_command,
    recreate_note,
    stranded,
)
from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import Snapshot, marker_of, name_of, ns_of, pod_label, unscheduled

ID = "marker-left-on-pods"


def run(snap: Snapshot) -> list[Finding]:
    if snap.pod_webhooks():
        return []  # marker-without-extender covers a webhook that still marks pods
    pods, evidence = [], []
    for pod in snap["pods"]:
        marker = marker_of(pod)
        if marker is None or not unscheduled(pod):
            continue
        advertised = any(
            marker in ((n.get("status") or {}).get("allocatable") or {}) for n in snap["nodes"]
        )
        lines = stranded(snap, pod, marker)
        if lines or not advertised:
            pods.append(pod)
            evidence += lines or [f"{pod_label(pod)}: Pending, requests {marker}: 1"]
    if not pods:
        return []
    marker = marker_of(pods[0]) or ""
    evidence.append("no MutatingWebhookConfiguration of TopoLVM mutates pods any more")
    return [
        Finding(
            check=ID,
            severity=Severity.ERROR,
            title=f"{len(pods)} Pending pod(s) still request {marker} from an earlier mode",
            cause=(
                f"the pods were mutated while the pod webhook added {marker}; the webhook is "
                "gone but the pods keep the request, which no node satisfies"
            ),
            evidence=tuple(evidence),
            fixes=(
                Fix(
                    "Delete the pods; " + recreate_note(pods) + ".",
                    delete_pods_command(pods),
                ),
            ),
            subjects=tuple(Ref("Pod", name_of(p), ns_of(p)) for p in pods),
        )
    ]


CHECK = Check(
    ID, 1, ("pods", "events", "webhooks", "nodes"), run,
    "Pending pods that still carry the marker resource after the mode was switched",
)  # fmt: skip

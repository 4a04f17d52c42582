"""Pods that still request the marker resource ``<plugin>/capacity`` after the scheduling mode
was switched: no TopoLVM pod webhook exists any more, no Node has the resource, and the pods
were mutated before the switch. Only deleting them (their controller recreates them) helps."""

from __future__ import annotations

from topolvm.doctor.checks.marker_without_extender import (
    by_namespace,
    delete_pods_command,
    recreate_note,
    stranded,
)
from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import (
    BOTH,
    Obj,
    Snapshot,
    marker_of,
    name_of,
    ns_of,
    pod_label,
    unscheduled,
)

ID = "marker-left-on-pods"


def run(snap: Snapshot) -> list[Finding]:
    if snap.pod_webhooks():
        return []  # marker-without-extender covers a webhook that still marks pods
    advertised = {n.capacity_resource: bool(snap.advertising(n.capacity_resource)) for n in BOTH}
    stuck = [
        p for p in snap["pods"]
        if (m := marker_of(p)) and unscheduled(p)
        and (stranded(snap, p, m) or not advertised[m])
    ]  # fmt: skip
    return [_finding(snap, pods) for pods in by_namespace(stuck)]


def _finding(snap: Snapshot, pods: list[Obj]) -> Finding:
    marker = marker_of(pods[0]) or ""
    evidence = [
        line
        for p in pods
        for line in stranded(snap, p, marker) or [f"{pod_label(p)}: Pending, requests {marker}"]
    ]
    evidence.append("no MutatingWebhookConfiguration of TopoLVM mutates pods any more")
    return Finding(
        check=ID,
        severity=Severity.ERROR,
        title=f"{len(pods)} Pending pod(s) in {ns_of(pods[0])} still request {marker} from an "
        "earlier mode",
        cause=(
            f"the pods were mutated while the pod webhook added {marker}; the webhook is "
            "gone but the pods keep the request, which no node satisfies"
        ),
        evidence=tuple(evidence),
        fixes=(Fix("Delete the pods; " + recreate_note(pods) + ".", delete_pods_command(pods)),),
        subjects=tuple(Ref("Pod", name_of(p), ns_of(p)) for p in pods),
    )


CHECK = Check(
    ID, 1, ("pods", "events", "webhooks", "nodes"), run,
    "Pending pods that still carry the marker resource after the mode was switched",
)  # fmt: skip

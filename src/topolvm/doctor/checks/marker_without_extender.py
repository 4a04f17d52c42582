"""The founding outage: a TopoLVM pod webhook puts the marker resource ``topolvm.io/capacity``
on pods, no Node has that resource, and kube-scheduler has no extender that manages it, so it
rejects every node with ``Insufficient topolvm.io/capacity`` while the disks have room."""

from __future__ import annotations

from topolvm.constants import Names
from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import (
    Obj,
    Snapshot,
    event_line,
    marker_of,
    name_of,
    names_for,
    ns_of,
    owner,
    pod_label,
    scheduling_message,
    uid_of,
    unscheduled,
)
from topolvm.units import human

ID = "marker-without-extender"


def stranded(snap: Snapshot, pod: Obj, marker: str) -> list[str]:
    """Evidence that kube-scheduler rejected the pod for the marker (empty if it did not)."""
    insufficient = f"Insufficient {marker}"
    out = [
        f"{pod_label(pod)}: {event_line(e)}"
        for e in snap.events("Pod", ns_of(pod), name_of(pod), "FailedScheduling", uid_of(pod))
        if insufficient in str(e.get("message", ""))
    ][-1:]
    if not out and insufficient in scheduling_message(pod):
        out.append(f"{pod_label(pod)}: PodScheduled=False: {scheduling_message(pod)}")
    return out


def by_namespace(pods: list[Obj]) -> list[list[Obj]]:
    """The pods grouped by namespace: one finding each, so a scope shows only its own."""
    groups: dict[str, list[Obj]] = {}
    for p in pods:
        groups.setdefault(ns_of(p), []).append(p)
    return [groups[ns] for ns in sorted(groups)]


def delete_pods_command(pods: list[Obj]) -> tuple[str, ...]:
    """``kubectl delete pod`` for the pods a controller recreates; never for bare pods, which
    deleting would lose (and whose stored spec carries the marker anyway)."""
    pods = [p for p in pods if owner(p) is not None]
    by_ns: dict[str, list[str]] = {}
    for p in pods:
        by_ns.setdefault(ns_of(p), []).append(name_of(p))
    return tuple(f"kubectl delete pod -n {ns} {' '.join(sorted(n))}" for ns, n in by_ns.items())


def recreate_note(pods: list[Obj]) -> str:
    bare = [pod_label(p) for p in pods if owner(p) is None]
    if not bare:
        return "their controllers recreate them without the marker"
    return (
        f"no controller owns {', '.join(bare)}: delete and re-create them from your own "
        "manifests (their stored spec carries the marker)"
    )


def capacity_evidence(snap: Snapshot, marker: str) -> list[str]:
    plugin = marker.split("/", maxsplit=1)[0]
    advertised = snap.advertising(marker)
    out = [
        f"no Node advertises {marker} in status.allocatable"
        if not advertised
        else f"only {len(advertised)} Node(s) advertise {marker}: {', '.join(advertised[:5])}"
    ]
    names = names_for(plugin)
    if names is None:
        return out
    for n in snap["nodes"][:200]:
        free = {dc: b for dc, b in snap.node_capacities(n, names).items() if b}
        if free:
            classes = ", ".join(f"{dc} {human(b)}" for dc, b in sorted(free.items()))
            out.append(f"node {name_of(n)} has free space: {classes}")
            if len(out) >= 4:
                break
    return out


def extender_evidence(snap: Snapshot) -> list[str]:
    """What the topolvm-scheduler pods say on /status (ours: whether kube-scheduler calls)."""
    entries = snap["scheduler-status"]
    if not entries:
        return ["no topolvm-scheduler pod runs in the cluster"]
    out = []
    for e in entries:
        where = f"topolvm-scheduler pod {ns_of(e)}/{name_of(e)}"
        doc = e.get("status")
        if isinstance(doc, dict) and "wired" in doc:
            out.append(f"{where}: /status mode {doc.get('mode')}, wired: {doc.get('wired')}")
        else:
            out.append(f"{where}: /status not readable ({e.get('error', 'no wiring report')})")
    return out


def run(snap: Snapshot) -> list[Finding]:
    hooks = snap.pod_webhooks()
    if not hooks:
        return []  # marker-left-on-pods covers pods marked by a webhook that is gone
    stuck = [
        p for p in snap["pods"]
        if (m := marker_of(p)) and unscheduled(p) and stranded(snap, p, m)
    ]  # fmt: skip
    return [_finding(snap, hooks, pods) for pods in by_namespace(stuck)]


def _finding(snap: Snapshot, hooks: list[tuple[Obj, Obj, Names]], pods: list[Obj]) -> Finding:
    marker = marker_of(pods[0]) or ""
    evidence = [line for p in pods for line in stranded(snap, p, marker)]
    confs = sorted({name_of(conf) for conf, _, _ in hooks})
    evidence += [
        f"MutatingWebhookConfiguration {name_of(conf)}: webhook {hook.get('name')} mutates pods"
        for conf, hook, _ in hooks
    ]
    evidence += capacity_evidence(snap, marker)
    evidence += extender_evidence(snap)
    driver = marker.split("/")[0]
    csidriver = snap.get("csidrivers", driver)
    sct = [f"kubectl delete mutatingwebhookconfiguration {' '.join(confs)}"]
    if csidriver is not None and not (csidriver.get("spec") or {}).get("storageCapacity"):
        sct.append(
            f"kubectl patch csidriver {driver} --type=merge "
            '-p \'{"spec":{"storageCapacity":true}}\''
        )
    sct += delete_pods_command(pods)
    fixes = (
        Fix(
            "Switch to Storage Capacity Tracking: remove the pod webhook (Helm: "
            "webhook.podMutatingWebhook.enabled=false) and delete the mutated pods; "
            + recreate_note(pods)
            + ". csi-provisioner must run with --enable-capacity.",
            tuple(sct),
        ),
        Fix(
            "Wire the extender: run topolvm-scheduler (Helm: scheduler.enabled=true) and add "
            "its stanza with managedResources to kube-scheduler's configuration; pods "
            "already Pending then schedule.",
            ("topolvm scheduler print-config --managed-resource",),
        ),
    )
    return Finding(
        check=ID,
        severity=Severity.ERROR,
        title=f"{len(pods)} pod(s) in {ns_of(pods[0])} Pending: kube-scheduler wants {marker}, "
        "which no node has",
        cause=f"pod webhook adds {marker} but kube-scheduler has no extender for it",
        evidence=tuple(evidence),
        fixes=fixes,
        subjects=tuple(Ref("Pod", name_of(p), ns_of(p)) for p in pods),
        context=tuple(Ref("MutatingWebhookConfiguration", c) for c in confs),
    )


CHECK = Check(
    ID, 0, ("pods", "events", "webhooks", "nodes"), run,
    "pods marked with <plugin>/capacity by the webhook while kube-scheduler has no extender",
)  # fmt: skip

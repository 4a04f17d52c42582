"""Nodes where TopoLVM's node plugin is registered (CSINode) but the ``capacity.<plugin>/...``
annotations are missing, or whose topolvm-node pod is not running, so the annotations are no
longer refreshed (topolvm-node or lvmd down): kube-scheduler and the controller then use
numbers that nothing updates."""

from __future__ import annotations

from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import BOTH, Obj, Snapshot, name_of, ns_of

ID = "node-capacity"


def _ready(pod: Obj) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def run(snap: Snapshot) -> list[Finding]:
    findings = []
    for names in BOTH:
        registered = snap.csi_nodes_with(names.plugin)
        for node in snap["nodes"]:
            node_name = name_of(node)
            has = bool(snap.node_capacities(node, names))
            pod = snap.topolvm_node_pod(node_name)
            subject = (Ref("Node", node_name),)
            logs = (
                f"kubectl logs -n {ns_of(pod)} {name_of(pod)} -c topolvm-node"
                if pod
                else "kubectl get pods -A -o wide --field-selector spec.nodeName=" + node_name
            )
            if node_name in registered and not has:
                findings.append(Finding(
                    ID, Severity.ERROR,
                    f"node {node_name}: no capacity.{names.plugin}/ annotations",
                    "topolvm-node is registered on the node (CSINode) but never published "
                    "its free space, so no TopoLVM volume is placed there",
                    (f"CSINode {node_name} lists driver {names.plugin}",
                     f"Node {node_name} has no annotation starting with {names.capacity_prefix}",
                     _pod_line(pod)),
                    (Fix("Check topolvm-node and lvmd on the node: the log names the error "
                         "(lvmd socket, volume group, RBAC to patch Nodes).", (logs,)),),
                    subject,
                ))  # fmt: skip
            elif has and pod is not None and not _ready(pod):
                findings.append(Finding(
                    ID, Severity.WARNING,
                    f"node {node_name}: capacity annotations are not refreshed",
                    "the topolvm-node pod on the node is not running, so the free space the "
                    "scheduler sees is frozen at its last value",
                    (_pod_line(pod),),
                    (Fix("Find why the pod does not run.",
                         (f"kubectl describe pod -n {ns_of(pod)} {name_of(pod)}", logs)),),
                    subject,
                ))  # fmt: skip
    return findings


def _pod_line(pod: Obj | None) -> str:
    if pod is None:
        return "no topolvm-node pod runs on the node (separate lvmd or not scheduled there)"
    status = pod.get("status") or {}
    waiting = [
        (c.get("state") or {}).get("waiting", {}).get("reason")
        for c in status.get("containerStatuses") or []
        if (c.get("state") or {}).get("waiting")
    ]
    extra = f", waiting: {', '.join(str(w) for w in waiting)}" if waiting else ""
    return f"pod {ns_of(pod)}/{name_of(pod)}: phase {status.get('phase', 'Pending')}{extra}"


CHECK = Check(
    ID, 8, ("nodes", "csinodes", "pods"), run,
    "nodes whose capacity annotations are missing or not refreshed",
)  # fmt: skip

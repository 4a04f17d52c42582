"""Claims being moved to another node (VolumeMove objects, topolvm.k8s.moveobject): which step
each move is at and how far it has come; a move that has not left its step for longer than
``--stuck-after``, with why (its message, the target LogicalVolume's copy, the claim's pod and
its scheduling gate, topolvm-node and topolvm-controller) and the way out; a move that
rolled back recently, so that a pod restart has its explanation; and a move that did not
verify, which keeps its old volume (:mod:`topolvm.doctor.moveverify`)."""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field

from topolvm.constants import Names
from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.moveverify import unverified, verify_line, waiting_node
from topolvm.doctor.snapshot import (
    BOTH,
    Obj,
    Snapshot,
    container_of,
    event_line,
    human_age,
    last_write,
    meta,
    scheduling_message,
    uid_of,
)
from topolvm.k8s.moveobject import MovePhase, MoveStatus, VolumeMoveObject
from topolvm.units import human

ID = "volume-move"
CONTROLLER_CONTAINER = "topolvm-controller"
KINDS = (("volumemoves", "logicalvolumes"), ("legacy-volumemoves", "legacy-logicalvolumes"))

STEPS = {
    MovePhase.PENDING: "about to start: the claim is checked and the target node chosen",
    MovePhase.PRE_COPY: "the data is copied to the target while the pod runs",
    MovePhase.STOPPING: "the pod is stopped; its re-created pod is held by a scheduling gate",
    MovePhase.FINAL_COPY: "what changed since the first copy is copied, the pod stopped",
    MovePhase.SWAPPING: "the claim is re-created bound to the new volume on the target",
    MovePhase.STARTING: "the pod is let go onto the target once its volume is cut for the "
    "verification",
    MovePhase.VERIFYING: "the pod runs on the target; both volumes' digests as of the swap are "
    "compared before the old volume goes",
    MovePhase.ROLLING_BACK: "the move is undone: the claim stays on its source node",
}
COPYING = frozenset({MovePhase.PRE_COPY, MovePhase.FINAL_COPY})
# the source node's word when the final cut waits for the source to close (node/transfer.py)
STILL_OPEN = re.compile(r"the volume (\S+) is still open on node (\S+) \((.*?)\): ")
# steps that hold the claim's re-created pod with the gate (Starting removes it)
GATED = frozenset({MovePhase.STOPPING, MovePhase.FINAL_COPY, MovePhase.SWAPPING})


def gate_of(names: Names) -> str:
    """The scheduling gate that holds a moved claim's pod during the downtime."""
    return f"{names.plugin}/move"


@dataclass
class Why:
    """What the evidence says keeps a move at its step: reasons, fixes (first is likeliest)."""

    reasons: list[str] = field(default_factory=list)
    fixes: list[Fix] = field(default_factory=list)

    def add(self, reason: str, fix: Fix) -> None:
        self.reasons.append(reason)
        if fix not in self.fixes:
            self.fixes.append(fix)


def _since(move: VolumeMoveObject, obj: Obj) -> str:
    """When the move entered its step, as far as its status tells (else its last write)."""
    st = move.status
    by_phase = {
        MovePhase.PENDING: move.created,
        MovePhase.PRE_COPY: st.start_time,
        MovePhase.STOPPING: st.stop_time,
        MovePhase.FINAL_COPY: st.stop_time,
        MovePhase.SWAPPING: st.stop_time,
        MovePhase.STARTING: st.swap_time or st.stop_time,
    }
    return by_phase.get(st.phase) or last_write(obj)


def _percent(done: int, total: int) -> str:
    if not total:
        return ""
    return f"{done * 100 // total}% ({human(done)} of {human(total)})"


def _progress(snap: Snapshot, st: MoveStatus, copy: Obj) -> str:
    if st.phase in COPYING:
        done = st.done_bytes or int(copy.get("doneBytes") or 0)
        total = st.total_bytes or int(copy.get("totalBytes") or 0)
        rate = int(copy.get("bytesPerSecond") or 0)
        text = _percent(done, total) or "not started"
        return text + (f", {human(rate)}/s" if rate else "")
    if st.phase in MovePhase.DOWN:
        down = snap.age(st.stop_time)
        return f"the pod down for {human_age(down)}" if down is not None else "the pod down"
    return ""


def _gated(pod: Obj, gate: str) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == gate for g in gates)


def _controller(snap: Snapshot) -> tuple[bool | None, str]:
    """Whether a topolvm-controller pod runs (None: none visible), and the evidence."""
    pods = [p for p in snap["pods"] if container_of(p, CONTROLLER_CONTAINER) is not None]
    if not pods:
        return None, "topolvm-controller: no pod visible (it may run outside the cluster)"
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    phases = ", ".join(
        f"{meta(p).get('namespace')}/{meta(p).get('name')} "
        f"{(p.get('status') or {}).get('phase', 'Pending')}"
        for p in pods
    )
    return bool(running), f"topolvm-controller pods: {phases}"


def _node_runs(snap: Snapshot, node: str) -> bool | None:
    """Whether topolvm-node runs on ``node`` (None: no topolvm-node pod visible at all)."""
    if not node or not snap.topolvm_node_pods():
        return None
    pod = snap.topolvm_node_pod(node)
    return pod is not None and (pod.get("status") or {}).get("phase") == "Running"


def _explain_verify(
    snap: Snapshot, move: VolumeMoveObject, lv_kind: str, why: Why, evidence: list[str]
) -> None:
    """Starting and Verifying: the node whose cut or digest the move waits for (Verifying,
    the pod running: only when that node does not run, or its verification waits)."""
    st = move.status
    lines = [verify_line(snap, lv_kind, "target", st.target_volume, move.uid)]
    if st.phase == MovePhase.VERIFYING:
        lines.append(verify_line(snap, lv_kind, "source", st.source_volume, move.uid))
    evidence += lines
    node = waiting_node(snap, lv_kind, move)
    if not node:
        return
    what = "cut the target volume" if st.phase == MovePhase.STARTING else "digest its volume"
    runs = _node_runs(snap, node)
    if (
        st.phase == MovePhase.VERIFYING
        and runs is not False
        and not any("message=waiting" in line for line in lines)
    ):
        return  # a large volume takes a while to read
    why.add(
        f"the move waits for node {node} to {what} for the verification"
        + (" and topolvm-node does not run there" if runs is False else ""),
        Fix(f"topolvm-node on node {node} makes the verification (its log says how far); the "
            "move goes on once it reports. The old volume stays meanwhile.",
            (snap.logs_command("topolvm-node", node),)),
    )  # fmt: skip


def _explain(
    snap: Snapshot, move: VolumeMoveObject, names: Names, copy: Obj, lv: Obj | None,
    pod: Obj | None, evidence: list[str], lv_kind: str = "logicalvolumes",
) -> Why:  # fmt: skip
    """Why the move does not leave its step, from the evidence (also appended to it)."""
    st, why = move.status, Why()
    if st.phase in (MovePhase.STARTING, MovePhase.VERIFYING):
        _explain_verify(snap, move, lv_kind, why, evidence)
    source, target = st.source_node or "?", st.target_node or move.target_node or "?"
    node_logs = snap.logs_command("topolvm-node", target if target != "?" else "")
    copy_phase, copy_msg = str(copy.get("phase") or ""), str(copy.get("message") or "")
    if copy_phase == "Failed":
        why.add(
            f"the copy onto node {target} failed: {copy_msg or '(no message)'}",
            Fix("The move rolls back by itself (topolvm-controller): the claim stays on node "
                f"{source} with its data. Delete the VolumeMove only after it rolled back, then "
                "fix the cause in the message and move again.", (node_logs,)),
        )  # fmt: skip
    elif (held := STILL_OPEN.search(copy_msg)) is not None:
        volume, node, what = held.groups()
        why.add(
            f"the volume is still open on node {node}: {volume} ({what}); the final copy waits "
            "until nothing uses it",
            Fix(f"A pod whose object was deleted may still run on node {node} (force-deleted "
                "while its node was cut off, or its kubelet stopped): the move goes on once it "
                f"stops and the volume is unmounted. Start node {node}'s kubelet again (it stops "
                "the orphaned container and unmounts the volume), or stop that container on the "
                "node; never remove the mount by hand while it writes.",
                (f"kubectl get node {node}", snap.logs_command("topolvm-node", node))),
        )  # fmt: skip
    elif copy_msg.startswith("waiting"):
        waited = str(copy.get("sourceNode") or source)
        why.add(
            f"the copy onto node {target} waits for node {waited}: {copy_msg}",
            Fix(f"The move resumes when topolvm-node on {waited} (its transfer port) runs "
                "again; the copy goes on from its last checkpoint.",
                (snap.logs_command("topolvm-node", waited),)),
        )  # fmt: skip
    elif copy_msg.startswith("queued"):
        why.add(
            f"the copy is queued on node {target}: {copy_msg}",
            Fix(f"The copy starts when one of node {target}'s running copies ends; nothing "
                "to fix unless those are stuck too.", (node_logs,)),
        )  # fmt: skip
    needs_node = st.phase in (*COPYING, MovePhase.SWAPPING, MovePhase.STARTING)
    for node in (target, source) if st.phase in COPYING else (target,):
        if needs_node and _node_runs(snap, node) is False:
            why.add(
                f"topolvm-node does not run on node {node}",
                Fix(f"The move resumes when topolvm-node on {node} runs again.",
                    (snap.logs_command("topolvm-node", node),)),
            )  # fmt: skip
            evidence.append(f"topolvm-node pod on {node}: not running")
    if st.phase in COPYING and lv is None and st.target_volume:
        evidence.append(f"LogicalVolume {st.target_volume}: not found")
    _explain_pod(snap, move, names, pod, why, evidence)
    return why


def _explain_pod(
    snap: Snapshot, move: VolumeMoveObject, names: Names, pod: Obj | None, why: Why,
    evidence: list[str],
) -> None:  # fmt: skip
    st, gate = move.status, gate_of(names)
    label = f"pod {move.namespace}/{st.pod}"
    if st.phase not in MovePhase.DOWN or not st.pod:
        return
    if pod is None:
        evidence.append(f"{label}: not found (its owner {st.owner or '?'} re-creates it)")
        return
    status = pod.get("status") or {}
    phase, node = status.get("phase", "Pending"), (pod.get("spec") or {}).get("nodeName")
    gated = _gated(pod, gate)
    evidence.append(
        f"{label}: {phase}" + (f" on node {node}" if node else "")
        + (f", held by the scheduling gate {gate}" if gated else "")
    )  # fmt: skip
    describe = f"kubectl describe pod -n {move.namespace} {st.pod}"
    if st.phase == MovePhase.STOPPING and phase == "Running" and not gated:
        why.add(
            f"{label} has not stopped yet (still Running on node {node})",
            Fix("The pod stops within its terminationGracePeriodSeconds unless a finalizer or "
                "a preStop hook holds it; see its events.", (describe,)),
        )  # fmt: skip
    elif st.phase == MovePhase.STARTING and phase == "Pending" and gated:
        why.add(
            f"{label} still carries the scheduling gate {gate}, which the Starting step removes",
            Fix("topolvm-controller removes the gate: its log says why it did not.",
                (snap.logs_command(CONTROLLER_CONTAINER),)),
        )  # fmt: skip
    elif st.phase == MovePhase.STARTING and phase == "Pending" and not node:
        sched = scheduling_message(pod)
        events = snap.events("Pod", move.namespace, st.pod, "FailedScheduling", uid_of(pod))
        evidence += [f"{label}: {event_line(e)}" for e in events[-1:]]
        detail = sched or (str(events[-1].get("message", "")) if events else "")
        why.add(
            f"{label} cannot be scheduled" + (f": {detail}" if detail else "")
            + f" (its gate is gone; its data is on node {st.target_node or '?'} now)",
            Fix(f"A scheduling problem: the pod must fit on node {st.target_node or '?'}, where "
                "its volume is now (CPU, memory, taints, affinity); see its events.",
                (describe,)),
        )  # fmt: skip


def _minutes(age: datetime.timedelta) -> str:
    return f"{max(int(age.total_seconds()) // 60, 0)} min"


def _one(snap: Snapshot, obj: Obj, names: Names, lv_kind: str) -> Finding | None:
    move = VolumeMoveObject.from_dict(obj)
    st = move.status
    claim = f"{move.namespace}/{move.claim}"
    subjects = (
        Ref("VolumeMove", move.name, move.namespace),
        Ref("PersistentVolumeClaim", move.claim, move.namespace),
    )
    source, target = st.source_node, st.target_node or move.target_node
    context = tuple(Ref("Node", n) for n in dict.fromkeys((source, target)) if n)
    show = f"kubectl get volumemoves.{names.group} -n {move.namespace} {move.name} -o yaml"
    where = (f"from node {source or '?'} to "
             + (f"node {target}" if target else "a node not chosen yet"))  # fmt: skip
    line = (f"VolumeMove {move.namespace}/{move.name}: phase={st.phase}"
            + (f", reason={st.reason}" if st.reason else "")
            + f", message: {st.message or '(none)'}")  # fmt: skip
    if st.phase == MovePhase.ROLLED_BACK:
        age = snap.age(st.completion_time or last_write(obj))
        if age is None or age > snap.settings.stuck_after:
            return None
        return Finding(
            ID, Severity.WARNING,
            f"move of claim {claim} {where} rolled back {_minutes(age)} ago: "
            f"{st.reason or 'no reason given'}",
            f"the move could not go on ({st.message or st.reason or 'no message'}); the claim "
            f"stays on node {source or '?'} with its data, and its pod was restarted there",
            (line,),
            (Fix("Nothing to undo. Fix the reason, then delete this VolumeMove and move again.",
                 (show,)),),
            subjects, context,
        )  # fmt: skip
    if st.phase == MovePhase.UNVERIFIED:
        return unverified(snap, obj, names, lv_kind)
    if move.done:
        return None
    lv = snap.get(lv_kind, st.target_volume) if st.target_volume else None
    copy: Obj = ((lv or {}).get("status") or {}).get("copy") or {}
    pod = snap.get("pods", st.pod, move.namespace) if st.pod else None
    if lv is not None:
        context += (Ref("LogicalVolume", st.target_volume),)
    if pod is not None:
        context += (Ref("Pod", st.pod, move.namespace),)
    progress = _progress(snap, st, copy)
    since = _since(move, obj)
    age = snap.age(since)
    evidence = [line + (f"; in this step since {since}" if since else "")]
    if copy:
        done = _percent(int(copy.get("doneBytes") or 0), int(copy.get("totalBytes") or 0))
        evidence.append(
            f"LogicalVolume {st.target_volume} on node {target or '?'}: status.copy.phase="
            f"{copy.get('phase', 'Pending')}, {done or 'not started'}, "
            f"{human(int(copy.get('bytesPerSecond') or 0))}/s, "
            f"message: {copy.get('message') or '(none)'}"
        )  # fmt: skip
    why = _explain(snap, move, names, copy, lv, pod, evidence, lv_kind)
    copy_phase = str(copy.get("phase") or "")
    lv_age = snap.age(last_write(lv)) if lv is not None else None
    progressing = (
        st.phase in COPYING and copy_phase == "Copying"
        and int(copy.get("bytesPerSecond") or 0) > 0
        and (lv_age is None or lv_age <= snap.settings.stuck_after)
    ) or (st.phase == MovePhase.VERIFYING and not why.reasons)  # fmt: skip
    if age is not None:
        stuck = age > snap.settings.stuck_after and not progressing
    else:  # how long the step lasted is unknown: the target's copy tells
        stuck = copy_phase == "Failed" or str(copy.get("message") or "").startswith("waiting") or (
            st.phase in COPYING and copy_phase == "Copying"
            and not int(copy.get("bytesPerSecond") or 0)
        )  # fmt: skip
    if stuck:  # a move that stands still: does anything drive it?
        runs, line = _controller(snap)
        evidence.append(line)
        if runs is False:
            why.add(
                "no topolvm-controller pod runs",
                Fix("topolvm-controller must run: it drives moves, and goes on from the step "
                    "the VolumeMove records.", (snap.logs_command(CONTROLLER_CONTAINER),)),
            )  # fmt: skip
    step = f"step {st.phase} ({STEPS.get(st.phase, 'unknown step')})"
    wait = Fix("Nothing to fix: wait for it (the VolumeMove's status shows its progress).",
               (show,))  # fmt: skip
    # (the copy's reason comes first) the pod is down while the source is open: said at once
    if not stuck and why.reasons and "is still open on node" in why.reasons[0]:
        return Finding(
            ID, Severity.WARNING,
            f"claim {claim} is being moved {where}: {step}" + (f", {progress}" if progress else ""),
            why.reasons[0], tuple(evidence), (why.fixes[0], wait), subjects, context,
        )  # fmt: skip
    if not stuck:
        return Finding(
            ID, Severity.WARNING,
            f"claim {claim} is being moved {where}: {step}" + (f", {progress}" if progress else ""),
            st.message or (why.reasons[0] if why.reasons else "topolvm-controller moves it "
                                                               "step by step"),
            tuple(evidence), (wait,), subjects, context,
        )  # fmt: skip
    cause = (
        why.reasons[0]
        if why.reasons
        else (f"the move says: {st.message}" if st.message else "the move records no reason")
    )
    if why.reasons and st.message and st.message not in cause:
        cause += f"; the move says: {st.message}"
    evidence += [f"also: {r}" for r in why.reasons[1:]]
    fixes = [*why.fixes]
    if not why.reasons:
        fixes.append(Fix("topolvm-controller's log says what the move waits for.",
                         (snap.logs_command(CONTROLLER_CONTAINER), show)))  # fmt: skip
    if st.phase in (MovePhase.PENDING, MovePhase.PRE_COPY, MovePhase.STOPPING,
                    MovePhase.FINAL_COPY, MovePhase.ROLLING_BACK):  # fmt: skip
        fixes.append(Fix(
            "Do not delete the VolumeMove mid-move: delete it only after it rolled back "
            "(phase RolledBack); the claim keeps its data on node "
            f"{source or '?'} until the swap.", (show,)))  # fmt: skip
    else:
        fixes.append(Fix(
            f"The claim is bound to its new volume on node {target or '?'} already: the move "
            "can only go forward; do not delete the VolumeMove or the old volume by hand.",
            (show,)))  # fmt: skip
    for_how_long = f" for {_minutes(age)}" if age is not None else ""
    return Finding(
        ID, Severity.ERROR,
        f"move of claim {claim} is stuck at step {st.phase}{for_how_long} ({where})",
        cause, tuple(evidence), tuple(fixes), subjects, context,
    )  # fmt: skip


def run(snap: Snapshot) -> list[Finding]:
    findings = []
    for (kind, lv_kind), names in zip(KINDS, BOTH, strict=True):
        for obj in snap[kind]:
            found = _one(snap, obj, names, lv_kind)
            if found is not None:
                findings.append(found)
    return findings


CHECK = Check(
    ID, 8, ("volumemoves", "legacy-volumemoves"), run,
    "claims being moved to another node: the step, its progress, or why a move is stuck",
)  # fmt: skip

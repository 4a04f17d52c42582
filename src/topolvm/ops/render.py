"""What ``topolvm move`` and ``topolvm drain`` print (pure)."""

from __future__ import annotations

from topolvm.k8s.moveobject import MovePhase, MoveStatus, OldVolume, VolumeMoveObject
from topolvm.move.rules import Estimate, Refused
from topolvm.ops.preflight import Plan
from topolvm.units import human

SUCCEEDED, FAILED = 0, 1


def refusal_line(command: str, refused: Refused) -> str:
    return f"topolvm {command}: refused ({refused.reason}): {refused.message}"


def follow_hint(namespace: str) -> str:
    return f"the move goes on; follow it with kubectl get volumemoves -n {namespace}"


def device_class_name(device_class: str) -> str:
    return f"device class {device_class}" if device_class else "the default device class"


def why_target(plan: Plan) -> str:
    if plan.requested:
        return f"requested with --to; {human(plan.target_free)} free"
    return f"most free bytes in {device_class_name(plan.device_class)}: {human(plan.target_free)}"


def downtime_text(est: Estimate) -> str:
    how = "measured" if est.measured else "assumed"
    n = est.restarts_measured
    restart = (f"~{est.restart_seconds:.0f} s, as this cluster's {n} finished move"
               f"{'' if n == 1 else 's'} took (median)" if n
               else f"~{est.restart_seconds:.0f} s assumed")  # fmt: skip
    return (
        f"about {est.downtime_seconds:.0f} s (final copy of ~{human(est.delta_bytes)} at "
        f"{human(est.rate)}/s, {how}, plus the pod's stop and start, {restart})"
    )


def dry_run_text(plans: list[Plan]) -> str:
    """What ``topolvm move --dry-run`` says it would do (the claim asked for first, then the
    other node-local claims of its pod, which move with it)."""
    plan = plans[0]
    lines = [f"would move claim {plan.key} (used by pod {plan.pod} of {plan.owner})"]
    if plan.together:
        lines.append(f"  together with {', '.join(plan.together)}: pod {plan.pod} uses "
                     "them too, and can only run where all its node-local claims are")  # fmt: skip
    lines.append(f"  from node {plan.source} to node {plan.target} ({why_target(plan)})")
    for p in plans:
        lines.append(
            f"  data of {p.claim}: at most {human(p.size)} ({p.size} bytes, the volume's "
            "size; zero and unwritten blocks do not travel), most of it while the pod runs"
        )  # fmt: skip
    lines.append(f"  downtime: {downtime_text(plan.pod_estimate)}")
    lines.append(f"  {keep_text(plan.keep_source_seconds)}")
    for p in plans:
        if p.replaces:
            lines.append(f"  the finished VolumeMove {p.key} ({p.replaces}) would be replaced")
    lines.append("dry run: nothing was changed")
    return "\n".join(lines) + "\n"


def keep_text(keep: int) -> str:
    """What becomes of the old volume (``--keep-source``)."""
    then = f"kept {keep} s longer, then removed" if keep else "then removed"
    return (
        "the old volume stays until both nodes' digests of the data as of the swap match "
        f"(the pod already runs on the target), {then}"
    )


def percent(done: int, total: int) -> float | None:
    """Progress of the copy in hand, 0-100; None when there is no copy to measure."""
    if total <= 0:
        return None
    return max(0.0, min(100.0, 100.0 * done / total))


def progress_line(status: MoveStatus, prefix: str = "") -> str:
    """One line for a phase change: ``[prefix] Phase [42%]: message``."""
    pct = percent(status.done_bytes, status.total_bytes)
    share = f" {pct:.0f}%" if pct is not None and status.phase not in MovePhase.DONE else ""
    message = f": {status.message}" if status.message else ""
    head = f"{prefix} " if prefix else ""
    return f"{head}{status.phase}{share}{message}"


def outcome(move: VolumeMoveObject) -> tuple[str, int]:
    """The last words on a finished move and the exit code (0 only for Succeeded)."""
    s = move.status
    claim = f"{move.namespace}/{move.claim or move.name}"
    if s.phase == MovePhase.SUCCEEDED:
        kept = (f"; the old volume {s.old_pv} is kept until {s.keep_source_until}"
                if s.old_volume == OldVolume.KEPT else "")  # fmt: skip
        verified = f", verified (digest {s.target_digest[:16]})" if s.target_digest else ""
        return (
            f"moved claim {claim} from node {s.source_node or '?'} to node "
            f"{s.target_node or '?'}: downtime {s.downtime_seconds} s; "
            f"{human(s.precopy_bytes)} pre-copied, {human(s.delta_bytes)} in the final copy"
            f"{verified}{kept}",
            SUCCEEDED,
        )
    if s.phase == MovePhase.UNVERIFIED:
        return (f"move of claim {claim} not verified ({s.reason}): {s.message}; topolvm doctor "
                f"-n {move.namespace} says what to do", FAILED)  # fmt: skip
    if s.phase == MovePhase.ROLLED_BACK:
        where = f"; the claim stays on node {s.source_node}" if s.source_node else ""
        return f"move of claim {claim} rolled back ({s.reason}): {s.message}{where}", FAILED
    if s.phase == MovePhase.REFUSED:
        return f"move of claim {claim} refused ({s.reason}): {s.message}", FAILED
    return f"move of claim {claim} is not done: phase {s.phase}", FAILED

"""Pods held by a move's scheduling gate (``<plugin>/move``) although no move of their claims is
in progress: the pod webhook gave them the gate while a move was in a downtime step, and the
move ended (or its VolumeMove went) without lifting it; such a pod is never scheduled.
topolvm-controller's gate sweep lifts these within 30 s (docs/mobility.md, "Fencing"); one
that stays means the sweep does not run or cannot write the pod."""

from __future__ import annotations

import datetime
import json

from topolvm.doctor.checks.volume_moves import CONTROLLER_CONTAINER, gate_of
from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import BOTH, Obj, Snapshot, meta, name_of, ns_of
from topolvm.k8s.moveobject import VolumeMoveObject
from topolvm.move.claims import stale_gates
from topolvm.move.rules import claims_of

ID = "move-gate-left"
SWEEP_GRACE = datetime.timedelta(seconds=60)  # the sweep runs every 30 s


def run(snap: Snapshot) -> list[Finding]:
    moves = [*snap["volumemoves"], *snap["legacy-volumemoves"]]
    findings = []
    for names in BOTH:
        gate = gate_of(names)
        for pod in stale_gates(snap["pods"], moves, gate):
            findings.append(_finding(snap, pod, gate, moves))
    return findings


def _finding(snap: Snapshot, pod: Obj, gate: str, moves: list[Obj]) -> Finding:
    ns, name = ns_of(pod), name_of(pod)
    claims = claims_of(pod)
    evidence = [f"pod {ns}/{name}: Pending, held by the scheduling gate {gate}"]
    for claim in claims:
        found = [
            VolumeMoveObject.from_dict(m) for m in moves
            if ns_of(m) == ns and claim in (name_of(m), (m.get("spec") or {}).get("claim"))
        ]  # fmt: skip
        if not found:
            evidence.append(f"claim {claim}: no VolumeMove")
        for vm in found:
            why = f" ({vm.status.reason})" if vm.status.reason else ""
            evidence.append(f"claim {claim}: VolumeMove {ns}/{vm.name} is {vm.status.phase}{why}")
    age = snap.age(str(meta(pod).get("creationTimestamp") or ""))
    young = age is not None and age < SWEEP_GRACE
    index = next(i for i, g in enumerate((pod.get("spec") or {}).get("schedulingGates") or [])
                 if g.get("name") == gate)  # fmt: skip
    ops = [{"op": "test", "path": f"/spec/schedulingGates/{index}", "value": {"name": gate}},
           {"op": "remove", "path": f"/spec/schedulingGates/{index}"}]  # fmt: skip
    patch = f"kubectl patch pod -n {ns} {name} --type=json -p '{json.dumps(ops)}'"
    return Finding(
        check=ID,
        severity=Severity.WARNING if young else Severity.ERROR,
        title=f"pod {ns}/{name} is held by the scheduling gate {gate}, but no move of its "
        "claims is in progress",
        cause=(
            "the pod webhook gave it the gate while a move of its claim was stopping its pod, "
            "and the move ended without lifting it (the pod was stored after the move let its "
            "pods go); it is never scheduled while the gate is there"
            + ("; topolvm-controller's gate sweep lifts it within 30 s" if young else "")
        ),
        evidence=tuple(evidence),
        fixes=(
            Fix(
                "topolvm-controller (its leader) lifts such a gate every 30 s: its log says "
                "why it did not.",
                (snap.logs_command(CONTROLLER_CONTAINER),),
            ),
            Fix("Lift the gate by hand (the test makes sure it is still the move's):", (patch,)),
        ),
        subjects=(Ref("Pod", name, ns),),
        context=tuple(Ref("PersistentVolumeClaim", c, ns) for c in claims),
    )


CHECK = Check(
    ID, 8, ("pods", "volumemoves", "legacy-volumemoves"), run,
    "pods held by a move's scheduling gate with no move of their claims in progress",
)  # fmt: skip

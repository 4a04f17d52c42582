"""PodDisruptionBudget arithmetic for ``topolvm drain`` (pure): a move stops its pod, so it
starts only while every budget over the pod allows one more disruption."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector against a pod's labels. policy/v1: an empty selector matches every pod
    of the namespace, a missing one none. An unknown operator matches nothing."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op = expr.get("key"), expr.get("operator")
        values = set(expr.get("values") or [])
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            ok = False
        if not ok:
            return False
    return True


@dataclass(frozen=True)
class Budget:
    """One budget over a pod: what its status allows, and the moves of its pods running."""

    name: str
    allowed: int  # status.disruptionsAllowed
    in_flight: int  # moves of this budget's pods already running

    @property
    def left(self) -> int:
        return self.allowed - self.in_flight

    def __str__(self) -> str:
        return (
            f"PodDisruptionBudget {self.name}: {self.allowed} disruption(s) allowed, "
            f"{self.in_flight} move(s) of its pods running"
        )


def budgets(
    pod_labels: Mapping[str, str], pdbs: Iterable[Obj], moving: Iterable[Mapping[str, str]]
) -> list[Budget]:
    """The budgets (of the pod's namespace) whose selector matches ``pod_labels``, each with
    the number of ``moving`` pods (labels of pods whose moves run) it also covers."""
    running = list(moving)
    out = []
    for pdb in pdbs:
        selector = (pdb.get("spec") or {}).get("selector")
        if not selector_matches(selector, pod_labels):
            continue
        allowed = (pdb.get("status") or {}).get("disruptionsAllowed") or 0
        in_flight = sum(1 for labels in running if selector_matches(selector, labels))
        name = str((pdb.get("metadata") or {}).get("name") or "")
        out.append(Budget(name, int(allowed), in_flight))
    return sorted(out, key=lambda b: b.name)


def blocking(
    pod_labels: Mapping[str, str], pdbs: Iterable[Obj], moving: Iterable[Mapping[str, str]]
) -> list[Budget]:
    """The budgets that forbid moving the pod now: fewer than one disruption left once the
    running moves of their pods are counted. Empty: the move may start."""
    return [b for b in budgets(pod_labels, pdbs, moving) if b.left < 1]

"""What a check reports: findings with evidence, a one-sentence cause and fixes (pure data)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from topolvm.doctor.snapshot import Snapshot


class Severity(enum.IntEnum):
    """Report order: errors first. ``UNDECIDED`` is a check that could not read what it needs."""

    ERROR = 0
    WARNING = 1
    UNDECIDED = 2

    @property
    def label(self) -> str:
        return {0: "error", 1: "warning", 2: "undecided"}[int(self)]


@dataclass(frozen=True, order=True)
class Ref:
    """One Kubernetes object a finding is about."""

    kind: str
    name: str
    namespace: str = ""

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"

    def to_json(self) -> dict[str, str]:
        out = {"kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        return out


@dataclass(frozen=True)
class Fix:
    """One way out: a sentence, then commands to run (or values keys to set), in order."""

    summary: str
    commands: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary, "commands": list(self.commands)}


@dataclass(frozen=True)
class Finding:
    check: str
    severity: Severity
    title: str
    """What is wrong, in one line."""
    cause: str
    """Why, in one sentence."""
    evidence: tuple[str, ...]
    """Objects, fields and events that show it."""
    fixes: tuple[Fix, ...]
    """Alternatives: any one of them fixes it."""
    subjects: tuple[Ref, ...]
    """The objects the finding is about: a scope keeps it when one of them is in scope."""
    context: tuple[Ref, ...] = ()
    """Objects it involves (the node of a PVC, the webhook configuration of marked pods),
    shown in ``objects`` but not used to match a scope."""
    cluster_wide: bool = False
    """A configuration problem that concerns every scope (CSIDriver, webhook, mixtures)."""
    order: int = field(default=0, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "severity": self.severity.label,
            "title": self.title,
            "cause": self.cause,
            "evidence": list(self.evidence),
            "fixes": [f.to_json() for f in self.fixes],
            "objects": [s.to_json() for s in (*self.subjects, *self.context)],
        }


@dataclass(frozen=True)
class Check:
    """A check: ``run`` reads a snapshot and returns its findings. ``needs`` names the
    snapshot's kinds it reads; when one could not be read, the check is undecided."""

    id: str
    order: int
    needs: tuple[str, ...]
    run: Callable[[Snapshot], list[Finding]]
    summary: str

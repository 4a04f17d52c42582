"""Runs the checks over a snapshot: a check that needs a kind that could not be read reports
itself undecided (naming what it could not read); a check that raises is a bug, reported as
undecided with the error rather than hiding the other checks' findings."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from topolvm.doctor.checks import all_checks
from topolvm.doctor.model import Check, Finding, Severity
from topolvm.doctor.scope import Scope
from topolvm.doctor.snapshot import Snapshot

log = logging.getLogger("topolvm.doctor")


@dataclass
class Report:
    scope: Scope
    findings: list[Finding] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)

    undecided_checks: set[str] = field(default_factory=set)

    @property
    def exit_code(self) -> int:
        """1 when something is wrong; otherwise 2 when no check could decide anything, else 0
        (checks that could not read part of what they need are listed, not fatal)."""
        if any(f.severity != Severity.UNDECIDED for f in self.findings):
            return 1
        if self.checks and self.undecided_checks >= set(self.checks):
            return 2
        return 0


def undecided(check: Check, why: str) -> Finding:
    return Finding(
        check.id, Severity.UNDECIDED, f"could not check: {check.summary}", why, (), (), (),
        cluster_wide=True, order=check.order,
    )  # fmt: skip


def diagnose(snap: Snapshot, scope: Scope, checks: list[Check] | None = None) -> Report:
    report = Report(scope)
    related = scope.related(snap)
    for check in checks if checks is not None else all_checks():
        report.checks.append(check.id)
        missing = [k for k in check.needs if k in snap.unreadable]
        if missing:
            why = "; ".join(f"cannot read {k}: {snap.unreadable[k]}" for k in missing)
            report.findings.append(undecided(check, why))
            report.undecided_checks.add(check.id)
            continue
        try:
            found = check.run(snap)
        except Exception as e:  # a bug in one check must not hide the others
            log.exception("check %s failed", check.id)
            report.findings.append(undecided(check, f"the check failed: {type(e).__name__}: {e}"))
            report.undecided_checks.add(check.id)
            continue
        report.findings += [_ordered(f, check.order) for f in found if scope.keep(f, related)]
    report.findings.sort(key=lambda f: (f.severity, f.order))
    return report


def _ordered(f: Finding, order: int) -> Finding:
    return replace(f, order=order)

"""``topolvm doctor``'s output: grouped by severity for people (colour only on a terminal, and
never with NO_COLOR), or one JSON document for scripts."""

from __future__ import annotations

import json
from typing import Any

from topolvm.doctor.model import Finding, Severity
from topolvm.doctor.run import Report

COLOURS = {Severity.ERROR: "31", Severity.WARNING: "33", Severity.UNDECIDED: "35"}
HEADINGS = {
    Severity.ERROR: "ERRORS",
    Severity.WARNING: "WARNINGS",
    Severity.UNDECIDED: "COULD NOT CHECK",
}


def as_json(report: Report, seconds: float) -> str:
    doc: dict[str, Any] = {
        "scope": str(report.scope),
        "healthy": report.exit_code == 0,
        "checks": report.checks,
        "seconds": round(seconds, 3),
        "findings": [f.to_json() for f in report.findings],
    }
    return json.dumps(doc, indent=2)


def as_text(report: Report, seconds: float, colour: bool) -> str:
    def paint(code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if colour else text

    counts = {s: sum(1 for f in report.findings if f.severity == s) for s in Severity}
    if not report.findings:
        return (
            f"topolvm doctor: {report.scope}: healthy ({len(report.checks)} checks, "
            f"{seconds:.1f}s)\n"
        )
    summary = ", ".join(
        f"{n} {s.label}{'s' if n > 1 and s != Severity.UNDECIDED else ''}"
        for s, n in counts.items()
        if n
    )
    lines = [f"topolvm doctor: {report.scope}: {summary} ({len(report.checks)} checks, "
             f"{seconds:.1f}s)"]  # fmt: skip
    for severity in Severity:
        group = [f for f in report.findings if f.severity == severity]
        if not group:
            continue
        lines += ["", paint("1;" + COLOURS[severity], HEADINGS[severity])]
        for i, f in enumerate(group, 1):
            lines += _finding(i, f, lambda t, s=severity: paint(COLOURS[s], t))
    return "\n".join(lines) + "\n"


def _finding(i: int, f: Finding, paint: Any) -> list[str]:
    out = ["", f"{i}. {paint(f.title)}  [{f.check}]", f"   cause: {f.cause}"]
    if f.evidence:
        out.append("   evidence:")
        out += [f"     - {e}" for e in f.evidence]
    for n, fix in enumerate(f.fixes, 1):
        label = "fix" if len(f.fixes) == 1 else f"fix {n} of {len(f.fixes)}"
        out.append(f"   {label}: {fix.summary}")
        out += [f"       $ {c}" for c in fix.commands]
    return out

"""Objects of both API groups at once: ``topolvm.cybozu.com`` (legacy) and ``topolvm.io``. Each
driver serves only its own group, so LogicalVolumes or StorageClasses of a group whose driver
does not run are never reconciled; two drivers at once usually mean a half-done migration."""

from __future__ import annotations

from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import BOTH, Snapshot, name_of

ID = "legacy-mixture"


def run(snap: Snapshot) -> list[Finding]:
    drivers = {name_of(d) for d in snap["csidrivers"]} & {n.plugin for n in BOTH}
    findings = []
    if len(drivers) == 2:
        findings.append(Finding(
            ID, Severity.WARNING, "CSIDrivers of both API groups are registered",
            "two TopoLVM installations (legacy topolvm.cybozu.com and topolvm.io) run side by "
            "side, usually a migration left half done",
            tuple(f"CSIDriver {d}" for d in sorted(drivers)),
            (Fix("Finish the migration (docs/install.md, upgrade from upstream) and remove the "
                 "other installation's CSIDriver when none of its volumes is left."),),
            tuple(Ref("CSIDriver", d) for d in sorted(drivers)), cluster_wide=True,
        ))  # fmt: skip
    if not drivers:
        return findings
    for kind, names in zip(("logicalvolumes", "legacy-logicalvolumes"), BOTH, strict=True):
        if names.plugin in drivers or not snap[kind]:
            continue
        running = ", ".join(sorted(drivers))
        findings.append(Finding(
            ID, Severity.WARNING,
            f"{len(snap[kind])} LogicalVolume(s) of {names.group}, whose driver does not run",
            f"only {running} runs, so nothing reconciles or deletes these volumes",
            (f"logicalvolumes.{names.group}: {', '.join(name_of(o) for o in snap[kind][:5])}"
             + (" ..." if len(snap[kind]) > 5 else ""),
             f"CSIDriver objects: {running}"),
            (Fix("Run the driver of that group (legacy mode: USE_LEGACY), or migrate the "
                 "volumes; do not delete them by hand while PVs use them."),),
            tuple(Ref("LogicalVolume", name_of(o)) for o in snap[kind]), cluster_wide=True,
        ))  # fmt: skip
    return findings


CHECK = Check(
    ID, 11, ("csidrivers", "logicalvolumes", "legacy-logicalvolumes"), run,
    "objects of both API groups (topolvm.cybozu.com and topolvm.io) at once",
)  # fmt: skip

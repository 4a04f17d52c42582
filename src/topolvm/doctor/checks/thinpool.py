"""Thin pools filling up, from topolvm-node's ``topolvm_thinpool_data_percent`` and
``topolvm_thinpool_metadata_percent`` gauges (read through the API server's pod proxy). A full
thin pool's data makes every write of every thin volume on it fail; full metadata makes new
snapshots and volumes fail and can damage the pool."""

from __future__ import annotations

from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import Snapshot, name_of

ID = "thinpool"


def run(snap: Snapshot) -> list[Finding]:
    findings = []
    limits = {
        "data_percent": snap.settings.thin_data_percent,
        "metadata_percent": snap.settings.thin_metadata_percent,
    }
    blind = [n for n in snap["node-metrics"] if n.get("error")]
    if blind:
        findings.append(Finding(
            ID, Severity.UNDECIDED,
            f"could not read the thin pools of {len(blind)} node(s)",
            "topolvm-node's /metrics did not answer through the API server's pod proxy",
            tuple(f"node {name_of(n)} (pod {n.get('pod')}): {n['error']}" for n in blind[:10]),
            (), tuple(Ref("Node", name_of(n)) for n in blind),
        ))  # fmt: skip
    for node in snap["node-metrics"]:
        for pool in node.get("pools") or []:
            full = {k: pool[k] for k, limit in limits.items() if pool.get(k, 0.0) >= limit}
            if not full:
                continue
            dc = pool.get("device_class", "")
            what = " and ".join(f"{k.replace('_percent', '')} {v:.1f}%" for k, v in full.items())
            severity = Severity.ERROR if max(full.values()) >= 95 else Severity.WARNING
            findings.append(Finding(
                ID, severity,
                f"node {name_of(node)}: thin pool of device class {dc} is {what} full",
                "thin volumes were written (or overprovisioned) beyond what the pool holds; "
                "when it is full, writes fail"
                + (" and the pool's metadata can be damaged" if "metadata_percent" in full
                   else ""),
                (f"pod {node.get('pod')}: topolvm_thinpool_data_percent "
                 f"{pool.get('data_percent', 0):.1f}, topolvm_thinpool_metadata_percent "
                 f"{pool.get('metadata_percent', 0):.1f} (thresholds "
                 f"{limits['data_percent']:.0f}/{limits['metadata_percent']:.0f})",),
                (Fix("Grow the pool (lvextend on the node; the metadata with "
                     "--poolmetadatasize), delete unused volumes or snapshots, or lower the "
                     "device class's overprovision-ratio.",
                     (f"kubectl get logicalvolumes -o wide | grep {name_of(node)}",)),),
                (Ref("Node", name_of(node)),),
            ))  # fmt: skip
    return findings


CHECK = Check(
    ID, 9, ("node-metrics",), run,
    "thin pools above the data% or metadata% threshold (topolvm-node's metrics)",
)  # fmt: skip

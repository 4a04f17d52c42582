"""A move's target LogicalVolume, read (pure; see :mod:`topolvm.controller.moves`): how far
its copy has come, and whether it holds the final copy of the move's source, which the swap
checks before the group's commit (docs/mobility.md, "Fencing")."""

from __future__ import annotations

from typing import Any

from topolvm.k8s.lvobject import LogicalVolumeObject


def progress(phase: str, target: LogicalVolumeObject) -> dict[str, Any]:
    copy = target.copy
    if copy is None or (not target.copy_done and copy.round != target.copy_round and (
        target.copy_round > 1
    )):  # fmt: skip
        return {"done_bytes": 0, "total_bytes": 0, "progress": f"{phase} 0%"}
    pct = copy.done_bytes * 100 // copy.total_bytes if copy.total_bytes else 0
    if target.copy_done:
        pct = 100
    return {"done_bytes": copy.done_bytes, "total_bytes": copy.total_bytes,
            "progress": f"{phase} {pct}%"}  # fmt: skip


def final_copy_of(target: LogicalVolumeObject, source: LogicalVolumeObject) -> str:
    """ "" when ``target`` holds the final copy (round 2, done) of ``source``, else why not."""
    if target.copy_source != source.name:
        return (f"the target LogicalVolume {target.name} is filled from "
                f"{target.copy_source or 'nothing'}, not from the source "
                f"{source.name}")  # fmt: skip
    copy = target.copy
    done_round = target.copy_round_of(copy) if copy is not None else 0
    if target.copy_round != 2 or not target.copy_done or done_round != 2:
        return (f"the target's copy is round {done_round} "
                f"({copy.phase if copy is not None else 'not started'}), not the final round 2 "
                "done")  # fmt: skip
    if copy is not None and copy.source_node and copy.source_node != source.node_name:
        return (f"the target's copy came from node {copy.source_node}, not from the source's "
                f"node {source.node_name}")  # fmt: skip
    return ""

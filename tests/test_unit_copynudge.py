"""Which copy targets nudge their claim (src/topolvm/controller/copynudge.py): a restore's or
clone's target whose copy is Done, naming the claim that waits for it."""

from __future__ import annotations

from typing import Any

from topolvm.constants import NORMAL
from topolvm.controller.copynudge import nudge_for
from topolvm.k8s.lvobject import LogicalVolumeObject


def lv(phase: str = "Done", claim: str = "app/data", deleting: bool = False,
       source: str = "src-lv", round_: int = 1) -> LogicalVolumeObject:  # fmt: skip
    annotations = {"topolvm.io/claim": claim} if claim else {}
    meta: dict[str, Any] = {"name": "pvc-1", "uid": "u1", "annotations": annotations}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T10:00:00Z"
    copy = {"source": source, "round": round_} if source else {}
    return LogicalVolumeObject.from_dict({
        "metadata": meta,
        "spec": {"name": "pvc-1", "nodeName": "n2", "size": "1Gi", "deviceClass": "thin",
                 **({"copy": copy} if copy else {})},
        "status": {"volumeID": "v1", "copy": {"phase": phase, "round": 1,
                                              "completionTime": "2026-11-28T10:00:01Z"}},
    })  # fmt: skip


def test_a_done_copy_nudges_its_claim() -> None:
    assert nudge_for(lv(), NORMAL) == ("app", "data", "pvc-1@2026-11-28T10:00:01Z")


def test_nothing_else_does() -> None:
    assert nudge_for(lv(phase="Copying"), NORMAL) is None
    assert nudge_for(lv(phase="Failed"), NORMAL) is None
    assert nudge_for(lv(deleting=True), NORMAL) is None
    assert nudge_for(lv(source=""), NORMAL) is None  # not a copy target
    assert nudge_for(lv(claim=""), NORMAL) is None  # a snapshot's: no claim waits
    assert nudge_for(lv(claim="no-namespace"), NORMAL) is None
    assert nudge_for(lv(round_=2), NORMAL) is None  # a move's round 2 not done yet

"""A move's pure parts: the VolumeMove's status round trip, the swap's new PV and re-created
claim, and the pod webhook's scheduling gate while a claim moves."""

from __future__ import annotations

import json
from typing import Any

from tests.podmutate_helpers import Reader
from topolvm.constants import NORMAL
from topolvm.controller.podmutate import decide
from topolvm.k8s.lvobject import CopyPhase, CopyStatus, LogicalVolumeObject
from topolvm.k8s.moveobject import MovePhase, MoveStatus, VolumeMoveObject, manifest
from topolvm.move import claims

Obj = dict[str, Any]


def _pvc() -> Obj:
    return {
        "metadata": {
            "name": "data-db-0", "namespace": "apps", "uid": "u1",
            "labels": {"app": "db"},
            "annotations": {"pv.kubernetes.io/bind-completed": "yes",
                            "volume.kubernetes.io/selected-node": "node-a",
                            "team": "storage"},
        },
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "thin",
                 "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "pvc-old",
                 "dataSource": {"kind": "VolumeSnapshot", "name": "s"}},
    }  # fmt: skip


def test_the_claim_comes_back_under_its_name_bound_to_the_new_volume() -> None:
    template = claims.claim_template(_pvc())
    again = claims.new_claim(template, "apps", "data-db-0", "move-1")
    assert again["metadata"] == {
        "name": "data-db-0", "namespace": "apps", "labels": {"app": "db"},
        "annotations": {"team": "storage"},
    }  # fmt: skip
    assert again["spec"]["volumeName"] == "move-1"
    assert "dataSource" not in again["spec"]
    assert again["spec"]["resources"] == {"requests": {"storage": "1Gi"}}
    json.loads(template)  # what the VolumeMove keeps is JSON


def test_the_new_volume_is_on_the_target_pre_bound_to_the_claim_name() -> None:
    old = {"metadata": {"name": "pvc-old"},
           "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "thin",
                    "volumeMode": "Filesystem", "mountOptions": ["noatime"],
                    "csi": {"driver": "topolvm.io", "volumeHandle": "old-id",
                            "fsType": "xfs"}}}  # fmt: skip
    pv = claims.new_volume(old, "move-1", "new-id", "node-b", NORMAL.topology_key, "Delete",
                           "apps", "data-db-0", "topolvm.io")  # fmt: skip
    spec = pv["spec"]
    assert spec["csi"] == {"driver": "topolvm.io", "volumeHandle": "new-id", "fsType": "xfs"}
    assert spec["persistentVolumeReclaimPolicy"] == "Delete"
    assert spec["claimRef"]["name"] == "data-db-0" and "uid" not in spec["claimRef"]
    term = spec["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert term == {"key": "topology.topolvm.io/node", "operator": "In", "values": ["node-b"]}
    assert spec["mountOptions"] == ["noatime"]
    assert pv["metadata"]["annotations"] == {"pv.kubernetes.io/provisioned-by": "topolvm.io"}


def test_status_round_trips_and_done_phases() -> None:
    status = MoveStatus(phase=MovePhase.FINAL_COPY, source_node="a", target_node="b",
                        precopy_bytes=5, downtime_seconds=3)  # fmt: skip
    raw = manifest("topolvm.io", "apps", "data-db-0", "b")
    raw["metadata"]["uid"] = "x"
    raw["status"] = status.to_dict()
    vm = VolumeMoveObject.from_dict(raw)
    assert vm.status == status and vm.target_node == "b" and not vm.done
    assert raw["status"]["preCopyBytes"] == 5 and "message" not in raw["status"]
    assert MoveStatus.from_dict({"phase": "Succeeded", "sizeBytes": "x"}).size_bytes == 0


def test_a_move_copy_is_done_only_for_its_round() -> None:
    def lv(round_spec: int, status_round: int) -> LogicalVolumeObject:
        return LogicalVolumeObject(
            "t", "u", "1", "b", 1 << 30, copy_source="s", copy_round=round_spec,
            copy=CopyStatus(phase=CopyPhase.DONE, round=status_round),
        )  # fmt: skip

    assert lv(1, 0).copy_done and lv(2, 2).copy_done
    assert not lv(2, 0).copy_done and not lv(2, 1).copy_done


def _pod(claim: str) -> Obj:
    volume = {"name": "d", "persistentVolumeClaim": {"claimName": claim}}
    return {"metadata": {"name": "db-0", "namespace": "apps"},
            "spec": {"containers": [{"name": "c"}], "volumes": [volume]}}  # fmt: skip


async def test_the_webhook_holds_a_pod_whose_claim_is_moving() -> None:
    bound = {"spec": {"storageClassName": "ssd"}, "status": {"phase": "Bound"}}
    for phase, held in ((MovePhase.PRE_COPY, False), (MovePhase.STOPPING, True),
                        (MovePhase.FINAL_COPY, True), (MovePhase.SWAPPING, True),
                        (MovePhase.STARTING, False), (MovePhase.SUCCEEDED, False)):  # fmt: skip
        reader = Reader({"apps/data-db-0": bound},
                        moves={"apps/data-db-0": {"status": {"phase": phase}}})  # fmt: skip
        d = await decide(_pod("data-db-0"), "apps", reader, NORMAL)
        assert d.allowed
        gate = {"op": "add", "path": "/spec/schedulingGates",
                "value": [{"name": "topolvm.io/move"}]}  # fmt: skip
        assert (gate in d.patch) is held, (phase, d)
        if held:
            assert "held by the move of claim data-db-0" in d.message


async def test_the_webhook_errors_when_it_cannot_read_moves() -> None:
    reader = Reader({}, fail="move")
    d = await decide(_pod("data-db-0"), "apps", reader, NORMAL)
    assert not d.allowed and d.code == 500 and "VolumeMove apps/data-db-0" in d.message


def test_the_gc_keeps_a_move_target_between_its_two_copies() -> None:
    from topolvm.controller.lvgc import References

    def target(round_: int, status_round: int) -> LogicalVolumeObject:
        return LogicalVolumeObject(
            "move-1", "u", "1", "b", 1 << 30, volume_id="u", copy_source="pvc-a",
            copy_keep_cut=True, copy_round=round_,
            copy=CopyStatus(phase=CopyPhase.DONE, round=status_round),
        )  # fmt: skip

    refs = References(snapshots=set())
    assert refs.holds(target(1, 0)) == "a move fills it"  # pre-copy done, pod still running
    assert refs.holds(target(2, 1)) == "a copy is filling it"  # the final copy runs
    assert refs.holds(target(2, 2)) is None  # done: its PV holds it from now on

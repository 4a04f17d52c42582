"""A restore or clone stays on its source's node when it can (docs/mobility.md, "A restore
stays local when it can"), as the pod webhook decides it, without Kubernetes: a pod whose claim
is restored from a snapshot or cloned from a claim prefers the source's node; a StorageClass or
VolumeSnapshotClass turns that off; a source that is not there yet, of another driver, or that
cannot be read leaves the pod without the preference (with a warning for a failure), never
refused. The cluster side is in tests/test_cluster_restore_local.py."""

from __future__ import annotations

import asyncio
from typing import Any

import jsonpatch
import pytest

from tests.podmutate_helpers import Obj, Reader, claim, pod, pvc
from topolvm.constants import NORMAL
from topolvm.controller import podmutate
from topolvm.controller.copies import PlacementError, placement
from topolvm.controller.podmutate import decide
from topolvm.controller.restoreplace import data_source, preferring
from topolvm.placement import PlacementValueError, prefers_source

KEY = "preferredDuringSchedulingIgnoredDuringExecution"
SNAP = {"kind": "VolumeSnapshot", "apiGroup": "snapshot.storage.k8s.io"}


def _restored(source: Obj, sc_name: str = "ssd") -> Obj:
    claim_obj = pvc(sc_name)
    claim_obj["spec"]["dataSource"] = source
    return claim_obj


def _reader() -> Reader:
    """app/snap-1 (class snaps) of content-1 (handle snap-lv on n2); app/origin bound to PV
    pv-origin (volume handle origin-lv on n1); app/restored from the snapshot, app/cloned from
    app/origin."""
    r = Reader({
        "app/origin": {"metadata": {"uid": "u-origin"},
                       "spec": {"storageClassName": "ssd", "volumeName": "pv-origin"},
                       "status": {"phase": "Bound"}},
        "app/restored": _restored({**SNAP, "name": "snap-1"}),
        "app/cloned": _restored({"kind": "PersistentVolumeClaim", "name": "origin"}),
    })  # fmt: skip
    r.pvs["pv-origin"] = {"spec": {
        "csi": {"driver": "topolvm.io", "volumeHandle": "origin-lv"},
        "claimRef": {"namespace": "app", "name": "origin", "uid": "u-origin"}}}  # fmt: skip
    r.snapshots["app/snap-1"] = {
        "metadata": {"uid": "u-snap"},
        "spec": {"volumeSnapshotClassName": "snaps"},
        "status": {"boundVolumeSnapshotContentName": "content-1", "readyToUse": True},
    }
    r.contents["content-1"] = {
        "spec": {"driver": "topolvm.io",
                 "volumeSnapshotRef": {"namespace": "app", "name": "snap-1", "uid": "u-snap"}},
        "status": {"snapshotHandle": "snap-lv"}}  # fmt: skip
    r.snapshot_classes["snaps"] = {"driver": "topolvm.io", "parameters": {}}
    r.volume_nodes.update({"origin-lv": "n1", "snap-lv": "n2"})
    return r


def _preferred(out: Obj) -> list[Any]:
    affinity = out["spec"].get("affinity", {}).get("nodeAffinity", {})
    return [t["preference"]["matchFields"][0]["values"][0] for t in affinity.get(KEY, [])]


async def _decided(reader: Reader, *claims: str) -> tuple[Obj, Any]:
    p = pod(*(claim(c) for c in claims))
    d = await decide(p, "app", reader, NORMAL)
    assert d.allowed, d.message
    out: Obj = jsonpatch.apply_patch(p, d.patch)
    return out, d


async def test_a_restored_or_cloned_claims_pod_prefers_the_sources_node() -> None:
    out, d = await _decided(_reader(), "restored")
    assert _preferred(out) == ["n2"]
    term = out["spec"]["affinity"]["nodeAffinity"][KEY][0]
    assert term == {"weight": 100, "preference": {"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["n2"]}]}}  # fmt: skip
    assert "prefers n2, where its restore is local" in d.message
    out, _ = await _decided(_reader(), "cloned")
    assert _preferred(out) == ["n1"]
    out, _ = await _decided(_reader(), "cloned", "restored")  # two sources: both preferred
    assert _preferred(out) == ["n1", "n2"]


async def test_a_class_parameter_turns_the_preference_off() -> None:
    r = _reader()
    r.classes["ssd"]["parameters"]["topolvm.io/restore-placement"] = "anywhere"
    out, d = await _decided(r, "cloned", "restored")
    assert _preferred(out) == [] and d.kind == "mutated"  # capacity annotations still
    r = _reader()
    r.snapshot_classes["snaps"]["parameters"]["topolvm.io/restore-placement"] = "anywhere"
    out, _ = await _decided(r, "cloned", "restored")
    assert _preferred(out) == ["n1"]  # the clone keeps it: only the snapshot's class said so


async def test_a_bad_parameter_or_a_failed_read_is_a_warning_never_a_refusal() -> None:
    r = _reader()
    r.classes["ssd"]["parameters"]["topolvm.io/restore-placement"] = "nearby"
    out, d = await _decided(r, "restored")
    assert _preferred(out) == []
    assert any("restore-placement must be source-node or anywhere, got 'nearby'" in w
               for w in d.warnings)  # fmt: skip
    r = _reader()
    r.fail = "snapshot"  # the snapshot CRDs are not installed, say
    out, d = await _decided(r, "restored", "cloned")
    assert _preferred(out) == ["n1"]
    assert any("app/restored: its source's node is not known" in w for w in d.warnings)


async def test_a_source_not_ready_or_of_another_driver_adds_nothing() -> None:
    r = _reader()
    r.snapshots["app/snap-1"]["status"] = {}  # not bound to a content yet
    r.pvs["pv-origin"]["spec"]["csi"]["driver"] = "example.com/nfs"
    out, d = await _decided(r, "restored", "cloned")
    assert _preferred(out) == [] and d.warnings == []
    r = _reader()
    r.snapshot_classes["snaps"]["driver"] = "example.com/other"
    r.volume_nodes.pop("origin-lv")  # the LogicalVolume is gone
    out, _ = await _decided(r, "restored", "cloned")
    assert _preferred(out) == []


async def test_a_source_that_does_not_point_back_reveals_no_node() -> None:
    """A user can write a claim's ``volumeName`` (a PV of someone else's) or, where allowed, a
    snapshot's status; the PV's ``claimRef`` and the content's ``volumeSnapshotRef`` are not
    theirs to write: a source they do not point back to gives no preference, so no node of a
    volume that is not the claim's source shows in the pod."""
    r = _reader()
    r.pvs["pv-origin"]["spec"]["claimRef"] = {"namespace": "other", "name": "db", "uid": "u-x"}
    r.contents["content-1"]["spec"]["volumeSnapshotRef"]["uid"] = "u-other-snap"
    out, d = await _decided(r, "restored", "cloned")
    assert _preferred(out) == [] and "prefers" not in d.message
    r = _reader()
    r.snapshots["app/snap-1"]["status"]["readyToUse"] = False
    r.pvcs["app/origin"]["status"]["phase"] = "Pending"
    out, _ = await _decided(r, "restored", "cloned")
    assert _preferred(out) == []


async def test_a_bound_claim_leaves_the_pod_alone() -> None:
    r = _reader()
    r.pvcs["app/restored"]["status"]["phase"] = "Bound"  # the volume exists: no mutation at all
    p = pod(claim("restored"))
    d = await decide(p, "app", r, NORMAL)
    assert d.patch == []


def test_the_pods_own_affinity_stays_and_a_pod_bound_to_a_node_is_left_alone() -> None:
    own = {"weight": 5, "preference": {"matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["a"]}]}}  # fmt: skip
    p = pod(claim("x"))
    p["spec"]["affinity"] = {"nodeAffinity": {KEY: [own]}}
    out = preferring(p, ["n1", "n1"])
    assert out["spec"]["affinity"]["nodeAffinity"][KEY][0] == own
    assert _preferred({"spec": {"affinity": {"nodeAffinity": {
        KEY: out["spec"]["affinity"]["nodeAffinity"][KEY][1:]}}}}) == ["n1"]  # fmt: skip
    assert preferring(out, ["n1"]) == out  # not added twice
    bound = {**p, "spec": {**p["spec"], "nodeName": "n3"}}
    assert preferring(bound, ["n1"]) is bound


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ({**SNAP, "name": "s"}, ("VolumeSnapshot", "s")),
        ({"kind": "PersistentVolumeClaim", "name": "c"}, ("PersistentVolumeClaim", "c")),
        ({"kind": "VolumeSnapshot", "apiGroup": "example.com", "name": "s"}, None),
        ({"kind": "Populator", "apiGroup": "example.com", "name": "p"}, None),
        ({**SNAP, "name": "s", "namespace": "elsewhere"}, None),
        ({"kind": "PersistentVolumeClaim", "name": ""}, None),
    ],
)
def test_the_data_sources_followed(source: Obj, found: tuple[str, str] | None) -> None:
    claim_obj = {"metadata": {"namespace": "app"}, "spec": {"dataSourceRef": source}}
    assert data_source(claim_obj) == found


def test_the_parameter_takes_two_values() -> None:
    assert prefers_source({}, NORMAL) and prefers_source(None, NORMAL)
    assert prefers_source({"topolvm.io/restore-placement": "source-node"}, NORMAL)
    assert not prefers_source({"topolvm.io/restore-placement": "anywhere"}, NORMAL)
    with pytest.raises(PlacementValueError, match=r"StorageClass x: topolvm\.io/restore-placement"):
        prefers_source({"topolvm.io/restore-placement": "near"}, NORMAL, "StorageClass x")


def test_a_bad_value_in_a_snapshot_class_fails_the_snapshot_with_its_reason() -> None:
    """CreateSnapshot reads its VolumeSnapshotClass's parameters (copies.placement): a typo in
    the restore placement is an InvalidArgument there, where the VolumeSnapshot shows it."""
    with pytest.raises(PlacementError, match=r"VolumeSnapshotClass parameters: .* got 'near'"):
        placement({"topolvm.io/restore-placement": "near"}, NORMAL)
    assert not placement({"topolvm.io/restore-placement": "anywhere"}, NORMAL).off_node


async def test_a_slow_source_is_given_up_in_time_and_the_pod_goes_unpreferred(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The API server answers slowly: every lookup of the pod stops within the one budget (the
    webhook's own timeout is never reached), the pod is admitted with a warning."""
    monkeypatch.setattr(podmutate, "SOURCE_LOOKUP_SECONDS", 0.2)
    r = _reader()

    async def slow(namespace: str, name: str) -> Obj | None:
        await asyncio.sleep(30)
        return None

    r.get_volumesnapshot = slow  # type: ignore[method-assign]
    out, d = await _decided(r, "restored", "cloned")  # a lookup not given up would say nothing
    assert _preferred(out) == ["n1"]
    assert any("app/restored: its source's node is not known (not found within" in w
               for w in d.warnings)  # fmt: skip

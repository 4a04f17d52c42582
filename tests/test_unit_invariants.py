"""The chaos campaign's invariant checker (tests/invariants.py): quiet on a healthy cluster,
and each rule broken on its own is named."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.invariants import (
    ClusterView,
    DeviceClass,
    Lv,
    NodeView,
    expected_capacity,
    unaccounted_lvs,
    violations,
    volume_violations,
)

GiB = 1 << 30
THICK = DeviceClass("ssd", "vg1", spare=GiB)
THIN = DeviceClass("thin", "vg1", spare=GiB, thin_pool="pool0", ratio=5.0)
HANDLE = "6a1c2d3e-0000-4000-8000-000000000001"


def _pv(name: str, handle: str, node: str, size: str = "1Gi") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "csi": {"driver": "topolvm.io", "volumeHandle": handle},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.topolvm.io/node", "operator": "In", "values": [node]}]}]}},
        },
        "status": {"phase": "Bound"},
    }  # fmt: skip


def _lv_obj(name: str, handle: str, node: str) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"name": name, "nodeName": node, "size": "1Gi"},
            "status": {"volumeID": handle, "currentSize": "1Gi"}}  # fmt: skip


def _csc(name: str, sc: str, node: str, capacity: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "storageClassName": sc, "capacity": str(capacity),
            "nodeTopology": {"matchLabels": {"topology.topolvm.io/node": node}}}  # fmt: skip


def healthy() -> ClusterView:
    lvs = {"pool0": Lv(4 * GiB, "twi-aotz--"), HANDLE: Lv(GiB, "-wi-ao----")}
    node = NodeView("n1", {"vg1": lvs}, {"vg1": 5 * GiB})
    thick_free = 4 * GiB
    thin_free = 20 * GiB  # the pool's 4 GiB x 5; no spare for thin, as upstream reports it
    node.annotations = {"capacity.topolvm.io/ssd": str(thick_free),
                        "capacity.topolvm.io/thin": str(thin_free)}  # fmt: skip
    return ClusterView(
        nodes={"n1": node},
        classes=[THICK, THIN],
        pvs=[_pv("pvc-1", HANDLE, "n1")],
        logical_volumes=[_lv_obj("pvc-1", HANDLE, "n1")],
        capacities=[
            _csc("csisc-a", "fast", "n1", thick_free),
            _csc("csisc-b", "thin-sc", "n1", thin_free),
        ],
        storage_classes={"fast": "ssd", "thin-sc": "thin"},
    )


def test_a_healthy_cluster_has_no_violation() -> None:
    assert violations(healthy()) == []


def test_thin_capacity_counts_every_thin_volume_and_floors_at_zero() -> None:
    view = healthy()
    node = view.nodes["n1"]
    node.lvs["vg1"]["thinvol"] = Lv(3 * GiB, "Vwi-a-tz--", pool="pool0")
    assert expected_capacity(node, THIN) == 20 * GiB - 3 * GiB
    node.lvs["vg1"]["huge"] = Lv(30 * GiB, "Vwi-a-tz--", pool="pool0")
    assert expected_capacity(node, THIN) == 0
    assert expected_capacity(NodeView("n2", {}, {}), THIN) == 0  # no pool, nothing offered


def _broken(change: str) -> ClusterView:
    view = copy.deepcopy(healthy())
    node = view.nodes["n1"]
    if change == "lv missing":
        del node.lvs["vg1"][HANDLE]
    elif change == "lv too small":
        node.lvs["vg1"][HANDLE] = Lv(GiB // 2, "-wi-a-----")
    elif change == "lv on two nodes":
        view.nodes["n2"] = NodeView("n2", {"vg1": {HANDLE: Lv(GiB, "-wi-a-----")}},
                                    {"vg1": 0}, dict(node.annotations))  # fmt: skip
    elif change == "orphan lv":
        node.lvs["vg1"]["leftover"] = Lv(GiB, "-wi-a-----")
    elif change == "lv object without status":
        del view.logical_volumes[0]["status"]
    elif change == "lv object deleting":
        view.logical_volumes[0]["metadata"]["deletionTimestamp"] = "2026-11-25T00:00:00Z"
    elif change == "duplicate lv objects":
        view.logical_volumes.append(_lv_obj("pvc-1", "other", "n1"))
        view.logical_volumes[-1]["metadata"]["name"] = "pvc-1-again"
    elif change == "duplicate pv":
        view.pvs.append(_pv("pvc-2", HANDLE, "n1"))
    elif change == "annotation stale":
        node.annotations["capacity.topolvm.io/ssd"] = str(5 * GiB)
    elif change == "annotation missing":
        del node.annotations["capacity.topolvm.io/thin"]
    elif change == "capacity stale":
        view.capacities[0]["capacity"] = "1Gi"
    elif change == "capacity missing":
        del view.capacities[1]
    return view


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("lv missing", "Bound PV pvc-1 has 0 LVs named"),
        ("lv too small", "less than the PV's 1073741824"),
        ("lv on two nodes", "has 2 LVs named"),
        ("orphan lv", "LV vg1/leftover on n1 has no LogicalVolume"),
        ("lv object without status", "LogicalVolume pvc-1 on n1 has no LV"),
        ("lv object deleting", "LogicalVolume pvc-1 still being deleted"),
        ("duplicate lv objects", "2 LogicalVolumes for volume pvc-1"),
        ("duplicate pv", f"2 PVs share volume {HANDLE}"),
        ("annotation stale", "Node n1 advertises 5368709120 bytes for ssd; LVM says 4294967296"),
        ("annotation missing", "Node n1 has no capacity.topolvm.io/thin annotation"),
        ("capacity stale", "CSIStorageCapacity csisc-a (fast on n1) says 1073741824 bytes"),
        ("capacity missing", "no CSIStorageCapacity for thin-sc on n1"),
    ],
)
def test_each_broken_rule_is_named(change: str, expected: str) -> None:
    found = violations(_broken(change))
    assert any(expected in v for v in found), found


def test_pvs_of_other_drivers_and_other_nodes_are_left_alone() -> None:
    view = healthy()
    foreign = _pv("pvc-x", "x", "n1")
    foreign["spec"]["csi"]["driver"] = "other.csi.example.com"
    elsewhere = _pv("pvc-y", "y", "not-checked")
    released = _pv("pvc-z", "z", "n1")
    released["status"]["phase"] = "Released"
    view.pvs += [foreign, elsewhere, released]
    view.capacities.append(_csc("csisc-c", "someone-elses", "n1", 1))
    assert violations(view) == []


SOURCE_UID, TARGET_UID = (
    "0a1c2d3e-0000-4000-8000-00000000000a",
    "0b1c2d3e-0000-4000-8000-00000000000b",
)


def _copying(round_: int = 1, done_round: int = 0, keep: bool = True, **meta: Any) -> ClusterView:
    """n1 holds the source pvc-1; n2 the target of a copy from it (a move's with ``keep``),
    whose copy reported Done for ``done_round`` (0: not yet)."""
    view = healthy()
    view.logical_volumes[0]["metadata"]["uid"] = SOURCE_UID
    target = _lv_obj("move-1", TARGET_UID, "n2")
    target["metadata"].update(uid=TARGET_UID, **meta)
    target["spec"]["copy"] = {"source": "pvc-1", "round": round_, "keepCut": keep}
    if done_round:
        target["status"]["copy"] = {"phase": "Done", "round": done_round}
    view.logical_volumes.append(target)
    view.nodes["n2"] = NodeView("n2", {"vg1": {TARGET_UID: Lv(GiB, "-wi-a-----")}}, {})
    return view


def _with_cuts(view: ClusterView, *jobs: str) -> list[str]:
    for job in jobs:
        view.nodes["n1"].lvs["vg1"][f"cut.{job}"] = Lv(GiB, "swi-a-s---")
    return unaccounted_lvs(view)


@pytest.mark.parametrize(
    ("state", "jobs"),
    [
        ({}, [TARGET_UID]),  # a pre-copy running
        ({"done_round": 1}, [TARGET_UID]),  # a move's first cut, kept for its final copy
        ({"round_": 2, "done_round": 1}, [TARGET_UID, f"{TARGET_UID}.r2"]),  # the final copy
        ({"keep": False}, [TARGET_UID]),  # a clone's copy running
    ],
)
def test_the_cuts_of_copies_still_running_are_accounted_for(
    state: dict[str, Any], jobs: list[str]
) -> None:
    assert _with_cuts(_copying(**state), *jobs) == []


@pytest.mark.parametrize(
    ("state", "job"),
    [
        ({"round_": 2, "done_round": 2}, TARGET_UID),  # the move's final copy is done
        ({"round_": 2, "done_round": 2}, f"{TARGET_UID}.r2"),
        ({"done_round": 1, "keep": False}, TARGET_UID),  # a clone filled
        ({"deletionTimestamp": "2026-12-01T00:00:00Z"}, TARGET_UID),  # rolled back
        ({"done_round": 1}, f"{TARGET_UID}.r2"),  # no final copy asked yet
        ({}, "0c1c2d3e-0000-4000-8000-00000000000c"),  # no such target
    ],
)
def test_a_cut_whose_copy_ended_is_named(state: dict[str, Any], job: str) -> None:
    found = _with_cuts(_copying(**state), job)
    assert found == [f"LV vg1/cut.{job} on n1 has no LogicalVolume ({GiB} bytes; not a cut of "
                     "a copy still running)"]  # fmt: skip


def test_a_cut_on_another_node_than_the_copys_source_is_named() -> None:
    view = _copying()
    view.nodes["n2"].lvs["vg1"][f"cut.{TARGET_UID}"] = Lv(GiB, "swi-a-s---")
    assert unaccounted_lvs(view) == [
        f"LV vg1/cut.{TARGET_UID} on n2 has no LogicalVolume ({GiB} bytes; not a cut of a copy "
        "still running)"
    ]


def test_a_verification_cut_counts_until_its_digest_is_reported() -> None:
    view = healthy()
    view.logical_volumes[0]["metadata"]["uid"] = SOURCE_UID
    view.logical_volumes[0]["spec"]["verify"] = {"id": "v1"}
    view.nodes["n1"].lvs["vg1"][f"verify.{SOURCE_UID}"] = Lv(GiB, "swi-a-s---")
    assert unaccounted_lvs(view) == []
    view.logical_volumes[0]["status"]["verify"] = {"id": "v1", "phase": "Done"}
    assert len(unaccounted_lvs(view)) == 1


def test_an_lv_its_node_creates_counts_by_the_logical_volumes_uid() -> None:
    view = healthy()
    view.logical_volumes[0]["metadata"]["uid"] = SOURCE_UID
    del view.logical_volumes[0]["status"]
    del view.nodes["n1"].lvs["vg1"][HANDLE]
    view.nodes["n1"].lvs["vg1"][SOURCE_UID] = Lv(GiB, "-wi-a-----")
    assert unaccounted_lvs(view) == []
    assert volume_violations(view) == [
        "LogicalVolume pvc-1 on n1 has no LV (status.volumeID unset)"
    ]

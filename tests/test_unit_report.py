"""Parsing LVM JSON reports (spec §4.3) with a ``fullreport`` recorded on real LVM."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from topolvm.lvm.errors import ReportError
from topolvm.lvm.report import (
    LvRecord,
    Report,
    lv_uuid_of_dm,
    parse_report,
    with_lv,
    with_vg_free,
    without_lv,
)

GiB = 1 << 30
MiB = 1 << 20
VG_SIZE = 17175674880
VG_FREE = 11685330944


def load_fullreport() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(
        (Path(__file__).parent / "data" / "fullreport.json").read_text()
    )
    return doc


@pytest.fixture
def doc() -> dict[str, Any]:
    return load_fullreport()


@pytest.fixture
def report(doc: dict[str, Any]) -> Report:
    return parse_report(doc)


def lv(report: Report, name: str) -> LvRecord:
    found = report.find_lv("myvg1", name)
    assert found is not None, name
    return found


def test_volume_group(report: Report) -> None:
    assert list(report.vgs) == ["myvg1"]
    vg = report.vgs["myvg1"]
    assert vg.name == "myvg1"
    assert vg.uuid == "0tOXUC-grKg-dakS-7Kgw-z7XH-31s4-wafIft"
    assert vg.size == VG_SIZE
    assert vg.free == VG_FREE
    assert vg.extent_size == 4 * MiB


def test_all_logical_volumes_in_report_order(report: Report) -> None:
    names = [x.name for x in report.lvs_of("myvg1")]
    assert names == ["cowsnap", "inactive1", "snap1", "thick1", "thin1", "thinpool"]
    assert len(names) == 6
    assert all(x.vg_name == "myvg1" for x in report.lvs_of("myvg1"))
    assert report.lvs_of("othervg") == ()


def test_thin_pool(report: Report) -> None:
    pool = lv(report, "thinpool")
    assert pool.is_thin_pool
    assert not pool.is_thin_volume
    assert pool.attr == "twi-aotz--"
    assert pool.size == 4 * GiB
    assert pool.data_percent == 0.0
    assert pool.metadata_percent == pytest.approx(11.33)
    assert isinstance(pool.data_percent, float)
    assert isinstance(pool.metadata_percent, float)
    assert pool.path == ""


@pytest.mark.parametrize(
    ("name", "origin"), [("thin1", ""), ("snap1", "thin1")], ids=["volume", "snapshot"]
)
def test_thin_volumes(report: Report, name: str, origin: str) -> None:
    volume = lv(report, name)
    assert volume.is_thin_volume
    assert not volume.is_thin_pool
    assert volume.pool_lv == "thinpool"
    assert volume.origin == origin
    assert volume.size == 10 * GiB  # virtual size, not pool usage
    assert volume.path == f"/dev/myvg1/{name}"
    assert volume.full_name == f"myvg1/{name}"


@pytest.mark.parametrize("name", ["cowsnap", "inactive1", "thick1"])
def test_thick_volumes_are_neither_pool_nor_thin(report: Report, name: str) -> None:
    volume = lv(report, name)
    assert not volume.is_thin_pool
    assert not volume.is_thin_volume
    assert volume.pool_lv == ""


def test_thick_volume_fields(report: Report) -> None:
    thick = lv(report, "thick1")
    assert thick.uuid == "zA3U0z-Jxt4-kEZL-C9d5-bKd5-NGZ9-ZF8cWv"
    assert thick.size == GiB
    assert (thick.major, thick.minor) == (254, 3)
    assert thick.tags == ("bar", "foo")
    assert thick.attr == "owi-a-s---"
    assert thick.data_percent is None
    assert thick.metadata_percent is None


@pytest.mark.parametrize("name", ["cowsnap", "inactive1", "snap1", "thin1", "thinpool"])
def test_untagged_volume_has_one_empty_tag(report: Report, name: str) -> None:
    assert lv(report, name).tags == ("",)


def test_inactive_volume_has_device_numbers_zero(report: Report) -> None:
    inactive = lv(report, "inactive1")
    assert (inactive.major, inactive.minor) == (0, 0)
    assert inactive.size == 8 * MiB
    assert inactive.attr == "-wi-------"


def test_classic_snapshot_size_is_origin_size(report: Report) -> None:
    cow = lv(report, "cowsnap")
    assert cow.origin == "thick1"
    assert cow.size == 1073741824  # origin_size, not the 100 MiB COW area
    assert (cow.major, cow.minor) == (254, 9)


def test_thin_snapshot_size_is_its_own_size(doc: dict[str, Any]) -> None:
    # origin_size must only replace lv_size for non-thin snapshots.
    for row in doc["report"][0]["lv"]:
        if row["lv_name"] == "snap1":
            row["origin_size"] = "1234"
    assert lv(parse_report(doc), "snap1").size == 10 * GiB


@pytest.mark.parametrize("value", ["-1", "", "x"])
def test_unparsable_device_numbers_become_zero(doc: dict[str, Any], value: str) -> None:
    row = doc["report"][0]["lv"][3]
    assert row["lv_name"] == "thick1"
    row["lv_kernel_major"] = value
    row["lv_kernel_minor"] = value
    thick = lv(parse_report(doc), "thick1")
    assert (thick.major, thick.minor) == (0, 0)


def test_vgs_style_report_without_lv_section() -> None:
    doc = {
        "report": [
            {"vg": [{"vg_name": "a", "vg_uuid": "u", "vg_size": "8", "vg_free": "4"}]},
        ]
    }
    report = parse_report(doc)
    assert report.vgs["a"].size == 8
    assert report.vgs["a"].free == 4
    assert report.lvs_of("a") == ()


def test_empty_report() -> None:
    report = parse_report({"report": []})
    assert dict(report.vgs) == {}
    assert dict(report.lvs) == {}


# --- malformed documents -----------------------------------------------------------------------


def _break_vg_size(doc: dict[str, Any]) -> None:
    doc["report"][0]["vg"][0]["vg_size"] = "17G"


def _negative_vg_free(doc: dict[str, Any]) -> None:
    doc["report"][0]["vg"][0]["vg_free"] = "-4096"


def _numeric_vg_size(doc: dict[str, Any]) -> None:
    doc["report"][0]["vg"][0]["vg_size"] = 17175674880


def _break_lv_size(doc: dict[str, Any]) -> None:
    doc["report"][0]["lv"][0]["lv_size"] = "1.5"


def _break_percent(doc: dict[str, Any]) -> None:
    doc["report"][0]["lv"][5]["data_percent"] = "n/a"


def _lv_section_object(doc: dict[str, Any]) -> None:
    doc["report"][0]["lv"] = doc["report"][0]["lv"][0]


def _vg_section_string(doc: dict[str, Any]) -> None:
    doc["report"][0]["vg"] = "myvg1"


def _lv_row_not_object(doc: dict[str, Any]) -> None:
    doc["report"][0]["lv"].append(["not", "a", "row"])


def _no_report_key(doc: dict[str, Any]) -> None:
    doc["reports"] = doc.pop("report")


def _report_not_list(doc: dict[str, Any]) -> None:
    doc["report"] = doc["report"][0]


def _section_not_object(doc: dict[str, Any]) -> None:
    doc["report"].append("vg")


@pytest.mark.parametrize(
    "corrupt",
    [
        _break_vg_size,
        _negative_vg_free,
        _numeric_vg_size,
        _break_lv_size,
        _break_percent,
        _lv_section_object,
        _vg_section_string,
        _lv_row_not_object,
        _no_report_key,
        _report_not_list,
        _section_not_object,
    ],
)
def test_malformed_report_raises_report_error(doc: dict[str, Any], corrupt: Any) -> None:
    corrupt(doc)
    with pytest.raises(ReportError):
        parse_report(doc)


def test_report_error_names_the_field(doc: dict[str, Any]) -> None:
    _break_vg_size(doc)
    with pytest.raises(ReportError, match=r"vg_size.*'17G'"):
        parse_report(doc)


def test_empty_document_raises_report_error() -> None:
    with pytest.raises(ReportError):
        parse_report({})


# --- copy-on-write updates ---------------------------------------------------------------------


def _snapshot(report: Report) -> tuple[dict[str, Any], dict[str, Any]]:
    return dict(report.vgs), {k: tuple(v) for k, v in report.lvs.items()}


def test_with_lv_adds_without_mutating(report: Report) -> None:
    before = _snapshot(report)
    new = LvRecord(
        name="new1",
        vg_name="myvg1",
        uuid="u",
        path="/dev/myvg1/new1",
        size=GiB,
        major=254,
        minor=20,
        origin="",
        pool_lv="",
        tags=("",),
        attr="-wi-a-----",
    )
    updated = with_lv(report, new)
    assert updated is not report
    assert updated.find_lv("myvg1", "new1") == new
    assert [x.name for x in updated.lvs_of("myvg1")][-1] == "new1"
    assert len(updated.lvs_of("myvg1")) == 7
    assert report.find_lv("myvg1", "new1") is None
    assert _snapshot(report) == before


def test_with_lv_replaces_same_name(report: Report) -> None:
    before = _snapshot(report)
    old = lv(report, "thick1")
    grown = dataclasses.replace(old, size=2 * GiB)
    updated = with_lv(report, grown)
    assert lv(updated, "thick1").size == 2 * GiB
    assert [x.name for x in updated.lvs_of("myvg1")].count("thick1") == 1
    assert len(updated.lvs_of("myvg1")) == 6
    assert lv(report, "thick1").size == GiB
    assert _snapshot(report) == before


def test_with_lv_in_new_vg(report: Report) -> None:
    other = dataclasses.replace(lv(report, "thick1"), vg_name="vg2")
    updated = with_lv(report, other)
    assert [x.name for x in updated.lvs_of("vg2")] == ["thick1"]
    assert report.lvs_of("vg2") == ()


def test_without_lv_removes_without_mutating(report: Report) -> None:
    before = _snapshot(report)
    updated = without_lv(report, "myvg1", "thin1")
    assert updated.find_lv("myvg1", "thin1") is None
    assert len(updated.lvs_of("myvg1")) == 5
    assert report.find_lv("myvg1", "thin1") is not None
    assert _snapshot(report) == before


def test_without_missing_lv_keeps_the_rest(report: Report) -> None:
    updated = without_lv(report, "myvg1", "nope")
    assert updated.lvs_of("myvg1") == report.lvs_of("myvg1")


def test_with_vg_free_without_mutating(report: Report) -> None:
    before = _snapshot(report)
    updated = with_vg_free(report, "myvg1", VG_FREE - GiB)
    assert updated.vgs["myvg1"].free == VG_FREE - GiB
    assert updated.vgs["myvg1"].size == VG_SIZE
    assert updated.vgs["myvg1"].extent_size == 4 * MiB
    assert updated.lvs_of("myvg1") == report.lvs_of("myvg1")
    assert report.vgs["myvg1"].free == VG_FREE
    assert _snapshot(report) == before


@pytest.mark.parametrize(("free", "expected"), [(-1, 0), (VG_SIZE + 1, VG_SIZE), (0, 0)])
def test_with_vg_free_is_clamped_to_the_vg(report: Report, free: int, expected: int) -> None:
    assert with_vg_free(report, "myvg1", free).vgs["myvg1"].free == expected


def test_a_thin_volumes_device_id_comes_from_its_segment(doc: dict[str, Any]) -> None:
    """fullreport's seg subreport gives each thin volume's device id (thin_dump's --dev-id),
    so a thin delta asks no ``lvs`` per volume; an LV without one (thick, or a report without
    segments) has none."""
    section = doc["report"][0]
    uuids = {row["lv_name"]: row["lv_uuid"] for row in section["lv"]}
    section["seg"] = [
        {"lv_uuid": uuids["thin1"], "thin_id": "1"},
        {"lv_uuid": uuids["snap1"], "thin_id": "7"},
        {"lv_uuid": uuids["thick1"], "thin_id": ""},
        {"lv_uuid": uuids["thinpool"], "thin_id": ""},
    ]
    report = parse_report(doc)
    assert (lv(report, "thin1").thin_id, lv(report, "snap1").thin_id) == (1, 7)
    assert lv(report, "thick1").thin_id is None and lv(report, "thinpool").thin_id is None
    assert lv(parse_report(load_fullreport()), "thin1").thin_id is None
    section["seg"][0]["thin_id"] = "x"
    with pytest.raises(ReportError):
        parse_report(doc)


def test_an_lvs_uuid_is_read_from_its_device_mapper_uuid() -> None:
    """lvmd describes an LV it just made without a report: the LV's uuid is the second half of
    its device's dm uuid, in LVM's dashed form; a layer's device, or another target's, has none."""
    vg, lv = "Ab3dEf" + "g" * 26, "UYpabtcsANWW3E3c64JyluNnoc31Hof7"
    assert lv_uuid_of_dm(f"LVM-{vg}{lv}\n") == "UYpabt-csAN-WW3E-3c64-Jylu-Nnoc-31Hof7"
    assert lv_uuid_of_dm(f"LVM-{vg}{lv}-real") is None  # a COW origin's layer
    assert lv_uuid_of_dm(f"LVM-{vg}{lv}-cow") is None
    assert lv_uuid_of_dm(f"CRYPT-LUKS2-{lv}") is None
    assert lv_uuid_of_dm("") is None

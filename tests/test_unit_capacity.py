"""Capacity math (spec §2.3 Watch/GetFreeBytes, §3.2, §3.3) on a report recorded on real LVM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from topolvm.config.lvmd import DeviceClass, LvmdConfig, lvmd_config
from topolvm.lvm.report import Report, parse_report, with_vg_free
from topolvm.lvmd.capacity import (
    Capacity,
    ClassCapacity,
    Pool,
    PoolMissing,
    ThinPoolUsage,
    capacity,
    find_pool,
    overprovisioned_free,
)

GiB = 1 << 30
VG_SIZE = 17175674880
VG_FREE = 11685330944
POOL_SIZE = 4 * GiB
THIN_USED = 20 * GiB  # thin1 + snap1, 10 GiB virtual size each


@pytest.fixture
def report() -> Report:
    doc: dict[str, Any] = json.loads(
        (Path(__file__).parent / "data" / "fullreport.json").read_text()
    )
    return parse_report(doc)


def config(*classes: dict[str, Any]) -> LvmdConfig:
    return lvmd_config({"device-classes": list(classes)})


def thick(
    name: str = "ssd", vg: str = "myvg1", *, default: bool = False, spare: int | None = None
) -> dict[str, Any]:
    dc: dict[str, Any] = {"name": name, "volume-group": vg, "default": default}
    if spare is not None:
        dc["spare-gb"] = spare
    return dc


def thin(
    name: str = "ssd-thin",
    vg: str = "myvg1",
    pool: str = "thinpool",
    ratio: float = 10.0,
    *,
    default: bool = False,
    spare: int | None = None,
) -> dict[str, Any]:
    dc = thick(name, vg, default=default, spare=spare)
    dc["type"] = "thin"
    dc["thin-pool"] = {"name": pool, "overprovision-ratio": ratio}
    return dc


def only(cfg: LvmdConfig) -> DeviceClass:
    (dc,) = cfg.device_classes
    return dc


# --- thick pools -------------------------------------------------------------------------------


def test_thick_pool_free_is_raw_vg_free(report: Report) -> None:
    pool = find_pool(report, only(config(thick())))
    assert pool.thin_pool is None
    assert pool.vg.name == "myvg1"
    assert pool.free(report) == VG_FREE


@pytest.mark.parametrize(
    ("spare", "expected"),
    [
        (None, VG_FREE - 10 * GiB),  # default spare-gb is 10
        (10, VG_FREE - 10 * GiB),
        (0, VG_FREE),
        (5, VG_FREE - 5 * GiB),
        (11, 0),  # 11 GiB > 10.88 GiB free: floored at 0
        (1000, 0),
    ],
)
def test_thick_free_minus_spare(report: Report, spare: int | None, expected: int) -> None:
    pool = find_pool(report, only(config(thick(spare=spare))))
    assert pool.free_minus_spare(report) == expected
    assert pool.free(report) == VG_FREE  # admission never subtracts the spare


def test_thick_free_follows_the_report(report: Report) -> None:
    dc = only(config(thick(spare=0)))
    smaller = with_vg_free(report, "myvg1", GiB)
    assert find_pool(smaller, dc).free(smaller) == GiB


def test_thick_pool_lvs_exclude_thin_pool_and_thin_volumes(report: Report) -> None:
    pool = find_pool(report, only(config(thick())))
    assert [lv.name for lv in pool.lvs(report)] == ["cowsnap", "inactive1", "thick1"]


# --- thin pools --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [
        (10.0, 10 * POOL_SIZE - THIN_USED),
        (1.0, 0),  # 4 GiB virtual < 20 GiB used: floored at 0
        (5.0, 0),  # virtual == used
        (5.5, POOL_SIZE * 11 // 2 - THIN_USED),
        (7.3, int(7.3 * POOL_SIZE) - THIN_USED),
    ],
)
def test_thin_overprovisioned_free(report: Report, ratio: float, expected: int) -> None:
    pool = find_pool(report, only(config(thin(ratio=ratio))))
    assert pool.thin_pool is not None
    assert pool.thin_pool.name == "thinpool"
    assert pool.free(report) == expected


def test_thin_free_ignores_vg_free_and_data_usage(report: Report) -> None:
    dc = only(config(thin(ratio=10.0)))
    full = with_vg_free(report, "myvg1", 0)
    assert find_pool(full, dc).free(full) == 10 * POOL_SIZE - THIN_USED


@pytest.mark.parametrize(
    ("ratio", "spare", "expected"),
    [
        (10.0, None, 10 * POOL_SIZE - THIN_USED - 10 * GiB),
        (10.0, 0, 10 * POOL_SIZE - THIN_USED),
        (10.0, 20, 0),
        (1.0, 0, 0),
    ],
)
def test_thin_free_minus_spare(
    report: Report, ratio: float, spare: int | None, expected: int
) -> None:
    pool = find_pool(report, only(config(thin(ratio=ratio, spare=spare))))
    assert pool.free_minus_spare(report) == expected


def test_thin_pool_lvs_are_the_pool_thin_volumes(report: Report) -> None:
    pool = find_pool(report, only(config(thin())))
    assert [lv.name for lv in pool.lvs(report)] == ["snap1", "thin1"]


@pytest.mark.parametrize(
    ("pool_size", "ratio", "used", "expected"),
    [
        (100, 1.0, 0, 100),
        (100, 1.5, 50, 100),
        (100, 1.0, 100, 0),
        (100, 1.0, 150, 0),
        (3, 1.5, 0, 4),
    ],
)
def test_overprovisioned_free_formula(
    pool_size: int, ratio: float, used: int, expected: int
) -> None:
    assert overprovisioned_free(pool_size, ratio, used) == expected


# --- missing VG / pool -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dc", "names"),
    [
        (thick(vg="nosuchvg"), ["nosuchvg", "ssd"]),
        (thin(vg="nosuchvg"), ["nosuchvg", "ssd-thin"]),
        (thin(pool="nosuchpool"), ["nosuchpool", "ssd-thin"]),
        (thin(pool="thick1"), ["thick1"]),  # exists, but is not a thin pool
        (thin(pool="thin1"), ["thin1"]),  # a thin volume, not a pool
    ],
)
def test_find_pool_missing(report: Report, dc: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(PoolMissing) as info:
        find_pool(report, only(config(dc)))
    for name in names:
        assert name in str(info.value)


# --- Watch content -----------------------------------------------------------------------------


def thin_item(name: str, ratio_free: int) -> ClassCapacity:
    usage = ThinPoolUsage(
        data_percent=0.0,
        metadata_percent=11.33,
        overprovision_bytes=ratio_free,
        size_bytes=POOL_SIZE,
    )
    return ClassCapacity(name, VG_FREE, VG_SIZE, usage)


def test_capacity_of_spec_example(report: Report) -> None:
    cfg = config(thick(default=True, spare=10), thin())
    result = capacity(report, cfg)
    # Thin pool items of a VG come before its thick item.
    assert result == Capacity(
        free_bytes=VG_FREE - 10 * GiB,
        items=(
            thin_item("ssd-thin", 10 * POOL_SIZE - THIN_USED),
            ClassCapacity("ssd", VG_FREE - 10 * GiB, VG_SIZE, None),
        ),
    )


def test_capacity_thin_default(report: Report) -> None:
    cfg = config(thick(), thin(default=True))
    result = capacity(report, cfg)
    assert result.free_bytes == 10 * POOL_SIZE - THIN_USED
    assert [i.device_class for i in result.items] == ["ssd-thin", "ssd"]


def test_capacity_thin_item_ignores_spare(report: Report) -> None:
    cfg = config(thin(default=True, ratio=10.0, spare=15))
    result = capacity(report, cfg)
    over = 10 * POOL_SIZE - THIN_USED
    assert result == Capacity(free_bytes=over, items=(thin_item("ssd-thin", over),))
    (item,) = result.items
    assert item.free_bytes == VG_FREE  # raw VG free, no spare
    assert item.size_bytes == VG_SIZE
    assert item.thin_pool is not None
    assert item.thin_pool.overprovision_bytes == over  # no spare either
    assert item.thin_pool.metadata_percent == pytest.approx(11.33)


@pytest.mark.parametrize(("spare", "expected"), [(0, VG_FREE), (10, VG_FREE - 10 * GiB), (11, 0)])
def test_capacity_thick_item_subtracts_spare(report: Report, spare: int, expected: int) -> None:
    result = capacity(report, config(thick(default=True, spare=spare)))
    assert result == Capacity(expected, (ClassCapacity("ssd", expected, VG_SIZE, None),))


def test_capacity_without_default_class_reports_zero(report: Report) -> None:
    result = capacity(report, config(thick(spare=0), thin()))
    assert result.free_bytes == 0
    assert [i.device_class for i in result.items] == ["ssd-thin", "ssd"]


def test_capacity_skips_classes_whose_vg_or_pool_is_missing(report: Report) -> None:
    cfg = config(
        thick("gone", vg="othervg", default=True),
        thin("gone-thin", vg="othervg", pool="thinpool"),
        thin("no-pool", pool="otherpool"),
        thin("not-a-pool", pool="thick1"),
    )
    assert capacity(report, cfg) == Capacity(free_bytes=0, items=())


def test_capacity_skips_vgs_without_class(report: Report) -> None:
    cfg = config(thick("other", vg="othervg"), thin(ratio=2.0))
    result = capacity(report, cfg)
    assert [i.device_class for i in result.items] == ["ssd-thin"]
    assert result.items[0].thin_pool is not None
    assert result.items[0].thin_pool.overprovision_bytes == 0  # 8 GiB virtual < 20 GiB used


def test_capacity_matches_pool_free(report: Report) -> None:
    # The number shown to the scheduler equals what GetFreeBytes/CreateLV compute for thin.
    cfg = config(thin(default=True, ratio=7.3))
    pool = find_pool(report, only(cfg))
    assert capacity(report, cfg).free_bytes == pool.free(report)


def test_pool_is_a_value(report: Report) -> None:
    dc = only(config(thick()))
    assert find_pool(report, dc) == Pool(dc, report.vgs["myvg1"], None)

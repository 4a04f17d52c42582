"""Helpers for the lvmd tests against real LVM inside UML (tests/test_lvmd_lvm_*.py): what
LVM itself reports, and lvmd on a fresh VG with the thick or the thick and thin device classes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.lvm_fixtures import THICK, THIN, LvmdClient, VolumeGroups, lvm

MiB = 1 << 20


def lv_report(vg: str) -> dict[str, dict[str, str]]:
    out = lvm(
        "lvs", vg, "--reportformat", "json", "--units", "b", "--nosuffix",
        "-o", "lv_name,lv_size,lv_attr,lv_tags,stripes,pool_lv,origin",
        "-o", "+lv_kernel_major,lv_kernel_minor",
    )  # fmt: skip
    rows = json.loads(out)["report"][0]["lv"]
    return {r["lv_name"]: r for r in rows}


def vg_free(vg: str) -> int:
    out = lvm("vgs", vg, "--reportformat", "json", "--units", "b", "--nosuffix", "-o", "vg_free")
    return int(json.loads(out)["report"][0]["vg"][0]["vg_free"])


@pytest.fixture
async def thick(vgs: VolumeGroups, lvmd_factory: Any) -> LvmdClient:
    vgs.create("vg1", size_gib=8)
    client: LvmdClient = await lvmd_factory([THICK])
    return client


@pytest.fixture
async def both(vgs: VolumeGroups, lvmd_factory: Any) -> LvmdClient:
    vgs.create("vg1", size_gib=8)
    vgs.thin_pool("vg1", "pool0", 2)
    client: LvmdClient = await lvmd_factory([THICK, THIN])
    return client

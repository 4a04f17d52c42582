"""The real-LVM tier itself: tests marked uml really run inside User-Mode Linux."""

from __future__ import annotations

import os
import platform

import pytest

from tests.lvm_fixtures import VolumeGroups, lvm


@pytest.mark.uml
def test_runs_inside_uml_with_device_mapper(vgs: VolumeGroups) -> None:
    assert platform.release().endswith("") and os.environ["TOPOLVM_IN_UML"] == "1"
    assert os.path.exists("/dev/mapper/control"), "device-mapper is not available"
    vgs.create("tiervg", size_gib=2)
    lvm("lvcreate", "-n", "probe", "-L", "8m", "tiervg")
    assert os.path.exists("/dev/tiervg/probe")
    assert "probe" in lvm("lvs", "--noheadings", "-o", "lv_name", "tiervg")

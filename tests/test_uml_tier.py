"""The real-LVM tier itself: tests marked uml really run inside User-Mode Linux."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from devtools import umlkernel
from tests.lvm_fixtures import VolumeGroups, lvm


@pytest.mark.uml
def test_runs_inside_uml_with_device_mapper(vgs: VolumeGroups) -> None:
    assert os.environ["TOPOLVM_IN_UML"] == "1"
    # The test bed's own kernel (devtools.umlkernel), not the host's nor Debian's linux.uml.
    assert platform.release() == umlkernel.built_release(Path(os.environ["TOPOLVM_UML_KERNEL"]))
    assert "topolvm@testbed" in Path("/proc/version").read_text()
    assert os.path.exists("/dev/mapper/control"), "device-mapper is not available"
    vgs.create("tiervg", size_gib=2)
    lvm("lvcreate", "-n", "probe", "-L", "8m", "tiervg")
    assert os.path.exists("/dev/tiervg/probe")
    assert "probe" in lvm("lvs", "--noheadings", "-o", "lv_name", "tiervg")

"""When the UML guest stops making progress, the real-LVM tier kills it, says so, and boots
once more for the tests without a result (see tests/uml_tier.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

HANGS_ONCE = """
import os, time
from pathlib import Path
import pytest

pytestmark = pytest.mark.uml

def test_before():
    pass

def test_hangs_the_first_time():
    marker = Path(MARKER)
    if not marker.exists():
        marker.write_text("hung once")
        time.sleep(3600)

def test_after():
    pass
"""


def test_a_stalled_guest_is_killed_and_the_rest_rerun(tmp_path: Path) -> None:
    # Under tests/, so that tests/conftest.py applies there and in the guest, with node ids the
    # same on both sides.
    folder = REPO / "tests" / f"stall_{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    test_file = folder / "test_hangs_once.py"
    test_file.write_text(f"MARKER = {str(tmp_path / 'marker')!r}\n" + HANGS_ONCE)
    env = {**os.environ, "TOPOLVM_UML_STALL_SECONDS": "15"}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
             f"--basetemp={tmp_path / 'inner'}", str(test_file.relative_to(REPO))],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    finally:
        shutil.rmtree(folder)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "WARNING: the UML guest made no progress for 15s during" in out
    assert "test_hangs_the_first_time" in out.split("WARNING:", 1)[1].splitlines()[0]
    assert "booting User-Mode Linux for 2 real-LVM tests" in out  # the stuck one and the next
    assert "3 passed" in out

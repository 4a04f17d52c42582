"""How the test bed tells that a UML guest failed to boot (devtools.uml), on console files and
processes made here; tests/test_cluster_uml_guest.py boots real guests that panic."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools import uml

PANIC = """\
python[1]: segfault at 0 ip 0000000040761ad8 sp 0000007f7fd943b8 error 4 in libc.so.6
Kernel panic - not syncing: Attempted to kill init! exitcode=0x0000000b
CPU: 0 UID: 0 PID: 1 Comm: python Not tainted 6.12.117-topolvm #1
"""


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_panic_lines_finds_the_panic_and_its_context() -> None:
    console = "booting\n" * 40 + PANIC + "after\n"
    found = uml.panic_lines(console)
    assert found is not None
    assert "Attempted to kill init! exitcode=0x0000000b" in found
    assert "segfault at 0" in found and "after" in found
    assert uml.panic_lines("booting\n" * 40) is None


def test_wait_ready_reports_this_boots_panic(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    console = tmp_path / "console.log"
    console.write_text(f"{uml.BOOT_MARKER}/k ---\nbooting\n{PANIC}")
    with pytest.raises(uml.UmlError, match=r"kernel panicked:(.|\n)*Attempted to kill init"):
        uml.wait_ready(sleeper, console, ready=lambda: False, timeout=30)


def test_wait_ready_ignores_an_earlier_boots_panic(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    console = tmp_path / "console.log"
    console.write_text(f"{uml.BOOT_MARKER}/k ---\n{PANIC}{uml.BOOT_MARKER}/k ---\nbooting\n")
    polls = iter([False, False, True])
    uml.wait_ready(sleeper, console, ready=lambda: next(polls), timeout=30)


def test_wait_ready_reports_an_exited_uml(tmp_path: Path) -> None:
    console = tmp_path / "console.log"
    console.write_text(f"{uml.BOOT_MARKER}/k ---\n")
    proc = subprocess.Popen(["sh", "-c", "exit 3"])
    proc.wait()
    with pytest.raises(uml.UmlError, match=r"UML exited \(3\)"):
        uml.wait_ready(proc, console, ready=lambda: False, timeout=30)


def test_wait_ready_times_out(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    console = tmp_path / "console.log"
    console.write_text(f"{uml.BOOT_MARKER}/k ---\nbooting\n")
    with pytest.raises(uml.UmlError, match=r"no answer in 0\.5s"):
        uml.wait_ready(sleeper, console, ready=lambda: False, timeout=0.5)

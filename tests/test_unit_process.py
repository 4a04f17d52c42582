"""Running commands (src/topolvm/process.py): a command past its timeout is killed, and one that
cannot be reaped at once (its output still held open, as by a process stuck in uninterruptible
I/O) does not hold its caller, who may hold lvmd's lock, for ever."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from topolvm.lvm.command import LvmRunner
from topolvm.lvm.errors import LvmTimeout
from topolvm.process import CommandTimedOut, run_captured

ENV = dict(os.environ)


async def test_a_command_past_its_timeout_is_killed_with_what_it_wrote() -> None:
    with pytest.raises(CommandTimedOut) as e:
        await run_captured(["sh", "-c", "echo started >&2; exec sleep 30"], 0.5, ENV)
    assert e.value.stderr == b"started\n" and not e.value.stuck
    assert e.value.reason == "and was killed"


async def test_a_killed_command_that_does_not_go_is_left_to_a_reaper(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The shell is killed, but a child of it, in a session of its own (out of reach of the
    # kill of the command's group), keeps its stdout open for 4 s: to the caller, the same as a
    # process that SIGKILL cannot end yet.
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="topolvm.process"):
        with pytest.raises(CommandTimedOut) as e:
            await run_captured(["sh", "-c", "setsid sleep 4 & exec sleep 30"], 0.5, ENV,
                               kill_grace=1)  # fmt: skip
        waited = time.monotonic() - started
        assert e.value.stuck == 1
        assert "had not exited 1s after SIGKILL" in e.value.reason
        assert waited < 3.5, waited  # not until the output closes
        assert "did not exit after SIGKILL" in caplog.text
        for _ in range(100):  # the reaper says when it is gone
            if "exited at last" in caplog.text:
                break
            await asyncio.sleep(0.1)
    assert "a killed command exited at last" in caplog.text


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_a_command_past_its_timeout_is_killed_with_the_children_it_forked() -> None:
    """A prefix that forks (``nsenter -p`` runs LVM as its child): the timeout's kill reaches
    the command itself, not only the process lvmd started."""
    with pytest.raises(CommandTimedOut) as e:
        await run_captured(["sh", "-c", "sleep 30 & echo $! >&2; wait"], 0.5, ENV)
    child = int(e.value.stderr)
    for _ in range(50):
        if not _alive(child):
            break
        await asyncio.sleep(0.1)
    assert not _alive(child), "the forked child outlived the timeout's kill"


async def test_lvm_says_what_timed_out() -> None:
    runner = LvmRunner(("sh", "-c", "exec sleep 30", "lvm"), timeout=0.3)
    with pytest.raises(LvmTimeout) as e:
        await runner.run("lvs")
    assert "timed out after 0.3s and was killed" in str(e.value)


def test_a_command_outlives_its_daemon_killed_with_its_process_group(tmp_path: Path) -> None:
    # A daemon (here a Python process running run_captured) SIGKILLed with its whole process
    # group while its command runs: the command runs to its end, even though it writes to the
    # dead daemon's pipe afterwards (an LVM command between the commit of a thin pool's
    # metadata and the kernel's message must not die).
    started, done = tmp_path / "started", tmp_path / "done"
    script = f"echo >{started}; sleep 1; echo to-a-dead-reader; echo >&2 too; echo >{done}"
    daemon = subprocess.Popen(
        [sys.executable, "-c",
         "import asyncio, os, sys\n"
         "from topolvm.process import run_captured\n"
         f"asyncio.run(run_captured(['sh', '-c', {script!r}], 30, dict(os.environ)))"],
        start_new_session=True,
    )  # fmt: skip
    try:
        for _ in range(200):
            if started.exists():
                break
            time.sleep(0.05)
        assert started.exists(), "the command did not start"
        os.killpg(daemon.pid, signal.SIGKILL)
        assert daemon.wait(10) == -signal.SIGKILL
        for _ in range(100):
            if done.exists():
                break
            time.sleep(0.05)
        assert done.exists(), "the command died with its daemon"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.pid, signal.SIGKILL)

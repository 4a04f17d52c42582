"""Child processes of the test bed: started with a log file, stopped for sure, their log tails
shown when they fail; and the private network namespace every test packet stays in."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CLONE_NEWNET = 0x40000000


class HarnessError(RuntimeError):
    """A component of the test bed could not start; the message names it and shows its log."""


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Child:
    """One long-running process with its output in ``log``."""

    name: str
    argv: Sequence[str]
    log: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> Child:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # signals to the process group reach its children
            )
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def failure(self, what: str) -> HarnessError:
        rc = None if self.proc is None else self.proc.poll()
        state = "is running" if rc is None else f"exited with {rc}"
        return HarnessError(
            f"{self.name}: {what} ({state}); log {self.log}, last lines:\n{tail(self.log)}"
        )

    def wait_until(self, what: str, ready: Callable[[], bool], timeout: float = 60) -> None:
        """Poll ``ready()`` until true; raise naming this component if it exits or times out."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():
                    return
            except OSError:
                pass
            if not self.running():
                raise self.failure(f"exited before {what}")
            if time.monotonic() > deadline:
                raise self.failure(f"not {what} after {timeout:.0f}s")
            time.sleep(0.2)

    def stop(self, grace: float = 10) -> None:
        """SIGTERM the process group, SIGKILL after ``grace`` seconds; always reaps."""
        proc = self.proc
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        # The group may hold children that outlived the leader.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self.proc = None


def enter_private_netns() -> None:
    """Move this process (call it while it has one thread) into a new network namespace with
    only loopback up. The namespace dies with the process: nothing can leak, and every packet
    a test sends, to 127.0.0.1 or to a UML guest's TAP link, stays inside it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise HarnessError(f"unshare(CLONE_NEWNET) failed: {os.strerror(err)} (run as root)")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)

"""Child processes of the test bed: started with a log file, stopped for sure, their log tails
shown when they fail; the private network namespace every test packet stays in; and, for a
program that must leave nothing behind (``make demo``), reaping every descendant at its end."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """``preexec_fn``: the kernel SIGKILLs the child when the process that started it dies, so a
    killed pytest (or ``devtools.cluster serve``) leaves no component running."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


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
                preexec_fn=die_with_parent,  # noqa: PLW1509 (one prctl call, no locks)
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
        if self.proc is not None:
            stop_group(self.proc, grace)
            self.proc = None


def kill_group(pgid: int) -> None:
    """SIGKILL what is left of a process group (children that outlived the leader)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def stop_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM ``proc``'s process group, SIGKILL after ``grace`` seconds; reaps ``proc``."""
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
    kill_group(proc.pid)
    proc.wait()


def http_get(url: str, timeout: float = 5) -> bytes:
    """The body at ``url`` (also of an HTTP error), or b"" when nothing answers: for health
    checks. Certificates are not checked (components with self-signed serving certificates)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as r:
            body: bytes = r.read()
            return body
    except urllib.error.HTTPError as exc:
        return exc.read()
    except (urllib.error.URLError, TimeoutError, ConnectionError):
        return b""


def enter_private_netns() -> None:
    """Move this process (call it while it has one thread) into a new network namespace with
    only loopback up. The namespace lives as long as a process in it: every child is started
    with :func:`die_with_parent`, so it dies with pytest, even a killed one. Every packet a test
    sends, to 127.0.0.1 or to a UML guest's TAP link, stays inside it."""
    if _libc.unshare(CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise HarnessError(f"unshare(CLONE_NEWNET) failed: {os.strerror(err)} (run as root)")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


def become_subreaper() -> None:
    """Orphaned descendants are re-parented to this process, not to PID 1: a UML kernel still
    exiting after its ``unshare`` parent was killed, say. :func:`reap_leftovers` waits for them."""
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def in_signal_mask(pid: int, sig: int, *masks: str) -> bool:
    """Whether ``sig`` is set in any of the signal ``masks`` of ``/proc/<pid>/status``
    (``SigPnd``, ``ShdPnd``, ``SigCgt``...); False for a process that is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in masks and int(value.split()[0], 16) & (1 << (sig - 1)):
                return True
    return False


def _dying(pid: int) -> bool:
    """Whether a SIGKILL is pending for ``pid``: killed already, only not done exiting (a UML
    guest's helper unmapping its memory, say)."""
    return in_signal_mask(pid, signal.SIGKILL, "SigPnd", "ShdPnd")


def reap_leftovers(timeout: float = 30) -> list[str]:
    """Kill and reap every child still there (call it when all is stopped), so that nothing
    outlives the caller (``make demo``); returns the names of those that were still running
    (not those already killed and still exiting)."""
    me, running = os.getpid(), []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                comm, rest = stat.read_text().rsplit(")", 1)
                fields = rest.split()
                if int(fields[1]) == me:
                    kids.append((int(stat.parent.name), comm.split("(", 1)[1], fields[0]))
        if not kids:
            break
        for pid, comm, state in kids:
            if state != "Z" and not _dying(pid):
                running.append(comm)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    return running

"""Process plumbing shared by the daemons: termination signals and running commands."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)


# How long a killed command may take to exit. One in uninterruptible sleep (I/O to a stalled disk,
# a suspended device-mapper device) cannot die until the I/O returns, maybe never: the caller gets
# its error after this, and a background task reaps the process whenever it exits.
KILL_GRACE = 10.0
_reapers: set[asyncio.Task[None]] = set()


class CommandTimedOut(Exception):
    """The command ran past its timeout and was killed; ``stderr`` is what it wrote.
    ``stuck``: it had not exited that many seconds after SIGKILL (left to a reaper), else 0."""

    def __init__(self, stderr: bytes, stuck: float = 0):
        super().__init__("timed out")
        self.stderr = stderr
        self.stuck = stuck

    @property
    def reason(self) -> str:
        if self.stuck:
            return (
                f"and had not exited {self.stuck:g}s after SIGKILL (uninterruptible I/O: "
                "a stalled disk?); it is left running"
            )
        return "and was killed"


async def _reap(done: asyncio.Future[Any], argv: Sequence[str], since: float) -> None:
    with contextlib.suppress(Exception):
        await done
    gone = asyncio.get_running_loop().time() - since
    log.warning("a killed command exited at last", extra={"argv": list(argv), "secs": gone})


async def _drain(stream: asyncio.StreamReader | None, into: bytearray) -> None:
    while stream is not None and (chunk := await stream.read(1 << 16)):
        into += chunk


def _kill(proc: asyncio.subprocess.Process, group: bool = False) -> None:
    """SIGKILL ``proc``; with ``group``, its whole process group (a command started in a
    session of its own: a prefix such as ``nsenter -p`` forks, and the command is its child)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()


async def run_captured(
    argv: Sequence[str], timeout: float, env: Mapping[str, str], kill_grace: float = KILL_GRACE
) -> tuple[int, bytes, bytes]:
    """Run ``argv`` without a shell; return (exit status, stdout, stderr).

    Past ``timeout`` the command is killed, with what it forked (its process group), as
    :class:`CommandTimedOut` says (with what it wrote to stderr), and waited for at most
    ``kill_grace`` seconds more: a caller holding a lock must not wait for ever. If the caller
    is cancelled, the command still runs to its end (within ``timeout``): LVM, mkfs, mount and
    resize are not safe to interrupt half-way. For the same reason it runs in a session of its
    own: a signal to the caller's process group (a kill of the daemon and its group, a Ctrl-C
    in its terminal) does not reach it, and a daemon killed so while LVM commits a thin pool's
    transaction leaves LVM to finish it (a container's end still takes every process in it).
    SIGPIPE stays ignored in it, as in Python: once its reader is dead, its output fails with
    EPIPE instead of killing it. ``OSError`` if it cannot be started.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
        start_new_session=True,
        restore_signals=False,
    )
    out, err = bytearray(), bytearray()
    # the command's exit and the end of its output; the waits below time out, never cancel it
    done = asyncio.gather(_drain(proc.stdout, out), _drain(proc.stderr, err), proc.wait())
    try:
        await asyncio.wait_for(asyncio.shield(done), timeout)
    except TimeoutError:
        _kill(proc, group=True)
        since = asyncio.get_running_loop().time()
        try:
            await asyncio.wait_for(asyncio.shield(done), kill_grace)
        except TimeoutError:
            log.error(
                "a command did not exit after SIGKILL; not waiting for it any longer",
                extra={"argv": list(argv), "pid": proc.pid, "grace": kill_grace},
            )
            reaper = asyncio.create_task(_reap(done, argv, since))
            _reapers.add(reaper)
            reaper.add_done_callback(_reapers.discard)
            raise CommandTimedOut(bytes(err), stuck=kill_grace) from None
        raise CommandTimedOut(bytes(err)) from None
    except asyncio.CancelledError:
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout)
        except TimeoutError:
            _kill(proc, group=True)
        raise
    return (proc.returncode if proc.returncode is not None else -1), bytes(out), bytes(err)


async def run_lines(
    argv: Sequence[str], timeout: float, env: Mapping[str, str], on_line: Callable[[bytes], None]
) -> tuple[int, bytes]:
    """Run ``argv`` without a shell, handing each line of its stdout to ``on_line`` as it
    comes (a large output is never held whole); return (exit status, stderr). Past
    ``timeout``, or when ``on_line`` raises, the command is killed (:class:`CommandTimedOut`,
    or the callback's error). For read-only tools only: a cancelled caller kills it too."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
        limit=1 << 20,
    )
    err = bytearray()

    async def lines() -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            on_line(line)

    try:
        await asyncio.wait_for(
            asyncio.gather(lines(), _drain(proc.stderr, err), proc.wait()), timeout
        )
    except TimeoutError:
        _kill(proc)
        await asyncio.wait_for(proc.wait(), KILL_GRACE)
        raise CommandTimedOut(bytes(err)) from None
    except BaseException:
        _kill(proc)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), KILL_GRACE)
        raise
    return (proc.returncode if proc.returncode is not None else -1), bytes(err)


async def until_terminated() -> None:
    """Return once SIGTERM or SIGINT arrives (daemons then shut down gracefully)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def bounded(what: str, step: Awaitable[None], timeout: float = 15.0) -> None:
    """Await a shutdown ``step`` for at most ``timeout`` seconds: one stuck part must not keep
    the process alive (Kubernetes restarts a stuck pod only once it exits)."""
    try:
        await asyncio.wait_for(step, timeout)
    except TimeoutError:
        log.error(f"shutdown: {what} did not stop within {timeout}s; going on")


async def stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds``, or less if ``stop`` is set meanwhile; True if it is set. For loops
    that stop between rounds rather than being cancelled half-way through one."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()

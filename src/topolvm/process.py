"""Process plumbing shared by the daemons: termination signals and running commands."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Mapping, Sequence

log = logging.getLogger(__name__)


class CommandTimedOut(Exception):
    """The command ran past its timeout and was killed; ``stderr`` is what it wrote."""

    def __init__(self, stderr: bytes):
        super().__init__("timed out")
        self.stderr = stderr


async def run_captured(
    argv: Sequence[str], timeout: float, env: Mapping[str, str]
) -> tuple[int, bytes, bytes]:
    """Run ``argv`` without a shell; return (exit status, stdout, stderr).

    Past ``timeout`` the command is killed (:class:`CommandTimedOut`). If the caller is
    cancelled, the command still runs to its end (within ``timeout``): LVM, mkfs, mount and
    resize are not safe to interrupt half-way. ``OSError`` if it cannot be started.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        _, err = await proc.communicate()
        raise CommandTimedOut(err) from None
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await asyncio.shield(asyncio.wait_for(proc.communicate(), timeout))
        raise
    return (proc.returncode if proc.returncode is not None else -1), out, err


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

"""Helpers for the Lease leader-election tests (emulator and real API server), and for tests
that run a second topolvm-controller next to the test bed's and pause one (SIGSTOP) as a
former leader is paused."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

from devtools.testbed.driver import DriverStack
from devtools.testbed.process import Child

MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


class Work:
    """Callbacks for electors; records who is leading and checks there is never two."""

    def __init__(self) -> None:
        self.active: set[str] = set()
        self.max_active = 0
        self.started: dict[str, asyncio.Event] = {}
        self.cancelled: dict[str, asyncio.Event] = {}

    def callback(self, who: str) -> Callable[[], Awaitable[None]]:
        self.started[who] = asyncio.Event()
        self.cancelled[who] = asyncio.Event()

        async def lead() -> None:
            self.active.add(who)
            self.max_active = max(self.max_active, len(self.active))
            self.started[who].set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled[who].set()
                raise
            finally:
                self.active.discard(who)

        return lead


async def first_leader(work: Work, a: str, b: str) -> str:
    waits = {asyncio.ensure_future(work.started[x].wait()): x for x in (a, b)}
    done, pending = await asyncio.wait(waits, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    for p in pending:
        p.cancel()
    assert done, "nobody became leader"
    return waits[done.pop()]


async def stop(*tasks: asyncio.Task[None]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class Replica:
    """A second ``topolvm controller`` process beside the test bed's (``driver``): leader
    election off in both, as a chart's two replicas with ``controller.leaderElection.enabled:
    false`` would run (which the chart now refuses), or a former leader not yet stopped. Its
    own CSI socket, health and metrics ports; no sidecars talk to it. Start it on the event
    loop's thread (the process dies with the thread that started it)."""

    def __init__(self, driver: DriverStack, workdir: Path, port: int = 18280) -> None:
        self.stack = DriverStack(driver.cp, driver.bins, workdir, legacy=driver.legacy,
                                 controller_args=driver.controller_args, metrics_port=port,
                                 health_port=port + 1)  # fmt: skip

    @property
    def child(self) -> Child | None:
        return self.stack.children.get("topolvm-controller")

    def start(self) -> None:
        if self.child is None:
            self.stack.workdir.mkdir(parents=True, exist_ok=True)
            self.stack.start_controller()

    def stop(self) -> None:
        if (child := self.child) is not None and child.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.proc.pid, signal.SIGCONT)  # a stopped process cannot exit
        self.stack.stop()


def controller_of(driver: DriverStack) -> Child:
    child = driver.children.get("topolvm-controller")
    assert child is not None and child.proc is not None, "topolvm-controller does not run"
    return child


def freeze(child: Child, stopped: bool) -> None:
    """SIGSTOP (``stopped``) or SIGCONT the process group of ``child``: a paused process keeps
    its connections and its state, and goes on from where it was when continued."""
    assert child.proc is not None
    os.killpg(child.proc.pid, signal.SIGSTOP if stopped else signal.SIGCONT)


async def paused(child: Child, after: float, hold: float) -> None:
    """Wait ``after`` seconds, then pause ``child`` for ``hold`` seconds; continued also when
    cancelled."""
    await asyncio.sleep(after)
    freeze(child, True)
    try:
        await asyncio.sleep(hold)
    finally:
        freeze(child, False)

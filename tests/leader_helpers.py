"""Helpers for the Lease leader-election tests (emulator and real API server)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

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

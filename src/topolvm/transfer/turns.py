"""Turns shared fairly among the addresses that ask for them: whoever waits is served round
robin by address, so that one address (or a few) asking again and again waits behind its own
requests, not in front of everyone else's. The port's TLS handshakes (a rate: CPU of the
event loop) and its TokenReviews (slots: calls to the API server) are handed out so
(:mod:`.door`, :mod:`.auth`; docs/security.md)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque

from topolvm.transfer.gate import Bucket


class FairTurns:
    """At most ``slots`` turns held at once (None: no bound; a holder calls :meth:`give_back`)
    and at most ``rate`` started per second after a ``burst`` (None: no bound)."""

    def __init__(self, slots: int | None = None, rate: float | None = None, burst: int = 1):
        if slots is not None and slots < 1:
            raise ValueError(f"slots {slots}: at least 1")
        self._free = slots
        self._rate = (rate, burst) if rate is not None else None
        self._bucket: Bucket | None = None
        self._queue: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._timer: asyncio.TimerHandle | None = None

    def waiting(self) -> int:
        return sum(len(w) for w in self._queue.values())

    async def take(self, who: str) -> None:
        """Wait for a turn; ``who`` (an address) queues behind its own earlier requests."""
        loop = asyncio.get_running_loop()
        if not self._queue and self._start(loop.time()):
            return
        turn: asyncio.Future[None] = loop.create_future()
        self._queue.setdefault(who, deque()).append(turn)
        self._grant()
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.give_back()  # given just as its waiter gave up
            else:
                self._forget(who, turn)
            raise

    def give_back(self) -> None:
        if self._free is not None:
            self._free += 1
        if self._queue:
            self._grant()

    def _start(self, now: float) -> bool:
        if self._free is not None and self._free < 1:
            return False
        if self._rate is not None:
            if self._bucket is None:
                self._bucket = Bucket(*self._rate, now)
            if not self._bucket.take(now):
                return False
        if self._free is not None:
            self._free -= 1
        return True

    def _grant(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._queue:
            who, waiting = next(iter(self._queue.items()))
            while waiting and waiting[0].done():  # cancelled meanwhile
                waiting.popleft()
            if not waiting:
                del self._queue[who]
                continue
            if not self._start(now):
                break
            turn = waiting.popleft()
            del self._queue[who]
            if waiting:
                self._queue[who] = waiting  # to the back of the round
            turn.set_result(None)
        rate_bound = self._bucket is not None and (self._free is None or self._free > 0)
        if self._queue and self._timer is None and rate_bound:  # held back by the rate alone
            assert self._bucket is not None
            self._timer = loop.call_later(self._bucket.wait(now), self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._grant()

    def _forget(self, who: str, turn: asyncio.Future[None]) -> None:
        waiting = self._queue.get(who)
        if waiting is None:
            return
        try:
            waiting.remove(turn)
        except ValueError:
            return
        if not waiting:
            del self._queue[who]

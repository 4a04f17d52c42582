"""What the transfer port lets a connection take before it is authorised (pure; :mod:`.door`
applies it, docs/security.md):

- :class:`Buckets`: how often one address may connect (a token bucket per address); a
  connection past its address's rate is closed at accept, before any TLS;
- :class:`Gate`: which connections may wait for their handshake and HELLO: at most
  ``per_peer`` from one address (a new one pushes out that address's oldest: an address's
  stalled connections are what its own new one replaces, never another's) and at most
  ``total`` in all (the oldest of an address holding the most gives way: the newcomer's own
  if it holds as many as any, else one of the largest holders', ties drawn at random: idle or
  garbage connections from a few addresses never keep out a node that has one connection
  waiting, and an address never pushes out another that holds no more than it does);
- :class:`Bucket`: a rate, for the handshakes of all addresses together (:mod:`.turns`);
- :class:`Notes`: what is logged once per key in a while.

Times are the caller's monotonic seconds.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Generic, TypeVar

T = TypeVar("T")
PEER_LIMIT, EVICTED = "peer-limit", "evicted"  # why a waiting connection was pushed out


class Bucket:
    """At most ``burst`` at once and ``rate`` per second after that."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"rate {rate} and burst {burst}: both must be positive")
        self.rate = rate
        self.burst = float(burst)
        self._tokens = float(burst)
        self._at = now

    def _fill(self, now: float) -> None:
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = max(self._at, now)

    def take(self, now: float) -> bool:
        self._fill(now)
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def wait(self, now: float) -> float:
        """Seconds until :meth:`take` succeeds."""
        self._fill(now)
        return max(0.0, (1.0 - self._tokens) / self.rate)

    def full(self, now: float) -> bool:
        self._fill(now)
        return self._tokens >= self.burst


class Buckets:
    """A :class:`Bucket` per key (address), at most ``size`` of them: full ones are forgotten
    first (a full bucket is what a new key gets), then the least recently used."""

    def __init__(self, rate: float, burst: int, size: int = 4096) -> None:
        Bucket(rate, burst, 0.0)  # checks them
        self.rate, self.burst, self.size = rate, burst, size
        self._buckets: OrderedDict[str, Bucket] = OrderedDict()

    def take(self, key: str, now: float) -> bool:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.size:
                self._prune(now)
            bucket = self._buckets[key] = Bucket(self.rate, self.burst, now)
        self._buckets.move_to_end(key)
        return bucket.take(now)

    def _prune(self, now: float) -> None:
        for key in [k for k, b in self._buckets.items() if b.full(now)]:
            del self._buckets[key]
        while len(self._buckets) >= self.size:
            self._buckets.popitem(last=False)


class Gate(Generic[T]):
    def __init__(self, per_peer: int, total: int, rng: random.Random | None = None) -> None:
        if per_peer < 1 or total < per_peer:
            raise ValueError(f"per_peer {per_peer} and total {total}: 1 <= per_peer <= total")
        self.per_peer = per_peer
        self.total = total
        self._rng = rng or random.SystemRandom()
        self._by_peer: dict[str, OrderedDict[int, T]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def pending(self, peer: str) -> int:
        return len(self._by_peer.get(peer, ()))

    def admit(self, peer: str, key: int, item: T) -> tuple[T | None, str]:
        """Let the connection ``key`` of ``peer`` wait; the connection that gives way to it
        (its holder closes it), if any, and why (:data:`PEER_LIMIT`, :data:`EVICTED`)."""
        evicted: T | None = None
        why = ""
        if self.pending(peer) >= self.per_peer:
            evicted, why = self._pop_oldest(peer), PEER_LIMIT
        elif self._count >= self.total:
            most = max(len(held) for held in self._by_peer.values())
            if self.pending(peer) >= most:  # among the largest holders itself: its own goes
                evicted, why = self._pop_oldest(peer), EVICTED
            else:
                largest = [p for p, held in self._by_peer.items() if len(held) == most]
                evicted, why = self._pop_oldest(self._rng.choice(largest)), EVICTED
        self._by_peer.setdefault(peer, OrderedDict())[key] = item
        self._count += 1
        return evicted, why

    def _pop_oldest(self, peer: str) -> T:
        held = self._by_peer[peer]
        _, item = held.popitem(last=False)
        self._count -= 1
        if not held:
            del self._by_peer[peer]
        return item

    def release(self, peer: str, key: int) -> None:
        """The connection is authorised, refused or gone (evicted ones are gone already)."""
        mine = self._by_peer.get(peer)
        if mine is None or mine.pop(key, None) is None:
            return
        self._count -= 1
        if not mine:
            del self._by_peer[peer]


class Notes:
    """Whether something is to be logged now: once per key every ``seconds``; at most
    ``size`` keys remembered (the expired ones go first)."""

    def __init__(self, seconds: float, size: int = 4096) -> None:
        self.seconds, self.size = seconds, size
        self._until: dict[tuple[str, ...], float] = {}

    def due(self, key: tuple[str, ...], now: float) -> bool:
        if self._until.get(key, 0.0) > now:
            return False
        if len(self._until) >= self.size:
            self._until = {k: t for k, t in self._until.items() if t > now}
            while len(self._until) >= self.size:
                del self._until[next(iter(self._until))]
        self._until[key] = now + self.seconds
        return True

"""Volumes a node's capacity annotation does not show yet, so that GetCapacity and
CreateVolume never offer the same bytes twice (pure bookkeeping; the app feeds it events).

A node rewrites ``capacity.<p>/<dc>`` after every LV change, but some time after it: between the
controller writing a LogicalVolume and that rewrite, the annotation still counts the space as
free. Each volume is therefore *taken* from the moment CreateVolume picks a node until
- it failed or was deleted (:meth:`release`), or
- its LV exists (:meth:`settle`) and, at least ``settle_delay`` later, the annotation differs
  from its value at the reservation (the node has re-counted with the LV in it), or
  ``settle_timeout`` passed since it settled (a lost update must not hide space for ever), or
- it was reserved for an LV that already existed (a CreateVolume retried after a restart of the
  controller, which forgot its reservations) and ``settle_delay`` passed: the node may have
  counted it before the reservation, and then its annotation will not change again to end it.
A call cancelled while its LV is being made (the caller's deadline) leaves its reservation
:meth:`abandon`-ed, not released: the node is still making the LV, and the retry that follows
keeps and settles that first reservation. One never retried ends ``settle_timeout`` later.
LogicalVolumes other replicas are creating come from the informer (:meth:`creating`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

SETTLE_TIMEOUT = 120.0
# A node re-counts within about a second of an LV change when idle, but a burst of creates
# queues its re-counts behind lvmd's lock: with 5 s a reservation ended on a re-count that did not
# have its LV yet, and a node got 11 volumes where its annotation offered 10 (test_cluster_burst
# on a loaded machine). Longer only keeps bytes taken longer (a retry, never an over-promise).
SETTLE_DELAY = 30.0


@dataclass
class Reservation:
    name: str
    node: str
    device_class: str
    size: int
    annotation: str | None  # the node's annotation value when reserved
    made: bool = False  # the LV existed already when reserved
    settled_at: float | None = None
    abandoned_at: float | None = None  # its call was cancelled before the LV existed

    def over(self, now: float, changed: bool, delay: float, timeout: float) -> str | None:
        """Why the reservation ends now (for the log), or None while it holds."""
        if self.settled_at is None:
            if self.abandoned_at is not None and now - self.abandoned_at > timeout:
                return "abandoned, never retried"
            return None
        age = now - self.settled_at
        if age >= delay and changed:
            return "the node's annotation changed"
        if age >= delay and self.made:
            return "made before it was reserved"
        return "settle timeout" if age > timeout else None


@dataclass(frozen=True)
class Ended:
    """A reservation that ended, why, and how long after its LV existed (or its call ended)."""

    reservation: Reservation
    why: str
    after: float


class InFlight:
    def __init__(
        self,
        settle_timeout: float = SETTLE_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        settle_delay: float = SETTLE_DELAY,
    ):
        self.settle_timeout = settle_timeout
        self.settle_delay = settle_delay
        self.clock = clock
        self._by_name: dict[str, Reservation] = {}

    def reserve(
        self,
        name: str,
        node: str,
        device_class: str,
        size: int,
        annotation: str | None,
        made: bool = False,
    ) -> None:
        """Count ``size`` bytes as taken on (node, device class); a retry of the same name
        on the same node keeps the first reservation. ``made``: the LV exists already."""
        first = self._by_name.get(name)
        if first is None or (first.node, first.device_class) != (node, device_class):
            self._by_name[name] = Reservation(name, node, device_class, size, annotation, made)

    def settle(self, name: str) -> None:
        """The LV exists. The reservation stays until :meth:`observe` sees the annotation
        changed at least ``settle_delay`` after this: a change seen earlier may be the node
        re-counting for another volume, written before this LV existed."""
        r = self._by_name.get(name)
        if r is not None and r.settled_at is None:
            r.settled_at = self.clock()

    def abandon(self, name: str) -> None:
        """The call that reserved ``name`` was cancelled; its LV may still be made. Kept for a
        retry to settle, or ``settle_timeout`` if none comes."""
        r = self._by_name.get(name)
        if r is not None and r.settled_at is None and r.abandoned_at is None:
            r.abandoned_at = self.clock()

    def release(self, name: str) -> None:
        self._by_name.pop(name, None)

    def observe(self, node: str, annotation_of: Callable[[str], str | None]) -> list[Ended]:
        """A new version of ``node``: drop settled reservations its annotations now include."""
        now = self.clock()
        ended = []
        for r in list(self._by_name.values()):
            if r.node != node:
                continue
            changed = annotation_of(r.device_class) != r.annotation
            why = r.over(now, changed, self.settle_delay, self.settle_timeout)
            if why is not None:
                ended.append(self._end(r, now, why))
        return ended

    def expire(self) -> list[Ended]:
        """End what time alone ends: the settle timeout, and reservations for made LVs."""
        now = self.clock()
        ended = []
        for r in list(self._by_name.values()):
            why = r.over(now, False, self.settle_delay, self.settle_timeout)
            if why is not None:
                ended.append(self._end(r, now, why))
        return ended

    def _end(self, r: Reservation, now: float, why: str) -> Ended:
        del self._by_name[r.name]
        since = r.settled_at if r.settled_at is not None else r.abandoned_at
        return Ended(r, why, now - since if since is not None else 0.0)

    def taken(
        self,
        node: str,
        device_class: str,
        creating: Iterable[tuple[str, int]] = (),
    ) -> int:
        """Bytes taken on (node, class): own reservations plus ``creating`` — (name, size) of
        LogicalVolumes on that node and class without a volume id yet, counted once by name."""
        self.expire()
        seen: set[str] = set()
        total = 0
        for r in self._by_name.values():
            if r.node == node and r.device_class == device_class:
                seen.add(r.name)
                total += r.size
        for name, size in creating:
            if name not in seen:
                seen.add(name)
                total += size
        return total

    def __len__(self) -> int:
        return len(self._by_name)

    def totals(self) -> dict[tuple[str, str], int]:
        """(node, device class) → reserved bytes, for the in-flight metric."""
        out: dict[tuple[str, str], int] = {}
        for r in self._by_name.values():
            key = (r.node, r.device_class)
            out[key] = out.get(key, 0) + r.size
        return out

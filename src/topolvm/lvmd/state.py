"""The cached LVM state of the node.

lvmd keeps the last ``lvm fullreport`` in memory and serves reads from it. Its own mutations
update the cached model at once (marking it *dirty*: numbers LVM computes, such as VG free space
after an allocation with lvcreate options, may differ); readers that need exact data call
:meth:`LvmState.fresh`, which runs one ``fullreport`` if anything changed since the last one.
Some changes leave the model's capacity exact although it is dirty (a plain linear LV takes or
frees exactly its size from the VG): the Watch stream then reports from the model with no
``fullreport``, which would hold the lock for longer than an ``lvcreate`` takes in a burst.
Changes made outside lvmd are seen from the kernel's block-device events
(:mod:`topolvm.lvmd.devices`): a report runs only when the node's block devices differ from what
lvmd last knew (:meth:`LvmState.check_devices`), so lvmd's own changes never cause one. A timer
refreshes it too, as a safety net for what no device shows (default every 10 minutes): an idle
node costs one LVM report per interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from topolvm.lvm.command import LvmRunner
from topolvm.lvm.report import FULLREPORT_ARGS, LvRecord, Report, parse_report
from topolvm.lvmd.devices import Fingerprint, fingerprint
from topolvm.process import stopped_within

log = logging.getLogger(__name__)

DEFAULT_REFRESH_INTERVAL = 600.0  # upstream lvmd re-reads LVM every 10 minutes
WATCH_INTERVAL = 600.0  # upstream sends a Watch message at least every 10 minutes


class LvmState:
    def __init__(self, runner: LvmRunner, devices: Callable[[], Fingerprint] = fingerprint):
        self.runner = runner
        self.devices = devices
        # The block devices as of the last report or lvmd's own last change: a device event
        # that leaves them so was lvmd's own (or changed nothing LVM reports).
        self._seen_devices: Fingerprint | None = None
        self.device_refreshes = 0  # reports run because the block devices changed
        # Serialises lvmd's mutations with each other and with refreshes, so that a
        # check-then-act (exists? enough space?) is atomic and no refresh overwrites a
        # mutation's update with an older report.
        self.lock = asyncio.Lock()
        self._report: Report | None = None
        self._dirty = True
        # Free space and sizes in the model are LVM's: true after a report, kept only by
        # changes whose effect lvmd knows exactly (see :meth:`begin_change`).
        self._capacity_exact = False
        self._linear: set[str] = set()  # "vg/lv" of plain linear LVs lvmd made since the report
        self._subscribers: set[asyncio.Queue[None]] = set()
        self.closing = asyncio.Event()
        self.refreshes = 0
        self.last_change = time.monotonic()  # of lvmd's last mutation (started or recorded)

    @property
    def dirty(self) -> bool:
        return self._dirty

    @property
    def capacity_exact(self) -> bool:
        return self._capacity_exact

    async def _load(self) -> Report:
        # before the report: a change in between shows in the report, and again in the next
        # comparison (one extra report), never in neither
        self._seen_devices = self.devices()
        report = parse_report(await self.runner.report(*FULLREPORT_ARGS))
        self._report = report
        self._dirty = False
        self._capacity_exact = True
        self._linear.clear()
        self.refreshes += 1
        return report

    def cached(self) -> Report | None:
        """The model as it stands, without waiting for a change or a report that runs: for a
        read of one LV no running change touches (a publish's DescribeLV must not wait behind
        a cut's removal). None before the first report."""
        return self._report

    async def current_locked(self) -> Report:
        """The cached model, possibly dirty. The caller holds :attr:`lock`."""
        if self._report is None:
            return await self._load()
        return self._report

    async def reload_locked(self) -> Report:
        """Run a fullreport now. The caller holds :attr:`lock`."""
        return await self._load()

    async def fresh(self) -> Report:
        """An exact snapshot: refreshes first if lvmd changed anything since the last report."""
        report = self._report
        if report is not None and not self._dirty:
            return report
        async with self.lock:
            if self._report is None or self._dirty:
                return await self._load()
            return self._report

    async def refresh(self) -> Report:
        """Refresh unconditionally (timer, start-up); notify watchers if anything changed."""
        async with self.lock:
            old = self._report
            new = await self._load()
        if new != old:
            self.notify()
        return new

    async def check_devices(self) -> bool:
        """After block-device events: refresh (and notify watchers) only if the node's block
        devices differ from what lvmd last knew; returns whether a report ran. Waits for a
        mutation in progress, whose own events then match what it recorded."""
        async with self.lock:
            if self._report is not None and self.devices() == self._seen_devices:
                return False
            old = self._report
            new = await self._load()
            self.device_refreshes += 1
        log.info("LVM changed outside lvmd; state re-read",
                 extra={"device_refreshes": self.device_refreshes})  # fmt: skip
        if new != old:
            self.notify()
        return True

    async def capacity_report(self) -> Report:
        """What a Watch message is computed from: the model while its capacity is exact (after
        the mutation that runs now, if any), else a new report."""
        report = self._report
        if report is not None and self._capacity_exact:
            return report
        async with self.lock:
            if self._report is not None and (self._capacity_exact or not self._dirty):
                return self._report
            return await self._load()

    def begin_change(self) -> bool:
        """A mutation is about to run: the model is dirty and its capacity unknown until
        :meth:`update_locked` records the result (a cancelled or failed mutation leaves it so).
        Returns whether the capacity was exact before, for the caller to pass on."""
        was_exact = self._capacity_exact
        self._dirty = True
        self._capacity_exact = False
        self.last_change = time.monotonic()
        return was_exact

    def update_locked(self, report: Report, *, capacity_exact: bool = False) -> None:
        """Record lvmd's own change in the model; the next exact read refreshes it.
        ``capacity_exact``: the model's capacity was exact before the change and the change's
        effect on it is known exactly."""
        self._report = report
        self._dirty = True
        self._capacity_exact = capacity_exact
        self.last_change = time.monotonic()
        self._seen_devices = self.devices()  # lvmd's own change: its device events are expected
        self.notify()

    def record_linear(self, full_name: str) -> None:
        """lvmd made ``full_name`` as a plain linear LV (it frees exactly its size)."""
        self._linear.add(full_name)

    def is_linear(self, lv: LvRecord) -> bool:
        """Whether removing ``lv`` frees exactly its size in its VG: a plain linear (or striped)
        LV by its ``lv_attr`` volume type, or one lvmd made so since the last report."""
        if lv.pool_lv:
            return False
        return lv.attr[:1] == "-" or lv.full_name in self._linear

    async def settled(self, quiet: float, limit: float) -> None:
        """Return once lvmd has made no change for ``quiet`` seconds and none runs, or after
        ``limit`` seconds whatever happens. A Watch report waits for this: it coalesces a burst
        into one message, and when the model's capacity is not exact its ``fullreport`` holds
        :attr:`lock`, so one run between two back-to-back mutations would delay the second.
        It sleeps, and waits on the lock while a mutation runs: no polling, which in a burst
        would take CPU from the LVM commands."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while not self.closing.is_set():
            left = deadline - loop.time()
            if left <= 0:
                return
            if self.lock.locked():
                try:
                    async with asyncio.timeout(left):
                        await self._unlocked()
                except TimeoutError:
                    return
                continue
            idle = time.monotonic() - self.last_change
            if idle >= quiet:
                return
            await asyncio.sleep(min(quiet - idle, left))

    async def _unlocked(self) -> None:
        """Until the mutation that holds the lock (and those queued before this call) ends."""
        async with self.lock:
            pass

    # -- change notification (Watch) -------------------------------------------------------

    def subscribe(self) -> asyncio.Queue[None]:
        # One slot per subscriber: notifications that arrive while one is pending coalesce.
        q: asyncio.Queue[None] = asyncio.Queue(maxsize=1)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[None]) -> None:
        self._subscribers.discard(q)

    def notify(self) -> None:
        for q in self._subscribers:
            if q.empty():
                q.put_nowait(None)

    def close(self) -> None:
        """Wake every watcher so streams end (shutdown)."""
        self.closing.set()
        self.notify()

    async def run_timer(
        self, refresh_interval: float, watch_interval: float = WATCH_INTERVAL
    ) -> None:
        """Refresh every ``refresh_interval``; notify watchers at least every ``watch_interval``."""
        last_notify = time.monotonic()
        while not await stopped_within(self.closing, refresh_interval):
            try:
                await self.refresh()
            except Exception:
                log.exception("periodic LVM refresh failed")
                continue
            if time.monotonic() - last_notify >= watch_interval:
                self.notify()
                last_notify = time.monotonic()

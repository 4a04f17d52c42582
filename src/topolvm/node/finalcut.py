"""A move's final cut on its source's node (docs/mobility.md, "The final cut waits for the
source to close").

A move's final copy reads a second cut of the source (``cut.<target UID>.r2``), made once
nothing holds the source open, and sends what differs from the first. Made when the target's
node asked, that cut and its delta (a few LVM commands, seconds on a slow node) came after the
pod's stop was noticed, the final copy asked for and the target's node connected, all with the
pod down. So :class:`FinalCutHooks` makes them as soon as the kubelet unmounts such a source
(its pre-copy done: the only unmount to come is the move's stop of its pod), and the final copy
finds both ready.

A second cut is trusted only while this process knows nothing wrote the source since it was
made: one it made early and whose source was not published since, or one a receiver reads
already. Any other (made before a restart; made early, then the source published again) is
removed and made again once the source is closed. A publish drops an early cut at once, before
the mount and without waiting for anything (the removal runs in the background).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import LogicalVolumeObject
from topolvm.k8s.lvstore import AmbiguousVolumeId, LogicalVolumeStore
from topolvm.node.lvmd_client import LvmdCallError
from topolvm.node.orphans import final_pending
from topolvm.node.sourceopen import OpenUnknown, still_open
from topolvm.node.volumes import Cuts, LvmdVolumes, cut_name, round_two
from topolvm.transfer.errors import Refused, TransferError

log = logging.getLogger(__name__)
# the least copy-on-write area of a move's thick cut, as a share of its origin, when the node
# has no room for one as large as the origin: the first cut lives while the pod writes (1/8),
# the second while it is stopped (1/32)
MOVE_COW_SHARE = (8, 32)

Spawn = Callable[[Coroutine[Any, Any, None]], None]


class FinalCuts:
    """The second cuts of the moves whose source is on this node."""

    def __init__(self, cuts: Cuts, volumes: LvmdVolumes, node: str, spawn: Spawn) -> None:
        self.cuts = cuts
        self.volumes = volumes
        self.node = node
        self.spawn = spawn  # runs a task in the background (stopped with the transfer port)
        self._locks: dict[str, asyncio.Lock] = {}  # target UID -> its final cut's
        self.early: dict[str, tuple[str, str]] = {}  # target UID -> (source volume id, class)
        self.taken: set[str] = set()  # target UIDs whose final cut a receiver reads
        self.publishes = 0  # publishes seen on this node
        self.working = 0  # final cuts being made or handed out now

    def _lock(self, uid: str) -> asyncio.Lock:
        return self._locks.setdefault(uid, asyncio.Lock())

    def forget(self, uid: str) -> None:
        """The target's copy ended (its cuts go)."""
        self.taken.discard(uid)
        self._locks.pop(uid, None)
        if self.early.pop(uid, None) is not None:
            self.volumes.forget(cut_name(round_two(uid)))

    # -- the final copy's ----------------------------------------------------------------

    async def for_copy(
        self, target: LogicalVolumeObject, source: LogicalVolumeObject
    ) -> tuple[str, str]:
        """The cut the final copy into ``target`` reads, and its delta's base (the first)."""
        self.working += 1
        try:
            async with self._lock(target.uid):
                cuts = await self._second(target, source, early=False)
                self.taken.add(target.uid)  # read from now on: a publish no longer drops it
                return cuts
        finally:
            self.working -= 1

    async def _second(
        self, target: LogicalVolumeObject, source: LogicalVolumeObject, *, early: bool
    ) -> tuple[str, str]:
        dc, uid = source.device_class, target.uid
        job = round_two(uid)
        # made here early (below), both cuts in lvmd's model: found with no report, the final
        # copy asking with the pod down; still early after the ask (a publish drops it)
        if not early and uid in self.early and await self._there(dc, uid, job) \
                and uid in self.early:  # fmt: skip
            return self.cuts.known(job, dc), cut_name(uid)
        listed = await self.cuts.listed(dc, strict=True)
        if uid not in listed:
            raise Refused(
                "unknown-job", f"the first cut of {source.name} that {target.name} was filled "
                "from is gone: the move's final copy cannot be a delta"
            )  # fmt: skip
        if job in listed and uid in self.early:
            # made here once lvmd saw the source closed, the first cut checked then; nothing
            # wrote the source since (a publish drops it), so neither can have overflowed
            return self.cuts.known(job, dc), cut_name(uid)
        await self.cuts.check(uid, dc)  # the delta's base, kept while the pod ran
        if job in listed and uid not in self.taken:
            # made before this process started, or early and the source published since:
            # it may lack writes, and is made again
            self.volumes.forget(cut_name(job))
            await self.cuts.remove(job, dc)
            listed.remove(job)
        fresh = job not in listed
        if fresh:
            await self._closed(source, dc, strict=early)
        size = source.current_size or source.size
        second = await self.cuts.ensure(job, source.volume_id, dc, size // MOVE_COW_SHARE[1])
        # one made before may have overflowed since; one made now of a source lvmd saw closed
        # (an early cut: OpenState answered) has not (an LVM command less, with the pod down)
        if not (fresh and early):
            await self.cuts.check(job, dc)
        return second, cut_name(uid)

    async def _there(self, dc: str, *jobs: str) -> bool:
        """Whether lvmd has the cuts of ``jobs`` (a describe costs no LVM command for a cut in
        its model; one gone, or any error, says no: the caller then lists them)."""
        for job in jobs:
            try:
                await self.cuts.lvmd.describe_lv(cut_name(job), dc)
            except LvmdCallError:
                return False
        return True

    async def _closed(self, source: LogicalVolumeObject, dc: str, *, strict: bool) -> None:
        """The second cut waits until nothing holds the source open: a pod whose object was
        force-deleted may still write (docs/mobility.md). ``strict``: an lvmd that cannot
        tell (no OpenState) refuses too (an early cut then waits for the final copy)."""
        try:
            held = await still_open(self.cuts.lvmd, source.volume_id, dc, unknown_closed=not strict)
        except OpenUnknown as e:
            raise Refused("unavailable", str(e)) from e
        if held:
            log.warning("final cut waits: the source is still open",
                        extra={"lv": source.name, "holding": held})  # fmt: skip
            raise Refused(
                "unavailable", f"the volume {source.name} is still open on node {self.node} "
                f"({held}): the final cut waits until its workload stops"
            )  # fmt: skip

    # -- early -----------------------------------------------------------------------------

    async def make_early(
        self, target: LogicalVolumeObject, source: LogicalVolumeObject, publishes: int
    ) -> None:
        """``source``, whose pre-copy into ``target`` is done, was just unmounted (when this
        node had seen ``publishes`` publishes): its final cut and the delta against the first
        are made now, unless a publish came since. Failures are logged: the final copy makes
        the cut then."""
        dc, uid = source.device_class, target.uid
        ctx = {"lv": source.name, "target": target.name}
        self.working += 1
        try:
            async with self._lock(uid):
                if uid in self.taken or uid in self.early:
                    return
                second, base = await self._second(target, source, early=True)
                if self.publishes != publishes:  # a publish meanwhile: the cut may lack it
                    await self._drop(uid, dc, "a volume was published while it was cut")
                    return
                self.early[uid] = (source.volume_id, dc)
                info = await self.volumes.describe(second, dc, with_uuid=True)
                await self.volumes.changed(second, base, dc, thin=info.thin, keep=True)
        except (TransferError, LvmdCallError) as e:
            log.info("a move's final cut waits for its copy", extra={**ctx, "error": str(e)})
            return
        finally:
            self.working -= 1
        log.info("a move's final cut made once its source closed", extra=ctx)

    def publishing(self, volume_id: str) -> None:
        """``volume_id`` is about to be published here: a final cut made early for it and not
        read yet may miss what comes, and goes. Never waits (a CSI call runs it)."""
        self.publishes += 1
        for uid, (volume, dc) in list(self.early.items()):
            if volume == volume_id and uid not in self.taken:
                del self.early[uid]
                self.volumes.forget(cut_name(round_two(uid)))
                self.spawn(self._drop_locked(uid, dc))

    async def _drop_locked(self, uid: str, dc: str) -> None:
        async with self._lock(uid):
            if uid not in self.early and uid not in self.taken:  # else made again, or read
                await self._drop(uid, dc, "its source is published again")

    async def _drop(self, uid: str, dc: str, why: str) -> None:
        self.early.pop(uid, None)
        self.volumes.forget(cut_name(round_two(uid)))
        try:
            await self.cuts.remove(round_two(uid), dc)
            log.info("a move's early final cut dropped", extra={"target_uid": uid, "why": why})
        except TransferError as e:  # not trusted any more: the final copy removes it
            log.warning("a move's early final cut cannot be dropped yet", extra={
                "target_uid": uid, "why": why, "error": str(e)})  # fmt: skip


class FinalCutHooks:
    """:class:`~topolvm.node.csihooks.PublishHooks` that tell :class:`FinalCuts` of the
    unmounts and publishes of this node's volumes."""

    def __init__(self, store: LogicalVolumeStore, final: FinalCuts, node: str) -> None:
        self.store = store
        self.final = final
        self.node = node

    async def publishing(self, volume_id: str, target: str) -> None:
        self.final.publishing(volume_id)

    async def published(self, volume_id: str, target: str, context: Mapping[str, str]) -> None:
        """Nothing more: an early cut went at :meth:`publishing`."""

    async def unpublishing(self, volume_id: str, target: str) -> None:
        """Nothing yet: the source is still mounted."""

    async def unpublished(self, volume_id: str, target: str) -> None:
        try:
            source = await self.store.find_by_volume_id(volume_id)
        except (kube.KubeError, AmbiguousVolumeId) as e:
            log.info("no early final cut: the volume's LogicalVolume is not known",
                     extra={"volume_id": volume_id, "error": str(e)})  # fmt: skip
            return
        if source is None or source.node_name != self.node:
            return
        publishes = self.final.publishes  # counted from the unmount: a publish after it drops
        for lv in self.store.all():
            if lv.copy_source == source.name and final_pending(lv):
                self.final.spawn(self.final.make_early(lv, source, publishes))

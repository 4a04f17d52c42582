"""What the node's copies need of lvmd: where a volume's bytes are, a thin volume's mapped
blocks and those that differ from a base (:class:`LvmdVolumes`, the transfer's
:class:`~topolvm.transfer.jobs.Volumes`), and
point-in-time cuts of live volumes (:class:`Cuts`).

A copy never reads a live volume: it reads a snapshot, or a *cut*, an LVM snapshot of the live
volume made for one copy job (a thin snapshot, or a COW snapshot as large as its origin, which
cannot fill up; for a move, on a node without that much room, a smaller one, which fails the
copy if it fills up) and named after the job, ``cut.<target LogicalVolume UID>``, so a resumed job
or a restarted node finds the same one. The node that holds the source makes it when the job
first asks, and removes it once the job's target is filled or gone.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from grpclib.const import Status

from topolvm.node.lvmd_client import LvmdCallError, LvmdClient
from topolvm.proto import lvmd_pb2 as pb
from topolvm.proto import volumedata_pb2 as vd
from topolvm.transfer.errors import SourceFailed, TransferError
from topolvm.transfer.jobs import VolumeInfo
from topolvm.units import human

log = logging.getLogger(__name__)
CUT_PREFIX = "cut."
CUT_TAG = "topolvm/cut"


def cut_name(job_uid: str) -> str:
    return CUT_PREFIX + job_uid


def job_of_cut(lv_name: str) -> str | None:
    return lv_name[len(CUT_PREFIX) :] if lv_name.startswith(CUT_PREFIX) else None


ROUND_TWO = ".r2"


def round_two(job_uid: str) -> str:
    """The job id of a move's second cut (``cut.<uid>.r2``)."""
    return job_uid + ROUND_TWO


def job_of_round(job: str) -> str:
    """The target's UID of a cut's job id (either round)."""
    return job.removesuffix(ROUND_TWO)


KEPT_DELTAS = 32  # deltas worked out ahead of their copy (a move's final cut), at most


class LvmdVolumes:
    def __init__(self, lvmd: LvmdClient) -> None:
        self.lvmd = lvmd
        # (device class, volume, base) -> the delta worked out before its copy asked
        self._kept: OrderedDict[tuple[str, str, str], list[tuple[int, int]]] = OrderedDict()

    async def describe(self, name: str, device_class: str, with_uuid: bool = False) -> VolumeInfo:
        try:
            r = await self.lvmd.describe_lv(name, device_class, with_uuid)
        except LvmdCallError as e:
            raise SourceFailed(f"lvmd cannot describe LV {name}: {e.message}") from e
        return VolumeInfo(r.path, int(r.size_bytes), r.thin, int(r.chunk_bytes), r.uuid)

    async def mapped(self, name: str, device_class: str) -> list[tuple[int, int]] | None:
        try:
            return [r async for r in self.lvmd.thin_mappings(name, device_class)]
        except LvmdCallError as e:
            if e.code in (Status.NOT_FOUND, Status.UNAVAILABLE):
                raise SourceFailed(f"lvmd cannot map LV {name}: {e.message}") from e
            # an lvmd without VolumeData (upstream's), or no thin_dump on the host: the copy
            # reads the volume whole, which is correct, only slower
            log.warning(
                "thin mappings unknown; reading the volume whole",
                extra={"lv": name, "error": str(e)},
            )
            return None

    async def changed(
        self, name: str, base: str, device_class: str, thin: bool = True, *, keep: bool = False
    ) -> list[tuple[int, int]] | None:
        """The delta of cut ``name`` against cut ``base``; with ``keep`` it is also kept for
        the next caller, who gets it without asking lvmd (once). Cuts are read-only: a thin
        one's blocks never change, and a thick one's table only grows while its origin is
        written, so a delta read earlier still covers every range that differs."""
        key = (device_class, name, base)
        if not keep and (kept := self._kept.pop(key, None)) is not None:
            return kept
        ranges = await self._changed(name, base, device_class, thin)
        if keep and ranges is not None:
            self._kept[key] = ranges
            self._kept.move_to_end(key)
            while len(self._kept) > KEPT_DELTAS:
                self._kept.popitem(last=False)
        return ranges

    def forget(self, name: str) -> None:
        """The cut ``name`` is going: a delta kept for it is dropped."""
        for key in [k for k in self._kept if name in k[1:]]:
            del self._kept[key]

    async def _changed(
        self, name: str, base: str, device_class: str, thin: bool
    ) -> list[tuple[int, int]] | None:
        delta = self.lvmd.thin_delta if thin else self.lvmd.cow_delta
        try:
            return [r async for r in delta(name, base, device_class)]
        except LvmdCallError as e:
            if e.code in (Status.NOT_FOUND, Status.UNAVAILABLE):
                raise SourceFailed(f"lvmd cannot compare LV {name} with {base}: {e.message}") from e
            # an lvmd without ThinDelta or CowDelta, no thin_dump on the host, or volumes that
            # are not cuts of one origin: the copy compares every range with the base, which is
            # correct, only slower
            log.warning(
                "delta unknown; comparing the volume with its base whole",
                extra={"lv": name, "base": base, "thin": thin, "error": str(e)},
            )
            return None


def _cut_failed(source: str, e: LvmdCallError) -> SourceFailed:
    if e.code is Status.RESOURCE_EXHAUSTED:
        return NoRoomForCut(f"no room for the copy's point-in-time cut of {source}: {e.message}")
    return SourceFailed(f"cannot cut {source} for the copy: {e.message}")


class NoRoomForCut(SourceFailed):
    """The source's VG has no room for a cut (a thick one is as large as its origin)."""


class CutOverflowed(SourceFailed):
    """A thick cut with a smaller copy-on-write area than its origin filled up: it reads as
    I/O errors, and no retry mends it."""


class JobEnded(SourceFailed):
    """The job's target was filled, failed or deleted: no cut is made for it any more."""


ENDED_REMEMBERED = 4096  # jobs whose end :class:`Cuts` remembers (each a UID)


class Cuts:
    """The cuts of one node, made and removed through lvmd. It remembers the cuts this process
    made or found (``held``) and the jobs that ended (:meth:`end`), so that a cut made for a job
    the moment it ends (its receiver asked just before) is removed at once, not left over."""

    def __init__(self, lvmd: LvmdClient) -> None:
        self.lvmd = lvmd
        self.held: dict[str, str] = {}  # job id (either round) -> device class
        self._ended: OrderedDict[str, None] = OrderedDict()  # target UIDs
        self._learnt: set[str] = set()  # device classes whose cuts were listed since start
        self._learning = asyncio.Lock()

    def learnt(self, device_class: str) -> bool:
        return device_class in self._learnt

    async def learn(self, device_class: str) -> None:
        """Once per device class: the cuts made there before this process started are held
        too (:class:`SourceFailed` if lvmd cannot list them; asked again next time)."""
        async with self._learning:
            if device_class not in self._learnt:
                await self.listed(device_class, strict=True)
                self._learnt.add(device_class)

    def end(self, target_uid: str) -> list[tuple[str, str]]:
        """The copy that fills ``target_uid`` ended: no cut is made for it from now on. Its
        cuts this process holds, (job id, device class), to remove."""
        self._ended[target_uid] = None
        self._ended.move_to_end(target_uid)
        while len(self._ended) > ENDED_REMEMBERED:
            self._ended.popitem(last=False)
        jobs = (target_uid, round_two(target_uid))
        return [(job, self.held[job]) for job in jobs if job in self.held]

    def ended(self, job: str) -> bool:
        return job_of_round(job) in self._ended

    async def ensure(self, job_uid: str, source: str, device_class: str, min_cow: int = 0) -> str:
        """The cut of LV ``source`` for job ``job_uid`` (made now, or found from before). With
        ``min_cow``, a thick cut may get a smaller copy-on-write area than its origin when its
        VG lacks the room, at least that much (lvmd's CreateCut; see :meth:`check`).
        :class:`JobEnded` if the job ended, before or while the cut was made (then it goes)."""
        if self.ended(job_uid):
            raise JobEnded(f"the copy job {job_of_round(job_uid)} ended: no cut is made for it")
        name = await self._make(job_uid, source, device_class, min_cow)
        self.held[job_uid] = device_class
        if self.ended(job_uid):  # it ended while lvmd made the cut: its removal came first
            log.warning("a copy's job ended while its cut was made; the cut goes",
                        extra={"job": job_uid, "device_class": device_class})  # fmt: skip
            await self.remove(job_uid, device_class)
            raise JobEnded(f"the copy job {job_of_round(job_uid)} ended while its cut was made")
        return name

    def known(self, job_uid: str, device_class: str) -> str:
        """The cut of job ``job_uid`` that this process made and no job's end removed: held
        again without asking lvmd (:class:`JobEnded` if the job ended)."""
        if self.ended(job_uid):
            raise JobEnded(f"the copy job {job_of_round(job_uid)} ended: its cut is not read")
        self.held[job_uid] = device_class
        return cut_name(job_uid)

    async def _make(self, job_uid: str, source: str, device_class: str, min_cow: int) -> str:
        name = cut_name(job_uid)
        if min_cow:
            cut = vd.CreateCutRequest(name=name, device_class=device_class,
                                      source_volume=source, tags=[CUT_TAG],
                                      min_cow_bytes=min_cow)  # fmt: skip
            try:
                await self.lvmd.create_cut(cut)
                return name
            except LvmdCallError as e:
                if e.code is not Status.UNIMPLEMENTED:  # else an older lvmd: a whole cut
                    raise _cut_failed(source, e) from e
        req = pb.CreateLVSnapshotRequest(
            name=name,
            device_class=device_class,
            source_volume=source,
            access_type="ro",
            tags=[CUT_TAG],
        )
        try:
            await self.lvmd.create_lv_snapshot(req)
        except LvmdCallError as e:
            raise _cut_failed(source, e) from e
        return name

    async def check(self, job_uid: str, device_class: str) -> None:
        """Raise :class:`CutOverflowed` if the job's cut is a thick one that overflowed (its
        origin changed by more than its copy-on-write area); a cut not there is no error."""
        name = cut_name(job_uid)
        try:
            reply = await self.lvmd.describe_lv(name, device_class, check_snapshot=True)
        except LvmdCallError as e:
            if e.code is Status.NOT_FOUND:
                return
            raise SourceFailed(f"lvmd cannot check the cut {name}: {e.message}") from e
        if reply.invalid:
            raise CutOverflowed(
                f"the point-in-time cut {name} overflowed: the volume changed by more than its "
                f"{human(reply.cow_bytes)} copy-on-write area since the cut was made (its node "
                "had no room for a larger one)"
            )  # fmt: skip

    async def remove(self, job_uid: str, device_class: str) -> bool:
        """Remove the job's cut; False if there was none."""
        try:
            await self.lvmd.remove_lv(
                pb.RemoveLVRequest(name=cut_name(job_uid), device_class=device_class)
            )
        except LvmdCallError as e:
            if e.code is Status.NOT_FOUND:
                self.held.pop(job_uid, None)
                return False
            raise TransferError(f"cannot remove the cut of job {job_uid}: {e.message}") from e
        self.held.pop(job_uid, None)
        log.info("removed a copy's cut", extra={"job": job_uid, "device_class": device_class})
        return True

    async def listed(self, device_class: str, strict: bool = False) -> list[str]:
        """Job ids of the cuts in ``device_class`` (a second cut's ends in ``.r2``). An lvmd
        error reads as no cut, or with ``strict`` raises :class:`SourceFailed`."""
        try:
            volumes = await self.lvmd.get_lv_list(device_class)
        except LvmdCallError as e:
            if strict:
                raise SourceFailed(f"lvmd cannot list the cuts: {e.message}") from e
            log.warning("cannot list cuts", extra={"device_class": device_class, "error": str(e)})
            return []
        # ours only: a `cut.*` LV without our tag is someone else's (a shared VG)
        jobs = [job for v in volumes
                if CUT_TAG in v.tags and (job := job_of_cut(v.name)) is not None]  # fmt: skip
        for job in jobs:
            self.held.setdefault(job, device_class)
        return jobs

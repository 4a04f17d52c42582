"""lvmd's ``topolvm.lvmd.v1.VolumeData``: what the node-to-node copy needs of LVM.

``DescribeLV`` says where a volume's bytes are (its device, size, thin or thick, the thin
pool's chunk). ``ThinMappings`` says which of a thin volume's blocks its pool maps, so that a
copy reads only those: it reserves the pool's metadata snapshot (``dmsetup message <pool>-tpool
0 reserve_metadata_snap``; the pool goes on serving I/O), reads the volume's mappings from it
with ``thin_dump -m``, and releases it, under lvmd's lock (one reservation per pool can exist,
and no LVM change runs meanwhile). A reservation left by a killed lvmd is released and made
again.

``CreateCut`` makes a copy's point-in-time cut (a snapshot); a thick one whose origin's device
class lacks the room for a copy-on-write area as large as the origin may get a smaller one.

``ThinDelta`` says where a thin volume maps other blocks than a base in the same pool (a thin
snapshot taken earlier, which shares the blocks not written since): both volumes' mappings
come from one reservation, so they are of the same instant.

``CowDelta`` says where two thick cuts of one origin may differ: the origin's chunks written
since the older was taken, from the COW snapshots' exception tables (:mod:`topolvm.lvm.cowtable`,
read with ``O_DIRECT``: the kernel writes them beneath the page cache).

``OpenState`` says whether anything holds a volume open (:mod:`topolvm.lvmd.openers`): a
move's final cut waits until its source is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

from topolvm.config.lvmd import DeviceClass, LvmdConfig
from topolvm.lvm import validate
from topolvm.lvm.cowtable import (
    CowTableError,
    SnapshotInvalid,
    chunk_ranges,
    header_chunk_bytes,
    written_chunks,
)
from topolvm.lvm.errors import LvmError
from topolvm.lvm.report import LvRecord, Report, has_cow_snapshot, lv_uuid_of_dm
from topolvm.lvm.thinmap import (
    ThinDump,
    ThinDumpError,
    changed_ranges,
    dm_name,
    thin_target,
)
from topolvm.lvmd.capacity import PoolMissing, find_pool
from topolvm.lvmd.cowstate import cow_state, cow_states
from topolvm.lvmd.lvservice import LVService
from topolvm.lvmd.openers import open_state
from topolvm.lvmd.service import block_device, dm_uuid, resolve, rpc_of, translate
from topolvm.lvmd.state import LvmState
from topolvm.proto import volumedata_pb2 as pb
from topolvm.rpc import status
from topolvm.rpc.transport import Context

log = logging.getLogger(__name__)
SERVICE = "topolvm.lvmd.v1.VolumeData"
rpc = rpc_of(SERVICE)
BATCH = 1 << 16  # ranges per streamed message (about 1 MiB)


class VolumeDataService:
    def __init__(self, config: LvmdConfig, state: LvmState, lv: LVService | None = None):
        self.config = config
        self.state = state
        self.lv = lv  # CreateCut makes its snapshots
        self.runner = state.runner
        self._chunks: dict[str, int] = {}  # "vg/pool" -> chunk size: fixed for a pool's life

    async def _find(self, dc: DeviceClass, *names: str) -> list[LvRecord]:
        """The LVs ``names`` of ``dc``, all from one fresh report."""
        return _pick(await self.state.fresh(), dc, *names)

    async def _find_known(self, dc: DeviceClass, *names: str) -> list[LvRecord]:
        """The LVs ``names`` of ``dc`` as lvmd's model has them (its own changes in it), from a
        fresh report only when one is missing there: for what the model knows exactly (names,
        origins), a cut lvmd just made costs no report."""
        report = self.state.cached()
        if report is not None:
            with contextlib.suppress(status.NotFound, PoolMissing):
                return _pick(report, dc, *names)
        return await self._find(dc, *names)

    async def _lv_field(self, full_name: str, field: str) -> int:
        doc = await self.runner.report("lvs", full_name, "-o", field)
        try:
            raw = doc["report"][0]["lv"][0][field]
            return int(raw)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise status.Internal(f"lvs printed no {field} for {full_name}: {doc}") from e

    async def _chunk(self, vg: str, pool: str) -> int:
        key = f"{vg}/{pool}"
        if key not in self._chunks:
            self._chunks[key] = await self._lv_field(key, "chunk_size")
        return self._chunks[key]

    async def _known(self, dc: DeviceClass, name: str, uuid: bool) -> tuple[Report, LvRecord]:
        """The LV as lvmd's model has it (its own changes are in it), read again only when it
        is not there, or its uuid is asked for and neither the model nor its device-mapper
        device (sysfs) knows it: a copy's describe then costs
        no LVM command (a report took 0.25 s of a copy's set-up in the test bed's guests), and
        does not wait for a change that runs (a publish waited 1.3 s behind two cuts' removal
        in a move's start)."""
        report = self.state.cached()
        if report is None:
            async with self.state.lock:
                report = await self.state.current_locked()
        lv = next((x for x in find_pool(report, dc).lvs(report) if x.name == name), None)
        if lv is not None and not lv.uuid:  # one lvmd just made: its device says
            found = _uuid_of_device(lv)
            lv = replace(lv, uuid=found) if found else lv
        if lv is None or (uuid and not lv.uuid):
            report = await self.state.fresh()
            (lv,) = _pick(report, dc, name)
        return report, lv

    @rpc
    async def DescribeLV(
        self, request: pb.DescribeLVRequest, context: Context
    ) -> pb.DescribeLVResponse:
        dc = resolve(self.config, request.device_class)
        report, lv = await self._known(dc, validate.lv_name(request.name), request.with_uuid)
        path = f"/dev/{lv.vg_name}/{lv.name}"
        dev = block_device(path)
        if dev is None:
            raise status.FailedPrecondition(f"logical volume {lv.full_name} is not active")
        chunk = await self._chunk(lv.vg_name, lv.pool_lv) if lv.pool_lv else 0
        reply = pb.DescribeLVResponse(path=path, size_bytes=dev[2], thin=bool(lv.pool_lv),
                                      chunk_bytes=chunk, uuid=lv.uuid,
                                      cow_origin=has_cow_snapshot(report, lv))  # fmt: skip
        if request.check_snapshot and lv.origin and not lv.pool_lv:
            reply.invalid, reply.cow_bytes = await cow_state(self.runner, lv.full_name)
        return reply

    @rpc
    async def CreateCut(
        self, request: pb.CreateCutRequest, context: Context
    ) -> pb.CreateCutResponse:
        if self.lv is None:
            raise status.Unimplemented("this lvmd makes no cuts")
        dc = resolve(self.config, request.device_class)
        name = validate.lv_name(request.name)
        source = validate.lv_name(request.source_volume, "source_volume")
        tags = [validate.tag(t) for t in request.tags]
        if request.min_cow_bytes < 0:
            raise status.InvalidArgument(
                f"min_cow_bytes must not be negative, got {request.min_cow_bytes}"
            )
        try:
            snap, cow = await self.lv.snapshot(dc, name, source, tags, 0, "ro",
                                               request.min_cow_bytes or None)  # fmt: skip
        except status.Unimplemented as e:  # upstream's word for a thick source in a thin class
            # here: not "an lvmd without CreateCut", which topolvm-node would read it as
            raise status.InvalidArgument(f"{source}: {e.message}") from e
        if cow:
            log.info("thick cut", extra={"lv": snap.full_name, "cow_bytes": cow})
        return pb.CreateCutResponse(path=snap.path, cow_bytes=cow)

    @rpc
    async def OpenState(
        self, request: pb.OpenStateRequest, context: Context
    ) -> pb.OpenStateResponse:
        dc = resolve(self.config, request.device_class)
        _, lv = await self._known(dc, validate.lv_name(request.name), False)
        state = await open_state(self.runner, f"/dev/{lv.vg_name}/{lv.name}")
        return pb.OpenStateResponse(active=state.active, open_count=state.open_count,
                                    holders=state.holders, mounts=state.mounts)  # fmt: skip

    @status.stream_rpc(SERVICE, translate)
    async def ThinMappings(
        self, request: pb.ThinMappingsRequest, context: Context
    ) -> AsyncIterator[pb.ThinMappingsResponse]:
        dc = resolve(self.config, request.device_class)
        if not dc.is_thin:
            raise status.FailedPrecondition(f"device class {dc.name} is not thin")
        (lv,) = await self._find(dc, validate.lv_name(request.name))
        (dump,) = await self._dump(lv)
        mapped = sum(n for _, n in dump.ranges)
        ctx = {"lv": lv.full_name, "ranges": len(dump.ranges), "mapped_bytes": mapped}
        log.info("read thin mappings", extra=ctx)
        for reply in _batches(dump.ranges, dump.block_bytes):
            yield reply

    @status.stream_rpc(SERVICE, translate)
    async def ThinDelta(
        self, request: pb.ThinDeltaRequest, context: Context
    ) -> AsyncIterator[pb.ThinMappingsResponse]:
        dc = resolve(self.config, request.device_class)
        if not dc.is_thin:
            raise status.FailedPrecondition(f"device class {dc.name} is not thin")
        # from the model: a cut lvmd just made costs no report (a move's final cut, the pod
        # down); the device ids from the kernel's tables of the devices the copy reads
        lv, base = await self._find_known(dc, validate.lv_name(request.name),
                                          validate.lv_name(request.base, "base"))  # fmt: skip
        if (lv.vg_name, lv.pool_lv) != (base.vg_name, base.pool_lv) or not lv.pool_lv:
            raise status.FailedPrecondition(
                f"{lv.full_name} and {base.full_name} are not thin volumes of one pool"
            )
        dump, base_dump = await self._dump(lv, base, runs=True, kernel=True)
        ranges = changed_ranges(dump.runs, base_dump.runs, dump.block_bytes)
        ctx = {"lv": lv.full_name, "base": base.full_name, "ranges": len(ranges),
               "changed_bytes": sum(n for _, n in ranges)}  # fmt: skip
        log.info("read thin delta", extra=ctx)
        for reply in _batches(ranges, dump.block_bytes):
            yield reply

    @status.stream_rpc(SERVICE, translate)
    async def CowDelta(
        self, request: pb.CowDeltaRequest, context: Context
    ) -> AsyncIterator[pb.ThinMappingsResponse]:
        dc = resolve(self.config, request.device_class)
        if dc.is_thin:
            raise status.FailedPrecondition(f"device class {dc.name} is thin: see ThinDelta")
        lv, base = await self._find_known(dc, validate.lv_name(request.name),
                                          validate.lv_name(request.base, "base"))  # fmt: skip
        snapshots = [x for x in (lv, base) if x.origin]
        if (lv.origin or lv.name) != (base.origin or base.name) or not snapshots:
            raise status.FailedPrecondition(
                f"{lv.full_name} and {base.full_name} are not COW snapshots of one origin"
            )
        tables = []
        async with self.state.lock:  # no LVM change (a cut's removal) while the tables are read
            for snap in snapshots:
                tables.append(await self._table(snap))
            # then their state as LVM has it, for a snapshot the kernel dropped without managing
            # to mark its header invalid (an I/O error there): one lvs for both
            states = await cow_states(self.runner, [snap.full_name for snap in snapshots])
        for snap in snapshots:
            now = states[snap.full_name]
            # the model named them (lvmd's own cuts, no report since): LVM must agree that they
            # are these very cuts of this origin, or the delta would be another's
            if now.origin != snap.origin or (snap.uuid and now.uuid != snap.uuid):
                raise status.FailedPrecondition(
                    f"{snap.full_name} is no longer the cut lvmd made (origin {now.origin!r}, "
                    f"uuid {now.uuid}): LVM changed it outside lvmd"
                )
            if now.invalid:
                raise status.FailedPrecondition(
                    f"{snap.full_name} overflowed: its table is not kept"
                )
        chunk = max(c for c, _ in tables)  # both tables in the larger chunks (powers of two)
        ranges = chunk_ranges({n * c // chunk for c, chunks in tables for n in chunks}, chunk)
        log.info("read COW delta", extra={"lv": lv.full_name, "base": base.full_name,
                                          "ranges": len(ranges),
                                          "changed_bytes": sum(n for _, n in ranges)})  # fmt: skip
        for reply in _batches(ranges, chunk):
            yield reply

    async def _table(self, snap: LvRecord) -> tuple[int, set[int]]:
        """A COW snapshot's exception table (its state as LVM has it is the caller's to
        check)."""
        cow = f"/dev/mapper/{dm_name(snap.vg_name, snap.name, 'cow')}"
        try:
            table = await asyncio.to_thread(_cow_table, cow)
        except FileNotFoundError as e:
            raise status.FailedPrecondition(f"{snap.full_name} is not active: {e}") from e
        except SnapshotInvalid as e:
            raise status.FailedPrecondition(f"{snap.full_name}: {e}") from e
        except (OSError, CowTableError) as e:
            raise status.Internal(f"cannot read the exception table of {cow}: {e}") from e
        return table

    async def _thin_id(self, lv: LvRecord, kernel: bool) -> int:
        """``lv``'s thin device id: with ``kernel``, an active one's from the kernel's table of
        its device, which must be a thin volume of ``lv``'s pool and, where lvmd's model knows
        them, have the model's id and uuid; else (or inactive) LVM's."""
        dev = block_device(f"/dev/{lv.vg_name}/{lv.name}") if kernel else None
        if dev is None:
            if lv.thin_id is not None:
                return lv.thin_id
            return await self._lv_field(lv.full_name, "thin_id")
        try:
            table = await self.runner.run_tool("dmsetup", "table", dm_name(lv.vg_name, lv.name))
        except LvmError as e:
            raise status.Internal(f"cannot read the device table of {lv.full_name}: {e}") from e
        target = thin_target(table)
        pool = block_device(f"/dev/mapper/{dm_name(lv.vg_name, lv.pool_lv, 'tpool')}")
        uuid = _uuid_of_device(lv)  # None unless the device is named as this LV's
        pool_dev = f"{pool[0]}:{pool[1]}" if pool is not None else "-"
        if (target is None or target[0] != pool_dev or lv.thin_id not in (None, target[1])
                or (lv.uuid and uuid != lv.uuid)):  # fmt: skip
            raise status.FailedPrecondition(
                f"{lv.full_name}'s device (table {table.strip()!r}, uuid {uuid}) is not the thin "
                f"volume of pool {lv.pool_lv} that lvmd knows (id {lv.thin_id}, uuid "
                f"{lv.uuid}): LVM changed it outside lvmd"
            )  # fmt: skip
        return target[1]

    async def _dump(
        self, *lvs: LvRecord, runs: bool = False, kernel: bool = False
    ) -> list[ThinDump]:
        """The mappings of thin volumes of one pool, all from one metadata snapshot (their ids
        read under lvmd's lock, as that snapshot is: no change of lvmd's comes between);
        ``kernel``: see :meth:`_thin_id`."""
        first = lvs[0]
        tpool = dm_name(first.vg_name, first.pool_lv, "tpool")
        tmeta = f"/dev/mapper/{dm_name(first.vg_name, first.pool_lv + '_tmeta')}"
        async with self.state.lock:
            await self._reserve(tpool)
            try:
                dumps = [ThinDump(await self._thin_id(lv, kernel), runs=runs) for lv in lvs]
                for lv, dump in zip(lvs, dumps, strict=True):
                    try:
                        await self.runner.tool_lines("thin_dump", "--metadata-snap", "--dev-id",
                                                     str(dump.dev_id), tmeta,
                                                     on_line=dump.feed)  # fmt: skip
                    except ThinDumpError as e:
                        raise status.Internal(f"thin_dump of {lv.full_name}: {e}") from e
            finally:
                await self._release(tpool)
        for lv, dump in zip(lvs, dumps, strict=True):
            if not dump.found:
                raise status.Internal(f"thin_dump has no device {dump.dev_id} ({lv.full_name})")
        return dumps

    async def _reserve(self, tpool: str) -> None:
        try:
            await self.runner.run_tool("dmsetup", "message", tpool, "0", "reserve_metadata_snap")
        except LvmError as first:
            # a reservation an earlier, killed lvmd left: release it and take it again
            log.warning("releasing a metadata snapshot left reserved",
                        extra={"pool": tpool, "stderr": first.stderr})  # fmt: skip
            try:
                await self._release(tpool)
                await self.runner.run_tool("dmsetup", "message", tpool, "0",
                                           "reserve_metadata_snap")  # fmt: skip
            except LvmError as e:
                raise status.Unavailable(
                    f"cannot reserve the metadata snapshot of {tpool}: {e}"
                ) from first

    async def _release(self, tpool: str) -> None:
        try:
            await self.runner.run_tool("dmsetup", "message", tpool, "0", "release_metadata_snap")
        except LvmError as e:
            log.warning("could not release the metadata snapshot",
                        extra={"pool": tpool, "stderr": e.stderr})  # fmt: skip


def _uuid_of_device(lv: LvRecord) -> str | None:
    """The LV's uuid from its device-mapper device (sysfs), if the device its node points to
    is that LV's (not another that took a stale node's numbers)."""
    dev = block_device(f"/dev/{lv.vg_name}/{lv.name}")
    if dev is None:
        return None
    try:
        named = Path(f"/sys/dev/block/{dev[0]}:{dev[1]}/dm/name").read_text().strip()
    except OSError:
        return None
    if named != dm_name(lv.vg_name, lv.name):
        return None
    return lv_uuid_of_dm(dm_uuid(dev[0], dev[1]))


def _pick(report: Report, dc: DeviceClass, *names: str) -> list[LvRecord]:
    """The LVs ``names`` of ``dc`` in ``report``; NOT_FOUND names the first one missing."""
    lvs = {lv.name: lv for lv in find_pool(report, dc).lvs(report)}
    for name in names:
        if name not in lvs:
            raise status.NotFound(f"logical volume {name} is not found in device class {dc.name}")
    return [lvs[name] for name in names]


def _cow_table(path: str) -> tuple[int, set[int]]:
    """(chunk bytes, the origin's chunks in the table) of the COW device at ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)

        def read(offset: int, length: int) -> bytes:
            with mmap.mmap(-1, length) as buf:  # page-aligned, as O_DIRECT wants
                got = os.preadv(fd, [buf], offset)
                return buf[:got]

        chunk = header_chunk_bytes(read(0, mmap.PAGESIZE))
        return chunk, written_chunks(read, chunk, size)
    finally:
        os.close(fd)


def _batches(ranges: list[tuple[int, int]], chunk: int) -> Iterator[pb.ThinMappingsResponse]:
    """``ranges`` in parts of at most ``BATCH`` (one, empty, when there are none)."""
    for i in range(0, max(len(ranges), 1), BATCH):
        part = ranges[i : i + BATCH]
        yield pb.ThinMappingsResponse(offsets=[o for o, _ in part], lengths=[n for _, n in part],
                                      chunk_bytes=chunk)  # fmt: skip

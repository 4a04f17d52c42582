"""lvmd's ``proto.LVService``: create, remove, resize and snapshot logical volumes, with
upstream's semantics."""

from __future__ import annotations

import logging
from dataclasses import replace

from grpclib.const import Status

from topolvm.config.lvmd import DeviceClass, LvmdConfig
from topolvm.constants import SIZE_ALIGNMENT
from topolvm.lvm import validate
from topolvm.lvm.errors import InvalidInput, LvmError
from topolvm.lvm.report import (
    LV_FIELDS,
    LvRecord,
    Report,
    has_cow_snapshot,
    parse_report,
    with_lv,
    with_vg_free,
    without_lv,
)
from topolvm.lvmd.capacity import Pool, PoolMissing, cached_will_do, find_pool
from topolvm.lvmd.cowstate import cow_state
from topolvm.lvmd.service import block_device, resolve, rpc_of, to_pb
from topolvm.lvmd.state import LvmState
from topolvm.lvmd.thin_repair import inactive_thin, lost_thin, run_on_pool
from topolvm.proto import lvmd_pb2 as pb
from topolvm.rpc import status
from topolvm.rpc.transport import Context

log = logging.getLogger(__name__)
rpc = rpc_of("proto.LVService")


def _no_space(free: int, requested: int) -> status.StatusError:
    return status.ResourceExhausted(
        f"no enough space left on VG: free={free}, requested={requested}",
    )


class LVService:
    """``proto.LVService`` over the node's :class:`~topolvm.lvmd.state.LvmState`."""

    def __init__(self, config: LvmdConfig, state: LvmState):
        self.config = config
        self.state = state
        self.runner = state.runner

    async def _pool_locked(self, dc: DeviceClass) -> tuple[Report, Pool]:
        report = await self.state.current_locked()
        try:
            return report, find_pool(report, dc)
        except PoolMissing:
            if not self.state.dirty:
                raise
        return await self._pool_locked_reloaded(dc)

    async def _read_lv(self, vg: str, name: str, base: LvRecord) -> LvRecord:
        """``base`` as it is now: size and device from its device node, else from ``lvs``."""
        path = f"/dev/{vg}/{name}"
        dev = block_device(path)
        if dev is not None:
            major, minor, size = dev
            return replace(base, path=path, major=major, minor=minor, size=size)
        doc = await self.runner.report("lvs", f"{vg}/{name}", "-o", LV_FIELDS)
        lv = parse_report(doc).find_lv(vg, name)
        if lv is None:
            raise status.Internal(f"logical volume {vg}/{name} vanished")
        return lv

    @staticmethod
    def _rounding(pool: Pool, stripes: int) -> int:
        return max(1, pool.vg.extent_size) * max(1, stripes)

    @rpc
    async def CreateLV(self, request: pb.CreateLVRequest, context: Context) -> pb.CreateLVResponse:
        dc = resolve(self.config, request.device_class)
        name = validate.lv_name(request.name)
        tags = [validate.tag(t) for t in request.tags]
        size = validate.size_bytes(request.size_bytes)
        oc = self.config.option_class(request.lvcreate_option_class)
        if oc is not None:
            options, stripes = list(oc.options), 1
        else:
            options, stripes = [*dc.stripe_args(), *dc.lvcreate_options], dc.stripe or 1
        async with self.state.lock:
            # Checks in upstream's order: pool, free space, option class, alignment.
            report, pool = await self._pool_locked(dc)
            existing = report.find_lv(pool.vg.name, name)
            if existing is not None:
                report, pool, existing = await self._activated_or_lost(dc, report, pool, existing)
            if existing is not None:
                return self._existing(existing, pool, size, stripes)
            free = pool.free(report)
            if free < size and self.state.dirty:
                report, pool = await self._pool_locked_reloaded(dc)
                free = pool.free(report)
            if free < size:
                raise _no_space(free, size)
            if oc is None and request.lvcreate_option_class:
                raise status.Internal(
                    f"unsupported lvcreate-option-class target: {request.lvcreate_option_class}",
                )
            if not dc.is_thin and size % SIZE_ALIGNMENT:
                raise status.Internal(
                    f"cannot create volume as given size is not a multiple of {SIZE_ALIGNMENT} "
                    f"and could get rejected: size_bytes={size}",
                )
            argv = self._lvcreate_argv(pool, name, size, tags, options)
            # even if this RPC is cancelled, the next read refreshes
            was_exact = self.state.begin_change()
            try:
                await self._run_on_pool(pool, argv)
            except LvmError as e:
                if "already exists" in e.stderr:
                    report, pool = await self._pool_locked_reloaded(dc)
                    found = report.find_lv(pool.vg.name, name)
                    if found is not None:
                        return self._existing(found, pool, size, stripes)
                if e.no_space:
                    raise await self._lvm_no_space(dc, e, size) from e
                raise
            base = LvRecord(
                name=name,
                vg_name=pool.vg.name,
                uuid="",
                path=f"/dev/{pool.vg.name}/{name}",
                size=size,
                major=0,
                minor=0,
                origin="",
                pool_lv=pool.thin_pool.name if pool.thin_pool else "",
                tags=tuple(tags) or ("",),
                attr="",
            )
            lv = await self._read_lv(pool.vg.name, name, base)
            updated = with_lv(report, lv)
            if pool.thin_pool is None:
                updated = with_vg_free(updated, pool.vg.name, pool.vg.free - lv.size)
            # A plain linear LV takes exactly its size (read back from the device); options
            # (RAID, mirrors, ...) may take more, and a thin LV moves the pool's usage.
            linear = pool.thin_pool is None and not options
            if linear:
                self.state.record_linear(lv.full_name)
            self.state.update_locked(updated, capacity_exact=was_exact and linear)
        return pb.CreateLVResponse(volume=to_pb(lv, full=False))

    async def _activated_or_lost(
        self, dc: DeviceClass, report: Report, pool: Pool, lv: LvRecord
    ) -> tuple[Report, Pool, LvRecord | None]:
        """A create found ``lv`` by its name: an inactive thin volume of this pool is activated,
        or removed when its pool lost it (:func:`~topolvm.lvmd.thin_repair.lost_thin`); then
        the state is read again. Returns the report, the pool and the LV, None once removed."""
        if pool.thin_pool is None or not inactive_thin(lv, pool.thin_pool.name):
            return report, pool, lv
        self.state.begin_change()
        if await lost_thin(self.runner.run, lv):
            await self.runner.run("lvremove", "-f", lv.full_name)
        report, pool = await self._pool_locked_reloaded(dc)
        return report, pool, report.find_lv(pool.vg.name, lv.name)

    async def _run_on_pool(self, pool: Pool, argv: list[str]) -> None:
        """Run a command that needs ``pool`` active (see :mod:`topolvm.lvmd.thin_repair`)."""
        thin = pool.thin_pool.name if pool.thin_pool else None
        await run_on_pool(self.runner.run, pool.vg.name, thin, argv)

    async def _lvm_no_space(
        self, dc: DeviceClass, e: LvmError, requested: int
    ) -> status.StatusError:
        """LVM refused an allocation our model allowed (e.g. RAID options): report real numbers."""
        log.warning("LVM refused the allocation", extra={"stderr": e.stderr, "argv": e.argv})
        report, pool = await self._pool_locked_reloaded(dc)
        return _no_space(pool.free(report), requested)

    async def _pool_locked_reloaded(self, dc: DeviceClass) -> tuple[Report, Pool]:
        report = await self.state.reload_locked()
        return report, find_pool(report, dc)

    def _existing(self, lv: LvRecord, pool: Pool, size: int, stripes: int) -> pb.CreateLVResponse:
        """CreateLV for a name that exists: same class and size is success, else ALREADY_EXISTS."""
        same_pool = lv.pool_lv == (pool.thin_pool.name if pool.thin_pool else "")
        if same_pool and size <= lv.size < size + self._rounding(pool, stripes):
            log.info("logical volume exists already", extra={"lv": lv.name, "size": lv.size})
            return pb.CreateLVResponse(volume=to_pb(lv, full=False))
        raise status.AlreadyExists(
            f"logical volume {lv.full_name} already exists with size {lv.size}"
            f"{'' if same_pool else ' in another pool'}; requested {size}",
        )

    @staticmethod
    def _lvcreate_argv(
        pool: Pool, name: str, size: int, tags: list[str], options: list[str]
    ) -> list[str]:
        if pool.thin_pool is None:
            argv = ["lvcreate", "-n", name, "-L", f"{size}b", "-W", "y", "-y"]
        else:
            target = f"{pool.vg.name}/{pool.thin_pool.name}"
            argv = ["lvcreate", "-T", target, "-n", name, "-V", f"{size}b", "-W", "y", "-y"]
        for t in tags:
            argv += ["--addtag", t]
        argv += options
        if pool.thin_pool is None:
            argv.append(pool.vg.name)
        return argv

    @rpc
    async def RemoveLV(self, request: pb.RemoveLVRequest, context: Context) -> pb.Empty:
        dc = resolve(self.config, request.device_class)
        name = validate.lv_name(request.name)
        async with self.state.lock:
            report = await self.state.current_locked()
            vg = report.vgs.get(dc.volume_group)
            if vg is None:
                report = await self.state.reload_locked()
                vg = report.vgs.get(dc.volume_group)
                if vg is None:
                    raise status.NotFound(
                        f"volume group {dc.volume_group} not found",
                    )
            lv = report.find_lv(vg.name, name)
            if lv is not None and lv.is_thin_pool:
                raise status.FailedPrecondition(
                    f"{lv.full_name} is a thin pool; lvmd never removes thin pools",
                )
            if lv is not None and has_cow_snapshot(report, lv):
                raise status.FailedPrecondition(
                    f"{lv.full_name} has a COW snapshot (a copy reads it); lvmd does not "
                    "remove it with its snapshots: remove the snapshot first",
                )
            was_exact = self.state.begin_change()
            try:
                await self.runner.run("lvremove", "-f", f"{vg.name}/{name}")
            except LvmError as e:
                if e.not_found:
                    raise status.NotFound(f"logical volume {vg.name}/{name} not found") from e
                raise status.StatusError(code=Status.UNKNOWN, message=str(e)) from e
            updated = without_lv(report, vg.name, name)
            if lv is not None and not lv.pool_lv:
                updated = with_vg_free(updated, vg.name, vg.free + lv.size)
            exact = was_exact and lv is not None and self.state.is_linear(lv)
            self.state.update_locked(updated, capacity_exact=exact)
        return pb.Empty()

    @rpc
    async def ResizeLV(self, request: pb.ResizeLVRequest, context: Context) -> pb.ResizeLVResponse:
        dc = resolve(self.config, request.device_class)
        name = validate.lv_name(request.name)
        if request.size_bytes < 0:
            raise InvalidInput(f"size_bytes must not be negative, got {request.size_bytes}")
        size = request.size_bytes  # 0 (or any size <= current) only reports the current size
        async with self.state.lock:
            report, pool = await self._pool_locked(dc)
            lv = self._find_in_pool(report, pool, name)
            if lv is None and self.state.dirty:
                report, pool = await self._pool_locked_reloaded(dc)
                lv = self._find_in_pool(report, pool, name)
            if lv is None:
                raise status.NotFound(f"logical volume {name} is not found")
            if size <= lv.size:
                return pb.ResizeLVResponse(size_bytes=lv.size)
            if has_cow_snapshot(report, lv):
                raise status.FailedPrecondition(
                    f"logical volume {lv.full_name} has a COW snapshot (a copy reads it): it can "
                    "grow once the copy is done and the snapshot removed"
                )
            delta = size - lv.size
            free = pool.free(report)
            if free < delta and self.state.dirty:
                report, pool = await self._pool_locked_reloaded(dc)
                free = pool.free(report)
            if free < delta:
                raise _no_space(free, delta)
            self.state.begin_change()
            try:
                await self._run_on_pool(pool, ["lvresize", "-L", f"{size}b", lv.full_name])
            except LvmError as e:
                if e.no_space:
                    raise await self._lvm_no_space(dc, e, delta) from e
                raise
            new = await self._read_lv(lv.vg_name, lv.name, lv)
            updated = with_lv(report, new)
            if not new.pool_lv:
                updated = with_vg_free(updated, lv.vg_name, pool.vg.free - (new.size - lv.size))
            self.state.update_locked(updated)
        return pb.ResizeLVResponse(size_bytes=new.size)

    @staticmethod
    def _find_in_pool(report: Report, pool: Pool, name: str) -> LvRecord | None:
        lv = report.find_lv(pool.vg.name, name)
        if lv is None or lv.is_thin_pool:
            return None
        if pool.thin_pool is not None and lv.pool_lv != pool.thin_pool.name:
            return None
        return lv

    @rpc
    async def CreateLVSnapshot(
        self, request: pb.CreateLVSnapshotRequest, context: Context
    ) -> pb.CreateLVSnapshotResponse:
        dc = resolve(self.config, request.device_class)
        name = validate.lv_name(request.name)
        source = validate.lv_name(request.source_volume, "source_volume")
        tags = [validate.tag(t) for t in request.tags]
        if request.size_bytes < 0:
            raise InvalidInput(f"size_bytes must not be negative, got {request.size_bytes}")
        if request.access_type not in ("ro", "rw"):
            raise InvalidInput(f"access_type must be 'ro' or 'rw', got {request.access_type!r}")
        snap, _ = await self.snapshot(dc, name, source, tags, request.size_bytes,
                                      request.access_type)  # fmt: skip
        return pb.CreateLVSnapshotResponse(snapshot=to_pb(snap, full=False))

    async def snapshot(
        self, dc: DeviceClass, name: str, source: str, tags: list[str], size: int, access: str,
        min_cow: int | None = None,
    ) -> tuple[LvRecord, int]:  # fmt: skip
        """A snapshot of ``source`` (validated arguments) and its copy-on-write area (0 for a
        thin one). A thick one's area is as large as its origin, or with ``min_cow`` as large
        as the room left if that is less (at least ``min_cow``; see volumedata.proto)."""
        async with self.state.lock:
            report, pool = await self._pool_locked(dc)
            cached = self.state.dirty and cached_will_do(report, pool, dc, source, name)
            if self.state.dirty and not cached:
                report, pool = await self._pool_locked_reloaded(dc)
            args = (dc, name, source, tags, size, access, min_cow)
            try:
                return await self._snapshot_from(report, pool, *args)
            except LvmError as e:
                if not (cached and e.already_exists):
                    raise
            # the name is taken by an LV the model lacks (a create that failed for lvmd, not for
            # LVM): decide again from LVM's state (a retry finds its snapshot)
            log.info("snapshot name taken by an LV lvmd had not seen; reading LVM's state",
                     extra={"lv": name})  # fmt: skip
            report, pool = await self._pool_locked_reloaded(dc)
            return await self._snapshot_from(report, pool, *args)

    async def _snapshot_from(
        self, report: Report, pool: Pool, dc: DeviceClass, name: str, source: str,
        tags: list[str], size: int, access: str, min_cow: int | None,
    ) -> tuple[LvRecord, int]:  # fmt: skip
        """:meth:`snapshot` from ``report``; the caller holds the state's lock."""
        src = report.find_lv(pool.vg.name, source)
        if src is None:
            raise status.NotFound(f"source logical volume {source} is not found")
        if dc.is_thin and not src.is_thin_volume:
            raise status.Unimplemented("snapshot can be created for only thin volumes")
        if not dc.is_thin and src not in pool.lvs(report):
            raise status.InvalidArgument(f"{src.full_name} is not a volume of device class "
                                         f"{dc.name}")  # fmt: skip
        if not dc.is_thin and src.origin:
            raise status.InvalidArgument(f"{src.full_name} is itself a COW snapshot")
        desired = size or src.size
        if desired < src.size:
            raise status.OutOfRange(
                f"requested size {desired} is smaller than the source volume size {src.size}",
            )
        if not dc.is_thin:
            desired = src.size  # a COW snapshot reads as large as its origin, no larger
        existing = report.find_lv(pool.vg.name, name)
        if existing is not None:
            report, pool, existing = await self._activated_or_lost(dc, report, pool, existing)
        if existing is not None and existing.origin == source and min_cow:
            if dc.is_thin:
                return existing, 0
            return existing, (await cow_state(self.runner, existing.full_name))[1]
        if existing is not None:
            if existing.origin == source and existing.size >= desired:
                return existing, 0 if dc.is_thin else existing.size
            raise status.AlreadyExists(
                f"logical volume {existing.full_name} already exists",
            )
        free = pool.free(report)
        cow = desired
        if not dc.is_thin and min_cow:
            # a quarter of the room (other cuts may come: a pod's other claims, a drain's
            # other moves), at least min_cow, at most as large as the origin (then with
            # LVM's own overhead: room four times the origin's size holds it); in extents
            step = pool.vg.extent_size or (4 << 20)
            cow = min(-(-max(min_cow, free // 4, step) // step) * step, desired)
            if cow > free:
                raise _no_space(free, min_cow)
        if free < cow:
            raise _no_space(free, desired)
        snap = await self._snapshot_locked(pool, src, name, tags, desired, access, cow)
        self.state.update_locked(with_lv(report, snap))
        return snap, 0 if dc.is_thin else cow

    async def _snapshot_locked(
        self, pool: Pool, src: LvRecord, name: str, tags: list[str], desired: int, access: str,
        cow: int,
    ) -> LvRecord:  # fmt: skip
        vg = pool.vg.name
        thin = pool.thin_pool is not None
        # A thick (COW) snapshot as large as its origin can never fill up and become invalid;
        # it is meant to live only while a copy reads it (docs/mobility.md).
        # 512 KiB chunks (LVM's largest; its default is 4 KiB): a copy reads the snapshot
        # in 1 MiB pieces, and each chunk is a lookup in dm-snapshot (4 KiB chunks made a
        # copy's reads cost 4 times the CPU in the guests of the test bed)
        whole = cow >= src.size
        size_args = ["-k", "n"] if thin else ["-c", "512k", *(
            ["-l", "100%ORIGIN"] if whole else ["-L", f"{cow}b"])]  # fmt: skip
        grow = thin and desired > src.size
        # read-only from its creation (one LVM command less) unless it grows first
        permission = ["-p", "r"] if access == "ro" and not grow else []
        argv = ["lvcreate", "-s", *size_args, *permission, "-n", name, src.full_name]
        for t in tags:
            argv += ["--addtag", t]
        self.state.begin_change()
        try:
            await self._run_on_pool(pool, argv)
        except LvmError as e:
            if e.no_space:
                raise _no_space(pool.vg.free, src.size) from e
            raise
        path = f"/dev/{vg}/{name}"
        try:
            if grow:
                await self.runner.run("lvresize", "-L", f"{desired}b", f"{vg}/{name}")
            if access == "ro" and not permission:
                await self.runner.run("lvchange", "-p", "r", f"{vg}/{name}")
            if thin and block_device(path) is None:  # lvcreate -k n activates it, else now
                await self.runner.run("lvchange", "-k", "n", "-a", "y", f"{vg}/{name}")
        except LvmError:
            log.warning("snapshot set-up failed; removing it", extra={"lv": name})
            try:
                await self.runner.run("lvremove", "-f", f"{vg}/{name}")
            except LvmError:
                log.exception("could not remove the half-made snapshot", extra={"lv": name})
            raise
        base = replace(
            src,
            name=name,
            path=path,
            origin=src.name,
            tags=tuple(tags) or ("",),
            attr="",
            uuid="",
            thin_id=None,
        )
        return await self._read_lv(vg, name, base)

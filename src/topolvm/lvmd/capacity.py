"""Capacity math, identical to upstream TopoLVM's so the numbers match on the same VG."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from topolvm.config.lvmd import DeviceClass, LvmdConfig
from topolvm.lvm.report import LvRecord, Report, VolumeGroup


def thin_used(lvs: Iterable[LvRecord], pool: str) -> int:
    """Sum of the virtual sizes of every LV (volume or snapshot) in ``pool``."""
    return sum(lv.size for lv in lvs if lv.pool_lv == pool)


def overprovisioned_free(pool_size: int, ratio: float, used: int) -> int:
    """``floor(ratio * pool size) - used``, floored at 0 (the pool's real usage is ignored)."""
    virtual = math.floor(ratio * pool_size)
    return virtual - used if virtual > used else 0


def thick_reported_free(vg: VolumeGroup, dc: DeviceClass) -> int:
    """Free bytes shown to the scheduler for a thick class: VG free minus the spare."""
    return max(0, vg.free - dc.spare_bytes)


@dataclass(frozen=True)
class Pool:
    """What a device class allocates from, as seen in one report."""

    dc: DeviceClass
    vg: VolumeGroup
    thin_pool: LvRecord | None  # set for thin classes

    def lvs(self, report: Report) -> list[LvRecord]:
        """LVs that belong to this class: thick → all but thin pools and thin volumes."""
        if self.thin_pool is None:
            return [
                lv
                for lv in report.lvs_of(self.vg.name)
                if not lv.is_thin_pool and not lv.is_thin_volume
            ]
        name = self.thin_pool.name
        # a thin volume lvmd made since the last report has no lv_attr yet, its pool it has
        return [
            lv
            for lv in report.lvs_of(self.vg.name)
            if lv.pool_lv == name and (lv.is_thin_volume or not lv.attr)
        ]

    def free(self, report: Report) -> int:
        """Allocatable bytes used to admit CreateLV/ResizeLV (no spare subtracted)."""
        if self.thin_pool is None:
            return self.vg.free
        used = thin_used(report.lvs_of(self.vg.name), self.thin_pool.name)
        return overprovisioned_free(self.thin_pool.size, self.dc.pool.overprovision_ratio, used)

    def free_minus_spare(self, report: Report) -> int:
        """GetFreeBytes: pool free minus spare, for thick and thin alike."""
        return max(0, self.free(report) - self.dc.spare_bytes)


class PoolMissing(LookupError):
    """The VG or thin pool of a device class does not exist."""


def find_pool(report: Report, dc: DeviceClass) -> Pool:
    vg = report.vgs.get(dc.volume_group)
    if vg is None:
        raise PoolMissing(f"volume group {dc.volume_group!r} of device-class {dc.name!r} not found")
    if not dc.is_thin:
        return Pool(dc, vg, None)
    pool = report.find_lv(vg.name, dc.pool.name)
    if pool is None or not pool.is_thin_pool:
        raise PoolMissing(
            f"thin pool {dc.pool.name!r} of device-class {dc.name!r} not found "
            f"in volume group {vg.name!r}"
        )
    return Pool(dc, vg, pool)


@dataclass(frozen=True)
class ThinPoolUsage:
    data_percent: float
    metadata_percent: float
    overprovision_bytes: int
    size_bytes: int


@dataclass(frozen=True)
class ClassCapacity:
    device_class: str
    free_bytes: int
    size_bytes: int
    thin_pool: ThinPoolUsage | None = None


@dataclass(frozen=True)
class Capacity:
    """The content of one Watch message: default-class free bytes and one item per class."""

    free_bytes: int
    items: tuple[ClassCapacity, ...]


def capacity(report: Report, config: LvmdConfig) -> Capacity:
    """Per-class capacity in VG report order, as upstream builds its Watch messages."""
    thin_by_target = {dc.target: dc for dc in config.device_classes if dc.is_thin}
    thick_by_vg = {dc.volume_group: dc for dc in config.device_classes if not dc.is_thin}
    items: list[ClassCapacity] = []
    default_free = 0
    for vg in report.vgs.values():
        lvs = report.lvs_of(vg.name)
        for lv in lvs:
            dc = thin_by_target.get(f"{vg.name}/{lv.name}") if lv.is_thin_pool else None
            if dc is None:
                continue
            over = overprovisioned_free(
                lv.size, dc.pool.overprovision_ratio, thin_used(lvs, lv.name)
            )
            usage = ThinPoolUsage(
                data_percent=lv.data_percent or 0.0,
                metadata_percent=lv.metadata_percent or 0.0,
                overprovision_bytes=over,
                size_bytes=lv.size,
            )
            items.append(ClassCapacity(dc.name, vg.free, vg.size, usage))
            if dc.default:
                default_free = over
        thick = thick_by_vg.get(vg.name)
        if thick is not None:
            free = thick_reported_free(vg, thick)
            items.append(ClassCapacity(thick.name, free, vg.size))
            if thick.default:
                default_free = free
    return Capacity(default_free, tuple(items))


def cached_will_do(report: Report, pool: Pool, dc: DeviceClass, source: str, name: str) -> bool:
    """Whether a snapshot of ``source`` named ``name`` may be made from the model as it stands,
    with lvmd's own changes since the last report in it. The source's lv_attr decides what it
    is, and an LV lvmd changed since carries none yet; a name taken must be read as LVM has it
    (active or not); a thick snapshot's copy-on-write area is sized from the VG's free room,
    which lvmd's own changes leave unknown. So: a thin class only. A thin cut right after
    another (a move's claims, with the pod down) then costs one LVM command, not a report
    first."""
    src = report.find_lv(pool.vg.name, source)
    taken = report.find_lv(pool.vg.name, name)
    return dc.is_thin and src is not None and bool(src.attr) and (taken is None or bool(taken.attr))

"""Typed views of LVM JSON reports (``fullreport``, ``vgs``, ``lvs``).

Every value in an LVM JSON report is a string; sizes are requested in bytes without suffix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from topolvm.lvm.errors import ReportError

VG_FIELDS = "vg_name,vg_uuid,vg_size,vg_free,vg_extent_size"
LV_FIELDS = (
    "lv_uuid,lv_name,lv_full_name,lv_path,lv_size,lv_kernel_major,lv_kernel_minor,origin,"
    "origin_size,pool_lv,lv_tags,lv_attr,vg_name,data_percent,metadata_percent"
)
# a thin volume's device id (a segment's field): thin_dump's --dev-id, without an lvs per volume
SEG_FIELDS = "lv_uuid,thin_id"
FULLREPORT_ARGS = (
    "fullreport",
    "--configreport", "vg", "-o", VG_FIELDS,
    "--configreport", "lv", "-o", LV_FIELDS,
    "--configreport", "pv", "-o,",
    "--configreport", "pvseg", "-o,",
    "--configreport", "seg", "-o", SEG_FIELDS,
)  # fmt: skip


@dataclass(frozen=True)
class VolumeGroup:
    name: str
    uuid: str
    size: int
    free: int
    extent_size: int


@dataclass(frozen=True)
class LvRecord:
    name: str
    vg_name: str
    uuid: str
    path: str
    size: int
    major: int
    minor: int
    origin: str
    pool_lv: str
    tags: tuple[str, ...]
    attr: str
    data_percent: float | None = None
    metadata_percent: float | None = None
    thin_id: int | None = None  # a thin volume's device id in its pool (fullreport only)

    @property
    def full_name(self) -> str:
        return f"{self.vg_name}/{self.name}"

    @property
    def is_thin_pool(self) -> bool:
        return self.attr[:1] == "t"

    @property
    def is_thin_volume(self) -> bool:
        return self.attr[:1] == "V"


@dataclass(frozen=True)
class Report:
    """The state of all VGs on the host as one consistent snapshot."""

    vgs: Mapping[str, VolumeGroup] = field(default_factory=dict)
    lvs: Mapping[str, tuple[LvRecord, ...]] = field(default_factory=dict)  # by VG name

    def lvs_of(self, vg: str) -> tuple[LvRecord, ...]:
        return self.lvs.get(vg, ())

    def find_lv(self, vg: str, name: str) -> LvRecord | None:
        for lv in self.lvs_of(vg):
            if lv.name == name:
                return lv
        return None


def _str(row: Mapping[str, Any], key: str) -> str:
    value = row.get(key, "")
    if not isinstance(value, str):
        raise ReportError(f"field {key} is not a string: {value!r}")
    return value


def _uint(row: Mapping[str, Any], key: str) -> int:
    raw = _str(row, key)
    if raw == "":
        return 0
    try:
        value = int(raw)
    except ValueError as e:
        raise ReportError(f"field {key} is not an integer: {raw!r}") from e
    if value < 0:
        raise ReportError(f"field {key} is negative: {raw!r}")
    return value


def _dev_number(row: Mapping[str, Any], key: str) -> int:
    # Inactive LVs report -1 (upstream crashed on this once: topolvm#559); treat as 0.
    try:
        value = int(_str(row, key))
    except ValueError:
        return 0
    return max(value, 0)


def _percent(row: Mapping[str, Any], key: str) -> float | None:
    raw = _str(row, key)
    if raw == "":
        return None
    try:
        return float(raw)
    except ValueError as e:
        raise ReportError(f"field {key} is not a number: {raw!r}") from e


def parse_vg(row: Mapping[str, Any]) -> VolumeGroup:
    return VolumeGroup(
        name=_str(row, "vg_name"),
        uuid=_str(row, "vg_uuid"),
        size=_uint(row, "vg_size"),
        free=_uint(row, "vg_free"),
        extent_size=_uint(row, "vg_extent_size"),
    )


def parse_lv(row: Mapping[str, Any]) -> LvRecord:
    size = _uint(row, "lv_size")
    origin = _str(row, "origin")
    pool = _str(row, "pool_lv")
    if origin and not pool:
        # A classic (non-thin) snapshot reports its COW size; its usable size is the origin's.
        size = _uint(row, "origin_size") or size
    tags = _str(row, "lv_tags")
    return LvRecord(
        name=_str(row, "lv_name"),
        vg_name=_str(row, "vg_name"),
        uuid=_str(row, "lv_uuid"),
        path=_str(row, "lv_path"),
        size=size,
        major=_dev_number(row, "lv_kernel_major"),
        minor=_dev_number(row, "lv_kernel_minor"),
        origin=origin,
        pool_lv=pool,
        tags=tuple(tags.split(",")),
        attr=_str(row, "lv_attr"),
        data_percent=_percent(row, "data_percent"),
        metadata_percent=_percent(row, "metadata_percent"),
    )


def _sections(doc: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    sections = doc.get("report")
    if not isinstance(sections, list):
        raise ReportError("report has no 'report' list")
    for section in sections:
        if not isinstance(section, dict):
            raise ReportError("report section is not an object")
        yield section


def _rows(section: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    rows = section.get(key, [])
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ReportError(f"report section {key!r} is not a list of objects")
    return rows


def parse_report(doc: Mapping[str, Any]) -> Report:
    """Parse ``fullreport`` (one section per VG) or a ``vgs``/``lvs`` report."""
    vgs: dict[str, VolumeGroup] = {}
    lvs: dict[str, list[LvRecord]] = {}
    thin_ids: dict[str, int] = {}  # lv_uuid -> thin_id, from the segments
    for section in _sections(doc):
        for row in _rows(section, "vg"):
            vg = parse_vg(row)
            vgs[vg.name] = vg
            lvs.setdefault(vg.name, [])
        for row in _rows(section, "lv"):
            lv = parse_lv(row)
            lvs.setdefault(lv.vg_name, []).append(lv)
        for row in _rows(section, "seg"):
            if _str(row, "thin_id"):
                thin_ids[_str(row, "lv_uuid")] = _uint(row, "thin_id")
    return Report(vgs=vgs, lvs={
        k: tuple(replace(lv, thin_id=thin_ids.get(lv.uuid)) if lv.uuid in thin_ids else lv
                 for lv in v)
        for k, v in lvs.items()})  # fmt: skip


def lv_uuid_of_dm(dm_uuid: str) -> str | None:
    """The ``lv_uuid`` (LVM's dashed form) of an LV's top device-mapper device, from its dm
    uuid (``LVM-`` + the VG's 32 characters + the LV's 32; a layer's ends in ``-<layer>``);
    None for anything else."""
    body = dm_uuid.strip()
    if not body.startswith("LVM-") or len(body) != 4 + 64 or not body[4:].isalnum():
        return None
    lv = body[36:]
    parts, at = [], 0
    for width in (6, 4, 4, 4, 4, 4, 6):
        parts.append(lv[at : at + width])
        at += width
    return "-".join(parts)


def has_cow_snapshot(report: Report, lv: LvRecord) -> bool:
    """Whether a thick (COW) snapshot of ``lv`` exists: LVM then refuses to resize it, and
    would remove the snapshot with it."""
    return not lv.pool_lv and any(
        x.origin == lv.name and not x.pool_lv for x in report.lvs_of(lv.vg_name)
    )


def with_lv(report: Report, lv: LvRecord) -> Report:
    """A copy of ``report`` in which ``lv`` is added or replaces the LV of the same name."""
    lvs = dict(report.lvs)
    lvs[lv.vg_name] = (*(x for x in report.lvs_of(lv.vg_name) if x.name != lv.name), lv)
    return Report(vgs=report.vgs, lvs=lvs)


def without_lv(report: Report, vg: str, name: str) -> Report:
    lvs = dict(report.lvs)
    lvs[vg] = tuple(x for x in report.lvs_of(vg) if x.name != name)
    return Report(vgs=report.vgs, lvs=lvs)


def with_vg_free(report: Report, vg: str, free: int) -> Report:
    old = report.vgs[vg]
    vgs = dict(report.vgs)
    vgs[vg] = VolumeGroup(
        old.name, old.uuid, old.size, max(0, min(free, old.size)), old.extent_size
    )
    return Report(vgs=vgs, lvs=report.lvs)

"""A COW snapshot's state as LVM has it now: overflowed or not, its copy-on-write area, its
origin and uuid (one ``lvs`` for several)."""

from __future__ import annotations

from typing import NamedTuple

from topolvm.lvm.command import LvmRunner
from topolvm.rpc import status


class CowState(NamedTuple):
    invalid: bool  # overflowed: lv_attr state I or S, or its area full
    cow_bytes: int  # its copy-on-write area
    origin: str
    uuid: str


async def cow_state(runner: LvmRunner, full_name: str) -> tuple[bool, int]:
    """Whether the COW snapshot ``full_name`` overflowed (``lv_attr`` state ``I``, invalid, or
    ``S``, invalid and suspended; or its area full), and its copy-on-write area: read now."""
    state = (await cow_states(runner, [full_name]))[full_name]
    return state.invalid, state.cow_bytes


async def cow_states(runner: LvmRunner, full_names: list[str]) -> dict[str, CowState]:
    """The state of each COW snapshot of ``full_names`` (with its origin and uuid, as LVM has
    them now), from one ``lvs``."""
    fields = "lv_full_name,lv_attr,lv_size,snap_percent,origin,lv_uuid"
    doc = await runner.report("lvs", *full_names, "-o", fields)
    out: dict[str, CowState] = {}
    try:
        for row in doc["report"][0]["lv"]:
            attr, size = str(row["lv_attr"]), int(row["lv_size"])
            full = float(row.get("snap_percent") or 0) >= 100.0
            out[str(row["lv_full_name"])] = CowState(
                attr[4:5] in ("I", "S") or full, size, str(row.get("origin") or ""),
                str(row.get("lv_uuid") or ""),
            )  # fmt: skip
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise status.Internal(f"lvs printed no state for {', '.join(full_names)}: {doc}") from e
    if missing := [n for n in full_names if n not in out]:
        raise status.Internal(f"lvs printed no state for {', '.join(missing)}: {doc}")
    return out

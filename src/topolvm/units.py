"""Byte counts as people read them (one helper for every component's messages)."""

from __future__ import annotations

_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def _unit(n: float) -> tuple[str, int]:
    for unit, size in _UNITS:
        if abs(n) >= size:
            return unit, size
    return "B", 1


def human(n: float) -> str:
    """Bytes in binary units with one decimal (``1.5 GiB``); below 1 KiB whole bytes."""
    unit, size = _unit(n)
    return f"{int(n)} B" if size == 1 else f"{n / size:.1f} {unit}"


def apart(have: int, need: int) -> tuple[str, str]:
    """Two byte counts a message sets side by side (free space and what a volume needs), in
    one unit and with as many decimals as it takes to tell them apart (up to 3); when even
    those read the same, each with its exact bytes: "17.0 GiB free; needs 17.0 GiB" must
    never stand for 18253611008 bytes against 18253611520."""
    unit, size = _unit(max(abs(have), abs(need)))
    if size == 1:
        return f"{int(have)} B", f"{int(need)} B"
    for digits in (1, 2, 3):
        a, b = f"{have / size:.{digits}f} {unit}", f"{need / size:.{digits}f} {unit}"
        if a != b or have == need:
            return a, b
    return f"{a} ({have} bytes)", f"{b} ({need} bytes)"

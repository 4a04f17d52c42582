"""Byte counts as people read them (one helper for every component's messages)."""

from __future__ import annotations


def human(n: float) -> str:
    """Bytes in binary units with one decimal (``1.5 GiB``); below 1 KiB whole bytes."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"

"""The chunks of an origin written since a thick (COW) snapshot of it was taken, from the
snapshot's exception table (pure; the kernel's persistent store, dm-snapshot's
``dm-snap-persistent.c``, documented in the kernel's device-mapper/snapshot.rst).

A thick snapshot's copy-on-write device (``/dev/mapper/<vg>-<lv>-cow``) is laid out in chunks
of the snapshot's chunk size:

- chunk 0, the header: ``magic`` ("SnAp" on disk), ``valid`` (0 once the snapshot overflowed),
  ``version`` (1), ``chunk_size`` (in 512-byte sectors), each a little-endian u32;
- then metadata areas, each one chunk of ``(old_chunk, new_chunk)`` little-endian u64 pairs (an
  exception: the origin's chunk ``old_chunk`` was written, and its earlier bytes are in the COW
  device's chunk ``new_chunk``), followed by the ``chunk_size * 512 / 16`` data chunks those
  pairs point to. Area ``i`` starts at chunk ``1 + i * (pairs per area + 1)``.

The table ends at the first pair whose ``new_chunk`` is 0 (chunk 0 is the header, never data);
a full area goes on in the next. Every chunk of the origin written after the snapshot was taken
is in the table (the kernel commits a pair before the origin's write completes), and so is
every chunk written to the snapshot itself: two snapshots of one origin differ at most in the
chunks listed in their two tables.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

SECTOR = 512
MAGIC = 0x70416E53  # b"SnAp" read as a little-endian u32
VERSION = 1
_HEADER = struct.Struct("<IIII")
_PAIR = struct.Struct("<QQ")


class CowTableError(ValueError):
    """The COW device does not hold a valid persistent exception store."""


class SnapshotInvalid(CowTableError):
    """The snapshot overflowed: the kernel dropped it, and its table is no longer kept."""


def header_chunk_bytes(header: bytes) -> int:
    """The chunk size the header at the start of a COW device names, in bytes. Raises
    :class:`CowTableError` for anything but a valid version-1 store of a live snapshot."""
    if len(header) < _HEADER.size:
        raise CowTableError(f"the header is {len(header)} bytes, not {_HEADER.size}")
    magic, valid, version, chunk_sectors = _HEADER.unpack_from(header)
    if magic != MAGIC:
        raise CowTableError(f"no snapshot header (magic {magic:#x}, not {MAGIC:#x})")
    if version != VERSION:
        raise CowTableError(f"exception store version {version}, not {VERSION}")
    if not valid:
        raise SnapshotInvalid("the snapshot is invalid (its copy-on-write area overflowed)")
    if chunk_sectors <= 0 or chunk_sectors & (chunk_sectors - 1):
        raise CowTableError(f"chunk size of {chunk_sectors} sectors is not a power of two")
    return int(chunk_sectors) * SECTOR


def written_chunks(read: Callable[[int, int], bytes], chunk_bytes: int, cow_bytes: int) -> set[int]:
    """The origin's chunks in the exception table; ``read(offset, length)`` reads the COW
    device (``cow_bytes`` long, ``chunk_bytes`` its chunk size from the header)."""
    per_area = chunk_bytes // _PAIR.size
    chunks: set[int] = set()
    area = 0
    while True:
        offset = (1 + area * (per_area + 1)) * chunk_bytes
        if offset + chunk_bytes > cow_bytes:
            if area == 0:  # the kernel writes the first area when it makes the snapshot
                raise CowTableError(f"a COW device of {cow_bytes} bytes has no metadata area")
            return chunks  # the last area was full, and the device has no room for another
        data = read(offset, chunk_bytes)
        if len(data) != chunk_bytes:
            raise CowTableError(f"read {len(data)} bytes of the metadata area at {offset}")
        for old, new in _PAIR.iter_unpack(data):
            if new == 0:
                return chunks
            chunks.add(old)
        area += 1


def chunk_ranges(chunks: Iterable[int], chunk_bytes: int) -> list[tuple[int, int]]:
    """Chunk numbers as sorted, merged ``(offset, length)`` byte ranges."""
    out: list[tuple[int, int]] = []
    for chunk in sorted(chunks):
        offset = chunk * chunk_bytes
        if out and out[-1][0] + out[-1][1] == offset:
            out[-1] = (out[-1][0], out[-1][1] + chunk_bytes)
        else:
            out.append((offset, chunk_bytes))
    return out

"""What the sender reads (pure): the volume from a start offset as READ, ZERO and KEEP pieces.

A thin source is read only where its pool maps blocks (``mapped``: sorted ``(offset, length)``
byte ranges from lvmd, at the pool's chunk granularity); its unmapped ranges read as zeros and
travel as ZERO records without being read. A thick source has no map and is read whole; the
sender turns each read that is all zeros into a ZERO record. READ pieces never cross a segment
boundary, so each becomes one DATA record.

A delta copy (``delta``) sends what differs from a base the receiver holds already: only the
ranges where a thin source maps other blocks than its base (``changed``) are read; the rest
are KEEP pieces, left as the receiver has them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from topolvm.transfer.wire import SEGMENT


@dataclass(frozen=True)
class Piece:
    read: bool  # False: zeros (or, with ``keep``, the receiver's bytes), not read
    offset: int
    length: int
    keep: bool = False  # a delta's range the receiver holds already: neither read nor sent


def grid(chunk: int) -> int:
    """Checkpoints (resume points) fall on multiples of this: a segment boundary (for the
    digest) that is also a thin chunk boundary of the target (so that no chunk is half done
    when a copy resumes). ``chunk`` 0: no thin target."""
    return SEGMENT if chunk <= 0 else math.lcm(SEGMENT, chunk)


def _reads(offset: int, end: int, step: int = SEGMENT) -> Iterator[Piece]:
    while offset < end:
        stop = min(end, (offset // SEGMENT + 1) * SEGMENT, offset + step)
        yield Piece(True, offset, stop - offset)
        offset = stop


def full(size: int, start: int = 0, step: int = SEGMENT) -> Iterator[Piece]:
    """Every byte from ``start``, read in segment pieces (of ``step`` bytes at most)."""
    return _reads(start, size, step)


def mapped(
    size: int, ranges: Iterable[tuple[int, int]], start: int = 0, step: int = SEGMENT
) -> Iterator[Piece]:
    """The mapped ``ranges`` from ``start`` as READ pieces, the gaps between them as ZERO.
    Ranges must be sorted and must not overlap; parts past ``size`` are dropped."""
    return _split(size, ranges, start, keep=False, step=step)


def delta(
    size: int, changed: Iterable[tuple[int, int]], start: int = 0, step: int = SEGMENT
) -> Iterator[Piece]:
    """The ``changed`` ranges from ``start`` as READ pieces, the gaps between them as KEEP.
    Ranges must be sorted and must not overlap; parts past ``size`` are dropped."""
    return _split(size, changed, start, keep=True, step=step)


PIECE_LEAST = 64 << 10  # the smallest READ piece a capped copy is cut into


def capped_step(rate: int, streams: int, io_timeout: float) -> int:
    """The largest READ piece of a copy capped at ``rate`` bytes per second (0: none) in
    ``streams`` streams: each stream's records then come within a quarter of the receiver's
    I/O timeout (the streams take turns at the copy's budget)."""
    if rate <= 0:
        return SEGMENT
    fits = int(rate * io_timeout / 4 / max(streams, 1)) // PIECE_LEAST * PIECE_LEAST
    return max(PIECE_LEAST, min(SEGMENT, fits))


def _split(
    size: int, ranges: Iterable[tuple[int, int]], start: int, *, keep: bool,
    step: int = SEGMENT,
) -> Iterator[Piece]:  # fmt: skip
    pos = start
    last_end = 0
    for offset, length in ranges:
        if length <= 0 or offset < last_end:
            raise ValueError(f"mapped ranges must be sorted and disjoint: {offset}+{length}")
        last_end = offset + length
        begin, end = max(offset, pos), min(offset + length, size)
        if begin >= end:
            continue
        if begin > pos:
            yield Piece(False, pos, begin - pos, keep)
        yield from _reads(begin, end, step)
        pos = end
    if pos < size:
        yield Piece(False, pos, size - pos, keep)


def merge(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, touching or overlapping ranges joined."""
    out: list[tuple[int, int]] = []
    for offset, length in sorted(ranges):
        if out and offset <= out[-1][0] + out[-1][1]:
            first, first_len = out[-1]
            out[-1] = (first, max(first_len, offset + length - first))
        else:
            out.append((offset, length))
    return out


MAX_PARTS = 16  # the most streams one copy is split into
PART_UNIT_MIN, PART_UNIT_MAX = SEGMENT, 1 << 30


def part(size: int, index: int, count: int, unit: int) -> tuple[int, int]:
    """The range ``[begin, end)`` of part ``index`` of ``count`` of a ``size``-byte volume
    copied in several streams: as even as boundaries at multiples of ``unit`` allow (a part may
    be empty when the volume is small). Both ends compute it from the source's size."""
    if not 1 <= count <= MAX_PARTS or not 0 <= index < count:
        raise ValueError(f"part {index} of {count}: a copy has 1 to {MAX_PARTS} parts")
    if unit % SEGMENT or not PART_UNIT_MIN <= unit <= PART_UNIT_MAX:
        raise ValueError(f"a part's unit is a multiple of {SEGMENT} up to {PART_UNIT_MAX}")

    def edge(i: int) -> int:
        return size if i == count else min(size, size * i // count // unit * unit)

    return edge(index), edge(index + 1)


def part_unit(chunk: int) -> int:
    """The unit of a target with thin chunks of ``chunk`` bytes (0: thick): parts end on the
    checkpoint grid, so that no chunk is shared by two streams. 0: no unit fits (an odd chunk
    size), the copy goes in one stream."""
    unit = math.lcm(grid(chunk), 64 * SEGMENT)
    return unit if unit <= PART_UNIT_MAX else 0


def parts_for(size: int, most: int, unit: int) -> int:
    """How many streams copy a ``size``-byte volume: at most ``most``, none smaller than
    ``unit`` (a small volume goes in one)."""
    return max(1, min(most, MAX_PARTS, size // unit if unit else 1))

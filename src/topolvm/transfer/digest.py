"""The whole-volume digest (pure): a hash chain over the volume's 1 MiB segments.

``c0 = BLAKE2b-256("topolvm-transfer-v1" || size)``; for each segment ``i`` in order,
``c(i+1) = BLAKE2b-256(c(i) || XXH3-128(segment i))``. The digest is ``c(n)``. Both sides
compute it, the sender over what it read and the receiver over what it wrote, however the
records split the volume. The chain's value is 32 bytes, so a checkpoint (offset and value, at
a segment boundary) is all a restarted receiver needs to go on from there.

In a delta copy the receiver does not see the bytes of a KEEP range, so neither side hashes
them: each maximal kept run within a segment is hashed as the marker ``"KEEP" || offset ||
length`` (8 bytes big-endian each) where its bytes would be. The chain then attests the bytes
sent and which ranges were kept, not the whole volume, and still does not depend on how
records split the volume (adjacent kept parts of a segment are one run).

A copy in several streams (:func:`~topolvm.transfer.plan.part`) chains each part's segments
on its own, from ``BLAKE2b-256("topolvm-transfer-v1" || "part" || size || begin || end)``, and
its digest is ``BLAKE2b-256("topolvm-transfer-v1" || "parts" || size || count || p1 || ...)``
over the parts' chains in order (:func:`combined`): it depends on the split as well as on the
bytes. A copy in one stream keeps the single chain above.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import xxhash

from topolvm.transfer.wire import SEGMENT

_DOMAIN = b"topolvm-transfer-v1"
_ZEROS = bytes(SEGMENT)
_KEEP = b"KEEP"
ZERO_SEGMENT = xxhash.xxh3_128_digest(_ZEROS)


def initial(size: int) -> bytes:
    return hashlib.blake2b(_DOMAIN + size.to_bytes(8, "big"), digest_size=32).digest()


def part_initial(size: int, begin: int, end: int) -> bytes:
    """The chain's start of the part ``[begin, end)`` of a copy in several streams."""
    fields = b"".join(n.to_bytes(8, "big") for n in (size, begin, end))
    return hashlib.blake2b(_DOMAIN + b"part" + fields, digest_size=32).digest()


def combined(size: int, parts: list[bytes]) -> bytes:
    """The digest of a copy in ``len(parts)`` streams: over each part's chain, in order."""
    if any(len(p) != 32 for p in parts):
        raise ValueError("a part's digest is 32 bytes")
    head = _DOMAIN + b"parts" + size.to_bytes(8, "big") + len(parts).to_bytes(8, "big")
    return hashlib.blake2b(head + b"".join(parts), digest_size=32).digest()


def _chain(state: bytes, segment_hash: bytes) -> bytes:
    return hashlib.blake2b(state + segment_hash, digest_size=32).digest()


class VolumeDigest:
    """Fed the volume's bytes in order from ``start`` (a segment boundary, with ``state`` the
    chain's value there; ``None`` means the start of the volume, or of the ``span``).

    ``span``: the part ``(begin, end)`` of a copy in several streams (boundaries at segment
    boundaries or the volume's end): only its bytes are fed, and the chain is the part's."""

    def __init__(
        self, size: int, start: int = 0, state: bytes | None = None,
        span: tuple[int, int] | None = None,
    ) -> None:  # fmt: skip
        begin, end = span if span is not None else (0, size)
        if not 0 <= begin <= end <= size or (begin % SEGMENT and begin != size):
            raise ValueError(f"part {begin}-{end} does not fit a {size}-byte volume")
        if start % SEGMENT and start != end:
            raise ValueError(f"a digest resumes at a segment boundary, not {start}")
        if not begin <= start <= end:
            raise ValueError(f"start {start} is outside the volume (size {size})")
        self.size = size
        self.end = end
        self.position = start
        if state is None:
            state = initial(size) if span is None else part_initial(size, begin, end)
        self._state = state
        if len(self._state) != 32:
            raise ValueError("a digest state is 32 bytes")
        self._segment = xxhash.xxh3_128()
        self._kept_from = -1  # the start of the kept run the segment ends with, if any
        # called with (offset, state) at every segment boundary passed: the sender keeps the
        # recent ones to check a receiver's checkpoints against
        self.on_boundary: Callable[[int, bytes], None] | None = None

    @property
    def at_boundary(self) -> bool:
        return self.position % SEGMENT == 0 or self.position == self.end

    @property
    def state(self) -> bytes:
        """The chain's value at :attr:`position`, which must be a segment boundary."""
        if not self.at_boundary:
            raise ValueError(f"offset {self.position} is not a segment boundary")
        return self._state

    def _check(self, offset: int, length: int) -> None:
        if offset != self.position:
            raise ValueError(f"digest fed at {offset}, expected {self.position}")
        if length < 0 or offset + length > self.end:
            raise ValueError(f"{offset}+{length} is past the volume's end ({self.end})")

    def _segment_end(self) -> int:
        return min((self.position // SEGMENT + 1) * SEGMENT, self.end)

    def _step(self, segment_hash: bytes) -> None:
        self._state = _chain(self._state, segment_hash)
        if self.on_boundary is not None:
            self.on_boundary(self.position, self._state)

    def _close_if_full(self) -> None:
        if self.position == self._segment_end() or self.position % SEGMENT == 0:
            self._end_keep()
            self._step(self._segment.digest())
            self._segment.reset()

    def _end_keep(self) -> None:
        if self._kept_from >= 0:
            begin, length = self._kept_from, self.position - self._kept_from
            self._segment.update(_KEEP + begin.to_bytes(8, "big") + length.to_bytes(8, "big"))
            self._kept_from = -1

    def feed_data(self, offset: int, data: bytes | memoryview) -> None:
        self._check(offset, len(data))
        if len(data):
            self._end_keep()
        view = memoryview(data)
        while view:
            take = min(len(view), self._segment_end() - self.position)
            self._segment.update(view[:take])
            view = view[take:]
            self.position += take
            self._close_if_full()

    def feed_zero(self, offset: int, length: int) -> None:
        self._check(offset, length)
        if length:
            self._end_keep()
        end = offset + length
        while self.position < end:
            seg_end = self._segment_end()
            take = min(end, seg_end) - self.position
            whole = self.position % SEGMENT == 0 and take == SEGMENT
            if whole:  # most zero runs: a whole segment at once, its hash known
                self.position += take
                self._step(ZERO_SEGMENT)
                continue
            self._segment.update(_ZEROS[:take])
            self.position += take
            self._close_if_full()

    def feed_keep(self, offset: int, length: int) -> None:
        """A delta's range the receiver holds already: hashed as its marker, per segment."""
        self._check(offset, length)
        end = offset + length
        while self.position < end:
            if self._kept_from < 0:
                self._kept_from = self.position
            self.position = min(end, self._segment_end())
            self._close_if_full()

    def final(self) -> bytes:
        if self.position != self.end:
            raise ValueError(f"digest up to {self.position} of a volume or part ending at "
                             f"{self.end}")  # fmt: skip
        return self._state

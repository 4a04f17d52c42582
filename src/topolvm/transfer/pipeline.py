"""The two ends of a copy, apart from how records travel between them (blocking; run in a
worker thread): :class:`RecordSource` reads a volume by its plan into DATA and ZERO records,
:class:`RecordSink` checks and writes them. Across the network the server frames a source's
records and the client feeds a sink (:mod:`.server`, :mod:`.client`); on one node a source
feeds a sink directly (:func:`copy_local`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from topolvm.transfer import digest, messages, plan, wire
from topolvm.transfer.blockio import Volume, aligned
from topolvm.transfer.errors import ConnectionLost, DigestMismatch, ProtocolError
from topolvm.transfer.sparse import Op, SparseTarget

_ZEROS = bytes(wire.SEGMENT)
CHECKPOINT_BYTES = 256 << 20  # of progress through the volume, at most, between checkpoints
CHECKPOINT_SECONDS = 5.0  # or of time
# the longest ZERO record a source sends after reading zeros, and the most a sink zeroes in one
# call: a mostly empty thick volume (XFS leaves runs of many GiB) keeps the stream moving well
# within the I/O timeout, and checkpoints keep coming
ZERO_RUN = 64 << 20


@dataclass
class Counts:
    """What travelled: records and the volume bytes they cover."""

    data_records: int = 0
    zero_records: int = 0
    data_bytes: int = 0
    zero_bytes: int = 0

    def end(self, final: bytes) -> messages.End:
        return messages.End(data_records=self.data_records, zero_records=self.zero_records,
                            data_bytes=self.data_bytes, zero_bytes=self.zero_bytes,
                            digest=final.hex())  # fmt: skip


class Throttle:
    """At most ``rate`` bytes per second (0: no limit), as a token bucket of one second."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._allowance = float(rate)
        self._last = time.monotonic()

    def take(self, n: int, stop: threading.Event) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        self._allowance = min(float(self.rate), self._allowance + (now - self._last) * self.rate)
        self._last = now
        self._allowance -= n
        if self._allowance < 0 and stop.wait(-self._allowance / self.rate):
            raise ConnectionLost("the copy was stopped")


Record = tuple[wire.Kind, int, int, memoryview]


@dataclass
class RecordSource:
    """Reads ``volume`` along ``pieces`` (from :mod:`.plan`, starting at ``start``) and yields
    DATA and ZERO records, feeding the digest chain as it goes; zero runs are joined. A DATA
    record's payload is a view of one page-aligned buffer (read with ``O_DIRECT``), valid until
    the next record."""

    volume: Volume
    size: int
    pieces: Iterator[plan.Piece]
    start: int = 0
    state: bytes | None = None
    counts: Counts = field(default_factory=Counts)

    def __post_init__(self) -> None:
        self.digest = digest.VolumeDigest(self.size, self.start, self.state)
        self._view = aligned(wire.SEGMENT)

    def records(self) -> Iterator[Record]:
        zero_from, zero_to = self.start, self.start
        for piece in self.pieces:
            payload = self._view[: piece.length]
            if piece.read:
                self.volume.read_into(payload, piece.offset)
            if piece.read and payload != _ZEROS[: piece.length]:
                if zero_to > zero_from:
                    yield self._zero(zero_from, zero_to)
                self.digest.feed_data(piece.offset, payload)
                self.counts.data_records += 1
                self.counts.data_bytes += piece.length
                yield wire.Kind.DATA, piece.offset, piece.length, payload
                zero_from = zero_to = piece.offset + piece.length
                continue
            zero_to = piece.offset + piece.length
            if zero_to - zero_from >= ZERO_RUN:
                yield self._zero(zero_from, zero_to)
                zero_from = zero_to
        if zero_to > zero_from:
            yield self._zero(zero_from, zero_to)

    def _zero(self, begin: int, end: int) -> Record:
        self.digest.feed_zero(begin, end - begin)
        self.counts.zero_records += 1
        self.counts.zero_bytes += end - begin
        return wire.Kind.ZERO, begin, end - begin, self._view[:0]

    def end(self) -> messages.End:
        return self.counts.end(self.digest.final())


Checkpoint = Callable[[int, bytes], None]


@dataclass
class RecordSink:
    """Writes records to ``volume`` (the target, ``target_size`` bytes) for a source of
    ``size`` bytes from ``start`` (a multiple of the checkpoint grid, with the digest chain's
    ``state`` there). Every ``CHECKPOINT_*`` it syncs at the next grid boundary and calls
    ``checkpoint(offset, state)``: what comes before ``offset`` is durable.

    A thin target skips zeros, so it must read as zeros where this copy does not write: true of
    a new volume (``fresh``). One that an earlier attempt wrote into, copied again from the
    start (its source changed, or its checkpoint was refused), is discarded first."""

    volume: Volume
    size: int
    target_size: int
    chunk: int
    checkpoint: Checkpoint
    start: int = 0
    state: bytes | None = None
    counts: Counts = field(default_factory=Counts)
    on_progress: Callable[[int], None] = lambda position: None
    fresh: bool = True

    def __post_init__(self) -> None:
        self.grid = plan.grid(self.chunk)
        if self.start % self.grid and self.start != self.size:
            raise ValueError(f"a copy resumes at a multiple of {self.grid}, not {self.start}")
        if self.chunk and self.start == 0 and not self.fresh:
            self.volume.discard(self.target_size)
        self.digest = digest.VolumeDigest(self.size, self.start, self.state)
        self.sparse = SparseTarget(self.chunk, self.start)
        self._last_offset = self.start
        self._last_time = time.monotonic()

    @property
    def position(self) -> int:
        return self.digest.position

    def _expect(self, kind: wire.Kind, offset: int, length: int) -> None:
        if offset != self.position:
            raise ProtocolError(f"{kind.name} at {offset}, expected {self.position}")
        if offset + length > self.size:
            raise ProtocolError(
                f"{kind.name} {offset}+{length} past the source's end ({self.size})"
            )

    def _apply(self, ops: list[Op], payload: memoryview) -> None:
        for op in ops:
            if op.zero:
                self.volume.zero(op.offset, op.length)
            else:
                self.volume.write(payload, op.offset)

    def data(self, offset: int, payload: memoryview) -> None:
        self._expect(wire.Kind.DATA, offset, len(payload))
        self._apply(self.sparse.data(offset, len(payload)), payload)
        self.digest.feed_data(offset, payload)
        self.counts.data_records += 1
        self.counts.data_bytes += len(payload)
        self._maybe_checkpoint()

    def zero(self, offset: int, length: int) -> None:
        self._expect(wire.Kind.ZERO, offset, length)
        self.counts.zero_records += 1
        self.counts.zero_bytes += length
        end = offset + length
        while self.position < end:
            # a long zero run passes checkpoints: stop at the next grid boundary when one is due
            step_end = min(end, self.position + ZERO_RUN)
            if self._due():
                boundary = (self.position // self.grid + 1) * self.grid
                step_end = min(step_end, boundary)
            n = step_end - self.position
            self._apply(self.sparse.zero(self.position, n), memoryview(b""))
            self.digest.feed_zero(self.position, n)
            self._maybe_checkpoint()

    def _due(self) -> bool:
        return (
            self.position - self._last_offset >= CHECKPOINT_BYTES
            or time.monotonic() - self._last_time >= CHECKPOINT_SECONDS
        )

    def _maybe_checkpoint(self) -> None:
        self.on_progress(self.position)
        if self.position % self.grid or self.position == self.size or not self._due():
            return
        self.volume.sync(self.position)
        self.checkpoint(self.position, self.digest.state)
        self._last_offset, self._last_time = self.position, time.monotonic()

    def end(self, sent: messages.End, since_start: Counts) -> bytes:
        """Check the sender's END against what came since ACCEPT (``since_start``) and the
        digest; make the target durable. Returns the digest."""
        if self.position != self.size:
            raise ProtocolError(f"END at {self.position} of {self.size} bytes")
        got = since_start.end(self.digest.final())
        if (got.data_records, got.zero_records, got.data_bytes, got.zero_bytes) != (
            sent.data_records, sent.zero_records, sent.data_bytes, sent.zero_bytes
        ):  # fmt: skip
            raise ProtocolError(f"END counts {sent} differ from what arrived {got}")
        if got.digest != sent.digest:
            raise DigestMismatch(
                f"the copy's digest {got.digest[:16]}… differs from the source's "
                f"{sent.digest[:16]}…: the data written is not the data read"
            )
        self._apply(self.sparse.finish(self.target_size), memoryview(b""))
        self.volume.sync(self.target_size)
        return bytes.fromhex(got.digest)


def copy_local(
    source: RecordSource, sink: RecordSink, stop: threading.Event, throttle: Throttle
) -> bytes:
    """A copy within one node: the source's records straight into the sink."""
    for kind, offset, length, payload in source.records():
        if stop.is_set():
            raise ConnectionLost("the copy was stopped")
        if kind is wire.Kind.DATA:
            throttle.take(length, stop)
            sink.data(offset, payload)
        else:
            sink.zero(offset, length)
    return sink.end(source.end(), sink.counts)

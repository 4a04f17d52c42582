"""The two ends of a copy, apart from how records travel between them (blocking; run in a
worker thread): :class:`RecordSource` reads a volume by its plan into DATA and ZERO records,
:class:`RecordSink` checks and writes them. Across the network the server frames a source's
records and the client feeds a sink (:mod:`.server`, :mod:`.client`); on one node a source
feeds a sink directly (:func:`copy_local`).

A delta copy fills a target that holds a base already (an earlier copy of it): the source
reads the base too wherever its plan reads, and what equals the base travels as a KEEP record
that the sink leaves alone; what differs travels as DATA, or ZERO, which the sink then writes
as zeros whatever the target (it holds the base's bytes there).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from topolvm.transfer import digest, messages, plan, wire
from topolvm.transfer.blockio import Volume, aligned, same_bytes
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
    keep_records: int = 0
    keep_bytes: int = 0
    wire_bytes: int = 0  # the DATA and ZDATA payload received (the receiver's; not in END)

    def end(self, final: bytes) -> messages.End:
        return messages.End(data_records=self.data_records, zero_records=self.zero_records,
                            data_bytes=self.data_bytes, zero_bytes=self.zero_bytes,
                            keep_records=self.keep_records, keep_bytes=self.keep_bytes,
                            digest=final.hex())  # fmt: skip

    def add(self, kind: wire.Kind, length: int) -> None:
        if kind is wire.Kind.DATA:
            self.data_records += 1
            self.data_bytes += length
        elif kind is wire.Kind.ZERO:
            self.zero_records += 1
            self.zero_bytes += length
        else:
            self.keep_records += 1
            self.keep_bytes += length


def _totals(end: messages.End) -> tuple[int, ...]:
    return (end.data_records, end.zero_records, end.keep_records, end.data_bytes, end.zero_bytes,
            end.keep_bytes)  # fmt: skip


class Throttle:
    """At most ``rate`` bytes per second (0: no limit), as a token bucket of one second, shared
    by the threads of one copy (its streams): each waits out the debt it finds."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._allowance = float(rate)
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: int, stop: threading.Event) -> None:
        if self.rate <= 0:
            return
        with self._lock:
            now = time.monotonic()
            allowance = self._allowance + (now - self._last) * self.rate
            self._allowance = min(float(self.rate), allowance) - n
            self._last = now
            debt = -self._allowance
        if debt > 0 and stop.wait(debt / self.rate):
            raise ConnectionLost("the copy was stopped")


Record = tuple[wire.Kind, int, int, memoryview]


@dataclass
class RecordSource:
    """Reads ``volume`` along ``pieces`` (from :mod:`.plan`, starting at ``start``) and yields
    DATA and ZERO records, feeding the digest chain as it goes; zero runs are joined. A DATA
    record's payload is a view of one page-aligned buffer (read with ``O_DIRECT``), valid until
    the next record.

    With a ``base`` (a delta copy) every piece read is read from the base too, at the same
    offset: one equal to it becomes a KEEP record, as do the plan's KEEP pieces; KEEP runs are
    joined like zero runs. ``span``: the part of the volume a stream of a copy in several
    reads (its pieces must lie within it)."""

    volume: Volume
    size: int
    pieces: Iterator[plan.Piece]
    start: int = 0
    state: bytes | None = None
    counts: Counts = field(default_factory=Counts)
    base: Volume | None = None
    span: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        self.digest = digest.VolumeDigest(self.size, self.start, self.state, self.span)
        self._view = aligned(wire.SEGMENT)
        self._base_view = aligned(wire.SEGMENT) if self.base is not None else self._view[:0]

    def _kind(self, piece: plan.Piece) -> wire.Kind:
        """What ``piece`` travels as; a DATA piece's bytes are in the buffer."""
        if piece.keep:
            if self.base is None:
                raise ValueError(f"KEEP piece {piece.offset}+{piece.length} without a base")
            return wire.Kind.KEEP
        if not piece.read:
            return wire.Kind.ZERO
        payload = self._view[: piece.length]
        self.volume.read_into(payload, piece.offset)
        if self.base is not None:
            other = self._base_view[: piece.length]
            self.base.read_into(other, piece.offset)
            if same_bytes(payload, other):
                return wire.Kind.KEEP
        return wire.Kind.ZERO if same_bytes(payload, _ZEROS[: piece.length]) else wire.Kind.DATA

    def records(self) -> Iterator[Record]:
        run, run_from, run_to = wire.Kind.ZERO, self.start, self.start
        for piece in self.pieces:
            kind = self._kind(piece)
            end = piece.offset + piece.length
            if kind is wire.Kind.DATA:
                if run_to > run_from:
                    yield self._run(run, run_from, run_to)
                payload = self._view[: piece.length]
                self.digest.feed_data(piece.offset, payload)
                self.counts.add(kind, piece.length)
                yield wire.Kind.DATA, piece.offset, piece.length, payload
                run_from = run_to = end
                continue
            if kind is not run and run_to > run_from:
                yield self._run(run, run_from, run_to)
                run_from = run_to
            run, run_to = kind, end
            if run_to - run_from >= ZERO_RUN:
                yield self._run(run, run_from, run_to)
                run_from = run_to
        if run_to > run_from:
            yield self._run(run, run_from, run_to)

    def _run(self, kind: wire.Kind, begin: int, end: int) -> Record:
        if kind is wire.Kind.ZERO:
            self.digest.feed_zero(begin, end - begin)
        else:
            self.digest.feed_keep(begin, end - begin)
        self.counts.add(kind, end - begin)
        return kind, begin, end - begin, self._view[:0]

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
    start (its source changed, or its checkpoint was refused), is discarded first.

    A ``delta`` copy's target holds the base: it is never discarded, every ZERO range is
    written (as on a thick target), and KEEP ranges are left as they are.

    ``span``: the part ``(begin, end)`` of the volume one stream of a copy in several writes
    (``start`` within it); what comes before ``begin`` or past ``end`` is refused, and a
    target cleared to start over is cleared there only."""

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
    delta: bool = False
    span: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        self.grid = plan.grid(self.chunk)
        begin, self.until = self.span if self.span is not None else (0, self.size)
        if self.start % self.grid and self.start != self.until:
            raise ValueError(f"a copy resumes at a multiple of {self.grid}, not {self.start}")
        if self.chunk and self.start == begin and not self.fresh and not self.delta:
            if self.span is None:
                self.volume.discard(self.target_size)
            else:  # this part alone: the others' streams write theirs meanwhile
                last = self.until == self.size
                self.volume.discard((self.target_size if last else self.until) - begin, begin)
        self.digest = digest.VolumeDigest(self.size, self.start, self.state, self.span)
        # a part resumed at its end (complete) writes nothing: its end may be the volume's,
        # inside a chunk
        whole = self.delta or self.start == self.until
        self.sparse = SparseTarget(0 if whole else self.chunk, self.start)
        self._last_offset = self.start
        self._last_time = time.monotonic()

    @property
    def position(self) -> int:
        return self.digest.position

    def _expect(self, kind: wire.Kind, offset: int, length: int) -> None:
        if offset != self.position:
            raise ProtocolError(f"{kind.name} at {offset}, expected {self.position}")
        if offset + length > self.until:
            raise ProtocolError(
                f"{kind.name} {offset}+{length} past the source's end ({self.until})"
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
        self.counts.add(wire.Kind.DATA, len(payload))
        self._maybe_checkpoint()

    def zero(self, offset: int, length: int) -> None:
        self._run(wire.Kind.ZERO, offset, length)

    def keep(self, offset: int, length: int) -> None:
        """A delta's range the target holds already: nothing is written."""
        if not self.delta:
            raise ProtocolError(f"KEEP at {offset} in a copy that is not a delta")
        self._run(wire.Kind.KEEP, offset, length)

    def _run(self, kind: wire.Kind, offset: int, length: int) -> None:
        self._expect(kind, offset, length)
        self.counts.add(kind, length)
        end = offset + length
        while self.position < end:
            # a long run passes checkpoints: stop at the next grid boundary when one is due
            step_end = min(end, self.position + ZERO_RUN)
            if self._due():
                boundary = (self.position // self.grid + 1) * self.grid
                step_end = min(step_end, boundary)
            n = step_end - self.position
            if kind is wire.Kind.ZERO:
                self._apply(self.sparse.zero(self.position, n), memoryview(b""))
                self.digest.feed_zero(self.position, n)
            else:
                self.sparse.keep(self.position, n)
                self.digest.feed_keep(self.position, n)
            self._maybe_checkpoint()

    def _due(self) -> bool:
        return (
            self.position - self._last_offset >= CHECKPOINT_BYTES
            or time.monotonic() - self._last_time >= CHECKPOINT_SECONDS
        )

    def _maybe_checkpoint(self) -> None:
        self.on_progress(self.position)
        if self.position % self.grid or self.position == self.until or not self._due():
            return
        self.volume.sync(self.position)
        self.checkpoint(self.position, self.digest.state)
        self._last_offset, self._last_time = self.position, time.monotonic()

    def end(self, sent: messages.End, since_start: Counts) -> bytes:
        """Check the sender's END against what came since ACCEPT (``since_start``) and the
        digest; make the target durable. Returns the digest."""
        if self.position != self.until:
            raise ProtocolError(f"END at {self.position} of {self.until} bytes")
        got = since_start.end(self.digest.final())
        if _totals(got) != _totals(sent):
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
        elif kind is wire.Kind.KEEP:
            sink.keep(offset, length)
        else:
            sink.zero(offset, length)
    return sink.end(source.end(), sink.counts)

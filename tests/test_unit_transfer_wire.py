"""The transfer stream's pure parts: frames and their checksums, the whole-volume digest, the
sender's read plan and the receiver's sparse writes, checked against simple models (a volume
as bytes, a thin target whose written chunks show old data where nothing was written)."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz_helpers import fuzz as fuzz_settings
from topolvm.transfer import digest, messages, plan, wire
from topolvm.transfer.errors import ChecksumMismatch, ProtocolError
from topolvm.transfer.sparse import Op, SparseTarget

SEG = wire.SEGMENT
fuzz = fuzz_settings(150)


def _volume(rng: random.Random, size: int) -> bytes:
    """Runs of zeros and random bytes, as a filesystem leaves a disk."""
    out = bytearray()
    while len(out) < size:
        run = rng.choice([4096, 65536, SEG // 2, SEG, 3 * SEG // 2])
        out += bytes(run) if rng.random() < 0.5 else rng.randbytes(run)
    return bytes(out[:size])


def _reference(data: bytes) -> bytes:
    state = digest.initial(len(data))
    import hashlib

    import xxhash

    for i in range(0, len(data), SEG):
        seg = xxhash.xxh3_128_digest(data[i : i + SEG])
        state = hashlib.blake2b(state + seg, digest_size=32).digest()
    return state


@fuzz
@given(
    st.integers(0, 2**32), st.integers(0, 5 * SEG), st.lists(st.integers(1, 3 * SEG), max_size=30)
)
def test_the_digest_does_not_depend_on_how_records_split_the_volume(
    seed: int, size: int, cuts: list[int]
) -> None:
    rng = random.Random(seed)
    data = _volume(rng, size)
    d = digest.VolumeDigest(size)
    pos = 0
    for cut in [*cuts, size]:
        n = min(cut, size - pos)
        piece = data[pos : pos + n]
        if piece == bytes(n) and rng.random() < 0.7:
            d.feed_zero(pos, n)
        else:
            d.feed_data(pos, piece)
        pos += n
    assert d.final() == _reference(data)


def test_a_digest_resumed_from_a_checkpoint_ends_where_an_unbroken_one_does() -> None:
    rng = random.Random(7)
    size = 5 * SEG + 12288
    data = _volume(rng, size)
    whole = digest.VolumeDigest(size)
    whole.feed_data(0, data[: 3 * SEG])
    checkpoint = (whole.position, whole.state)
    resumed = digest.VolumeDigest(size, *checkpoint)
    for d in (whole, resumed):
        d.feed_data(3 * SEG, data[3 * SEG :])
    assert whole.final() == resumed.final() == _reference(data)
    with pytest.raises(ValueError, match="segment boundary"):
        digest.VolumeDigest(size, SEG + 4096, bytes(32))
    one_bit = bytearray(data)
    one_bit[size - 1] ^= 1
    assert _reference(bytes(one_bit)) != whole.final()


def test_a_frame_round_trips_and_any_flipped_bit_is_caught() -> None:
    payload = os.urandom(5000)
    header = wire.pack_header(wire.Kind.DATA, 3 * SEG, len(payload), payload)
    parsed = wire.Header(header)
    parsed.verify(payload)
    assert (parsed.kind, parsed.offset, parsed.length) == (wire.Kind.DATA, 3 * SEG, 5000)
    frame = bytearray(header + payload)
    for bit in range(0, len(frame) * 8, 97):
        broken = bytearray(frame)
        broken[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(ProtocolError):  # ChecksumMismatch is one
            h = wire.Header(bytes(broken[: wire.HEADER_SIZE]))
            h.verify(bytes(broken[wire.HEADER_SIZE :]))
    with pytest.raises(ChecksumMismatch):
        h = wire.Header(header)
        h.verify(payload[:-1] + bytes([payload[-1] ^ 0x80]))


@pytest.mark.parametrize(
    ("kind", "offset", "length", "payload", "error"),
    [
        (wire.Kind.DATA, SEG - 10, 20, 20, "crosses a segment"),
        (wire.Kind.DATA, 0, 10, 9, "covers 10 bytes but carries 9"),
        (wire.Kind.ZERO, 0, 0, 0, "ZERO record of no bytes"),
        (wire.Kind.ZERO, 0, 10, 1, "payload of 1 bytes"),
        (wire.Kind.HELLO, 5, 0, 10, "with a volume range"),
        (wire.Kind.DATA, 0, SEG + 1, SEG + 1, "payload of"),
        (wire.Kind.ZERO, 2**62, 1, 0, "out of bounds"),
    ],
)
def test_malformed_headers_are_protocol_errors(
    kind: wire.Kind, offset: int, length: int, payload: int, error: str
) -> None:
    raw = wire._HEAD.pack(wire.MAGIC, kind, 0, 0, offset, length, payload) + bytes(8)
    with pytest.raises(ProtocolError, match=error):
        wire.Header(raw)


def test_control_messages_are_checked_on_decode() -> None:
    uid = "0b4f5c7e-1111-4222-8333-123456789abc"
    hello = messages.Hello(version=1, token="t", job="pvc-1", job_uid=uid)
    assert messages.decode(wire.Kind.HELLO, messages.encode(hello), messages.Hello) == hello
    bad = [
        b'{"version":1,"token":"t","job":"-bad","job_uid":"' + uid.encode() + b'"}',
        b'{"version":1,"token":"t","job":"a","job_uid":"x"}',
        b'{"version":1,"token":"","job":"a","job_uid":"' + uid.encode() + b'"}',
        b'{"version":1,"token":"t","job":"a","job_uid":"' + uid.encode() + b'","extra":1}',
        b"[1,2]",
        b"\xff",
    ]
    for payload in bad:
        with pytest.raises(ProtocolError):
            messages.decode(wire.Kind.HELLO, payload, messages.Hello)
    with pytest.raises(ProtocolError, match="expected HELLO, got ACK"):
        messages.decode(wire.Kind.ACK, messages.encode(hello), messages.Hello)


ranges = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12)), max_size=12).map(
    lambda rs: plan.merge((o * 65536, n * 65536) for o, n in rs)
)


@fuzz
@given(ranges, st.integers(0, 40), st.integers(0, 44))
def test_a_thin_plan_reads_exactly_the_mapped_ranges_and_covers_the_rest_with_zeros(
    mapped: list[tuple[int, int]], start_seg: int, size_chunks: int
) -> None:
    size = size_chunks * 65536 + 4096
    start = min(start_seg * SEG, size)
    pieces = list(plan.mapped(size, mapped, start))
    pos = start
    read: set[int] = set()
    for p in pieces:
        assert p.offset == pos and p.length > 0
        pos += p.length
        if p.read:
            assert p.offset // SEG == (p.offset + p.length - 1) // SEG
            read.update(range(p.offset // 4096, (p.offset + p.length) // 4096))
    assert pos == size or (not pieces and start == size)
    wanted = {b for o, n in mapped for b in range(o // 4096, (o + n) // 4096)}
    assert read == {b for b in wanted if start // 4096 <= b < -(-size // 4096)}


def _apply(
    target: bytearray, ops: list[Op], source: bytes, chunk: int, allocated: set[int]
) -> None:
    for op in ops:
        if chunk:  # a thin target: a chunk gets allocated (with old bytes) on its first write
            for c in range(op.offset // chunk, (op.offset + op.length - 1) // chunk + 1):
                if c not in allocated:
                    allocated.add(c)
                    end = min((c + 1) * chunk, len(target))
                    target[c * chunk : end] = b"\xee" * (end - c * chunk)
        stop = op.offset + op.length
        target[op.offset : stop] = bytes(op.length) if op.zero else source[op.offset : stop]


@fuzz
@given(
    st.lists(st.tuples(st.booleans(), st.integers(1, 40)), min_size=1, max_size=25),
    st.sampled_from([0, 4, 8, 16]),
    st.integers(0, 3),
)
def test_sparse_writes_leave_the_target_equal_to_the_source(
    runs: list[tuple[bool, int]], chunk: int, resume_chunks: int
) -> None:
    """Byte-scale model: records of data (non-zero bytes) and zero runs; a thick target starts
    full of old bytes, a thin one reads zero until a chunk is written, then old bytes where the
    chunk was not written. Resuming at a chunk boundary must give the same result."""
    source = bytearray()
    records = []
    for is_data, n in runs:
        records.append((is_data, len(source), n))
        source += (b"\x5a" * n) if is_data else bytes(n)
    size = len(source)
    target = bytearray(b"\xee" * size) if chunk == 0 else bytearray(size)
    allocated: set[int] = set()
    start = min(resume_chunks * (chunk or 4), size)
    start -= start % (chunk or 1)
    if start:  # what a first run wrote before it stopped at the checkpoint
        first = SparseTarget(chunk)
        for is_data, off, length in records:
            n = min(length, start - off)
            if n > 0:
                ops = first.data(off, n) if is_data else first.zero(off, n)
                _apply(target, ops, bytes(source), chunk, allocated)
    t = SparseTarget(chunk, start)
    for is_data, offset, n in records:
        end = offset + n
        if end <= start:
            continue
        off = max(offset, start)
        ops = t.data(off, end - off) if is_data else t.zero(off, end - off)
        _apply(target, ops, bytes(source), chunk, allocated)
    _apply(target, t.finish(size), bytes(source), chunk, allocated)
    assert bytes(target) == bytes(source)


def test_the_checkpoint_grid_is_a_segment_and_a_chunk_boundary() -> None:
    assert plan.grid(0) == SEG
    assert plan.grid(65536) == SEG
    assert plan.grid(4 * SEG) == 4 * SEG
    assert plan.grid(192 * 1024) == 3 * SEG

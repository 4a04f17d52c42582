"""A delta copy's pure parts: the plan of changed ranges and kept gaps, the KEEP frame, and the
digest over kept ranges, which both ends must compute alike however records split the volume
(and which must differ when the kept ranges differ)."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz_helpers import fuzz as fuzz_settings
from topolvm.transfer import digest, messages, plan, wire
from topolvm.transfer.errors import ProtocolError
from topolvm.transfer.sparse import SparseTarget

SEG = wire.SEGMENT
fuzz = fuzz_settings(150)
BLOCK = 65536

ranges = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 20)), max_size=12).map(
    lambda rs: plan.merge((o * BLOCK, n * BLOCK) for o, n in rs)
)


@fuzz
@given(ranges, st.integers(0, 4), st.integers(0, 70))
def test_a_delta_plan_reads_the_changed_ranges_and_keeps_the_rest(
    changed: list[tuple[int, int]], start_seg: int, size_blocks: int
) -> None:
    size = size_blocks * BLOCK + 4096
    start = min(start_seg * SEG, size)
    pieces = list(plan.delta(size, changed, start))
    pos = start
    read: set[int] = set()
    for p in pieces:
        assert p.offset == pos and p.length > 0
        assert p.read != p.keep  # a delta has no zero pieces: gaps are kept, not zeroed
        pos += p.length
        if p.read:
            assert p.offset // SEG == (p.offset + p.length - 1) // SEG
            read.update(range(p.offset // 4096, (p.offset + p.length) // 4096))
    assert pos == size or (not pieces and start == size)
    wanted = {b for o, n in changed for b in range(o // 4096, (o + n) // 4096)}
    assert read == {b for b in wanted if start // 4096 <= b < -(-size // 4096)}
    # the same ranges as a thin copy's plan, with KEEP where that one has ZERO
    full = list(plan.mapped(size, changed, start))
    assert [(p.read, p.offset, p.length) for p in pieces] == [
        (p.read, p.offset, p.length) for p in full
    ]


def test_a_delta_plan_refuses_unsorted_ranges() -> None:
    with pytest.raises(ValueError, match="sorted and disjoint"):
        list(plan.delta(10 * SEG, [(2 * SEG, SEG), (SEG, SEG)]))


def test_a_keep_frame_is_a_range_without_a_payload() -> None:
    header = wire.Header(wire.pack_header(wire.Kind.KEEP, 5 * SEG + 7, 3 * SEG, b""))
    assert (header.kind, header.offset, header.length) == (wire.Kind.KEEP, 5 * SEG + 7, 3 * SEG)
    for length, payload, error in ((0, b"", "KEEP record of no bytes"),
                                   (10, b"x", "payload of 1 bytes")):  # fmt: skip
        raw = wire.pack_header(wire.Kind.KEEP, 0, length, payload)
        with pytest.raises(ProtocolError, match=error):
            wire.Header(raw)


def test_end_and_accept_decode_without_the_delta_fields() -> None:
    """A peer that predates delta copies sends END and ACCEPT without them; a full copy's are
    encoded without them, so such a peer reads them too."""
    old_end = b'{"data_records":1,"zero_records":2,"data_bytes":3,"zero_bytes":4,"digest":"' + (
        b"0" * 64
    ) + b'"}'  # fmt: skip
    end = messages.decode(wire.Kind.END, old_end, messages.End)
    assert (end.keep_records, end.keep_bytes) == (0, 0)
    assert messages.encode(end) == old_end
    accept = messages.Accept(size=1, offset=0, source_id="a", source="b")
    assert b"delta" not in messages.encode(accept)
    delta = messages.Accept(size=1, offset=0, source_id="a", source="b", delta=True)
    assert messages.decode(wire.Kind.ACCEPT, messages.encode(delta), messages.Accept).delta


# a volume as records: DATA (bytes), ZERO and KEEP runs
Rec = tuple[wire.Kind, int, int]


def _records(rng: random.Random, size: int) -> list[Rec]:
    out: list[Rec] = []
    pos = 0
    while pos < size:
        n = min(size - pos, rng.choice([4096, 65536, SEG // 2, SEG, 3 * SEG]))
        out.append((rng.choice(list(wire.RECORDS)), pos, n))
        pos += n
    return out


def _feed(d: digest.VolumeDigest, records: list[Rec], data: bytes, cuts: list[int]) -> None:
    """``records``, each cut again at ``cuts``, into ``d``."""
    for kind, offset, length in records:
        inner = {c for c in cuts if offset < c < offset + length}
        for begin, end in itertools.pairwise(sorted({offset, offset + length} | inner)):
            if kind is wire.Kind.DATA:
                d.feed_data(begin, data[begin:end])
            elif kind is wire.Kind.ZERO:
                d.feed_zero(begin, end - begin)
            else:
                d.feed_keep(begin, end - begin)


@fuzz
@given(st.integers(0, 2**32), st.integers(1, 6 * SEG), st.lists(st.integers(1, 6 * SEG)))
def test_both_ends_digest_a_delta_alike_however_its_records_are_split(
    seed: int, size: int, cuts: list[int]
) -> None:
    rng = random.Random(seed)
    records = _records(rng, size)
    data = rng.randbytes(size)
    whole = digest.VolumeDigest(size)
    _feed(whole, records, data, [])
    split = digest.VolumeDigest(size)
    _feed(split, records, data, cuts)
    assert whole.final() == split.final()
    # and resumed at a segment boundary, from the chain's value there
    seen: dict[int, bytes] = {}
    first = digest.VolumeDigest(size)
    first.on_boundary = seen.__setitem__
    _feed(first, records, data, cuts)
    at = rng.choice(sorted(seen))
    if at < size:
        resumed = digest.VolumeDigest(size, at, seen[at])
        rest = [(k, max(o, at), o + n - max(o, at)) for k, o, n in records if o + n > at]
        _feed(resumed, rest, data, cuts)
        assert resumed.final() == whole.final()


def test_a_kept_range_counts_where_it_is_not_what_it_holds() -> None:
    """The chain attests which ranges were kept: keeping other ranges, or zeros instead of a
    kept range, gives another digest; so does a keep where the bytes would hash the same."""
    size = 3 * SEG
    a = digest.VolumeDigest(size)
    a.feed_keep(0, size)
    b = digest.VolumeDigest(size)
    b.feed_keep(0, SEG + 4096)
    b.feed_zero(SEG + 4096, 4096)
    b.feed_keep(SEG + 8192, size - SEG - 8192)
    c = digest.VolumeDigest(size)
    c.feed_zero(0, size)
    assert len({a.final(), b.final(), c.final()}) == 3


def test_a_sparse_target_leaves_kept_ranges_alone() -> None:
    t = SparseTarget(0)
    assert t.keep(0, 100) == []
    assert [(op.zero, op.offset, op.length) for op in t.zero(100, 50)] == [(True, 100, 50)]
    assert t.keep(150, 10) == [] and t.position == 160
    with pytest.raises(ValueError, match="does not follow"):
        t.keep(100, 10)

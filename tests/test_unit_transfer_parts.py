"""How a copy in several streams is split and how its progress is kept (pure): the parts
cover the volume once, end on their unit, and a status keeps each part's checkpoint."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topolvm.k8s.lvobject import CopyStatus, PartCheckpoint
from topolvm.node.copyreport import copy_patch, resumed
from topolvm.transfer import digest, messages, plan
from topolvm.transfer.errors import ConnectionLost, DigestMismatch
from topolvm.transfer.streams import PartFailures

MiB = 1 << 20


@given(st.integers(0, 1 << 40), st.integers(1, plan.MAX_PARTS), st.integers(1, 1024))
def test_parts_cover_the_volume_once_in_order_on_their_unit(
    size: int, count: int, unit_mib: int
) -> None:
    unit = unit_mib * MiB
    spans = [plan.part(size, i, count, unit) for i in range(count)]
    assert spans[0][0] == 0 and spans[-1][1] == size
    for (_, end), (begin, _) in itertools.pairwise(spans):
        assert end == begin
    for begin, end in spans:
        assert begin <= end and (begin % unit == 0 or begin == size)


def test_a_part_that_does_not_exist_or_an_odd_unit_is_an_error() -> None:
    with pytest.raises(ValueError, match="part 4 of 4"):
        plan.part(1 << 30, 4, 4, MiB)
    with pytest.raises(ValueError, match="unit"):
        plan.part(1 << 30, 0, 4, MiB + 4096)


def test_a_small_volume_goes_in_one_stream_and_a_large_one_in_at_most_the_limit() -> None:
    unit = plan.part_unit(64 << 10)
    assert unit == 64 * MiB
    assert plan.parts_for(100 * MiB, 4, unit) == 1
    assert plan.parts_for(200 * MiB, 4, unit) == 3
    assert plan.parts_for(1 << 40, 4, unit) == 4
    assert plan.parts_for(1 << 40, 1, unit) == 1
    # a chunk size whose grid does not divide a unit of at most 1 GiB: one stream
    assert plan.part_unit(3 * 5 * 7 * 64 << 10) == 0
    assert plan.parts_for(1 << 40, 4, 0) == 1


def test_a_parts_digest_depends_on_every_part_and_on_the_split() -> None:
    a, b = bytes(32), b"\x01" * 32
    assert digest.combined(8 * MiB, [a, b]) != digest.combined(8 * MiB, [b, a])
    assert digest.combined(8 * MiB, [a, b]) != digest.combined(8 * MiB, [a, b, a])
    assert digest.part_initial(8 * MiB, 0, 4 * MiB) != digest.part_initial(8 * MiB, 0, 2 * MiB)
    # one part's chain over the whole volume is not the single-stream chain: no confusion
    assert digest.part_initial(8 * MiB, 0, 8 * MiB) != digest.initial(8 * MiB)


def test_a_status_keeps_each_parts_checkpoint_and_the_progress_they_hold() -> None:
    unit, size = 64 * MiB, 256 * MiB
    points = (PartCheckpoint(0, 0, unit, 32 * MiB, "a" * 64, "src-1"),
              PartCheckpoint(2, 2 * unit, 3 * unit, 150 * MiB, "b" * 64, "src-1"),
              PartCheckpoint(3, 3 * unit, size, 200 * MiB, "c" * 64, "old-source"),
              PartCheckpoint(1, 0, 2 * unit, 100 * MiB, "d" * 64, "src-1"))  # fmt: skip
    st_ = CopyStatus(part_count=4, part_unit=unit, part_checkpoints=points)
    raw = st_.to_dict()
    assert raw["streams"]["count"] == 4 and len(raw["streams"]["checkpoints"]) == 4
    assert CopyStatus.from_dict(raw) == st_
    accept = messages.Accept(size=size, offset=0, source_id="src-1", source="x")
    # part 0 from 0, part 2 from 128 MiB; part 3's checkpoint is of another source, part 1's
    # of another split (its range is not the part's): neither counts
    assert resumed(st_, accept) == 32 * MiB + 22 * MiB
    # a status without streams clears them in the merge patch
    assert copy_patch(CopyStatus())["streams"] is None
    # malformed entries read as empty, not as an error
    bad = CopyStatus.from_dict({"streams": {"count": "x", "checkpoints": [1, {"index": "y"}]}})
    assert bad is not None and bad.part_count == 0
    assert bad.part_checkpoints == (PartCheckpoint(0, 0, 0, 0, "", ""),)


@given(st.integers(1, 10 << 30), st.integers(1, plan.MAX_PARTS), st.sampled_from([6.0, 30.0]))
def test_a_capped_copys_streams_each_get_a_record_well_within_the_io_timeout(
    rate: int, streams: int, io_timeout: float
) -> None:
    """The streams of a capped copy take turns at its budget: its pieces are cut so that each
    stream's next record comes within a quarter of the receiver's I/O timeout (down to the
    smallest piece), and never cross a segment."""
    step = plan.capped_step(rate, streams, io_timeout)
    assert plan.PIECE_LEAST <= step <= MiB and step % plan.PIECE_LEAST == 0
    if step > plan.PIECE_LEAST:
        assert streams * step / rate <= io_timeout / 4
    assert plan.capped_step(0, streams, io_timeout) == MiB


def test_pieces_of_a_step_cover_the_ranges_without_crossing_a_segment() -> None:
    step = 192 << 10
    pieces = list(plan.mapped(4 * MiB, [(0, 64 << 10), (MiB - (64 << 10), 2 * MiB)], 0, step))
    reads = [(p.offset, p.length) for p in pieces if p.read]
    assert all(length <= step for _, length in reads)
    assert all(o // MiB == (o + n - 1) // MiB for o, n in reads)
    assert sum(n for _, n in reads) == (64 << 10) + 2 * MiB
    assert sum(p.length for p in pieces) == 4 * MiB


def test_a_copys_error_is_the_one_no_retry_mends_then_a_parts_own() -> None:
    failures = PartFailures()
    assert failures.first() is None
    cut = ConnectionLost("link cut")
    failures.add(cut, False)
    failures.add(ConnectionLost("the copy was stopped"), True)
    assert failures.first() is cut
    # a digest that differs, found while the others stop, is the copy's: it fails for good
    differs = DigestMismatch("the data written is not the data read")
    failures.add(differs, True)
    assert failures.first() is differs

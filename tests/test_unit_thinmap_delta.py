"""What ThinDelta computes, without LVM: thin_dump's mappings kept as runs of blocks with their
data blocks, and the ranges where two devices of one pool map blocks differently, checked
against a per-block model on random run lists."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz_helpers import fuzz as fuzz_settings
from topolvm.lvm.thinmap import Run, ThinDump, ThinDumpError, changed_ranges, thin_target

fuzz = fuzz_settings(300)
BLOCK = 65536  # data_block_size 128 sectors

DUMP = b"""<superblock uuid="" time="2" transaction="5" data_block_size="128" nr_data_blocks="900">
  <device dev_id="1" mapped_blocks="21" transaction="0" creation_time="0" snap_time="1">
    <range_mapping origin_begin="0" data_begin="100" length="16" time="0"/>
    <range_mapping origin_begin="16" data_begin="116" length="4" time="1"/>
    <single_mapping origin_block="30" data_block="7" time="1"/>
  </device>
  <device dev_id="2" mapped_blocks="20" transaction="0" creation_time="1" snap_time="1">
    <range_mapping origin_begin="0" data_begin="100" length="16" time="0"/>
    <single_mapping origin_block="16" data_block="200" time="1"/>
    <single_mapping origin_block="17" data_block="201" time="1"/>
    <range_mapping origin_begin="18" data_begin="118" length="2" time="1"/>
  </device>
</superblock>
"""


def _parse(dev_id: int, runs: bool) -> ThinDump:
    dump = ThinDump(dev_id, runs=runs)
    for line in DUMP.splitlines(keepends=True):
        dump.feed(line)
    return dump


def test_runs_keep_the_data_blocks_and_join_only_what_follows_on_in_both() -> None:
    one, two = _parse(1, runs=True), _parse(2, runs=True)
    assert one.found and one.block_bytes == BLOCK and one.ranges == []
    assert one.runs == [(0, 100, 20), (30, 7, 1)]
    assert two.runs == [(0, 100, 16), (16, 200, 2), (18, 118, 2)]
    assert _parse(1, runs=False).ranges == [(0, 20 * BLOCK), (30 * BLOCK, BLOCK)]
    # device 1 maps 16-17 elsewhere than device 2, and 30 alone
    assert changed_ranges(one.runs, two.runs, BLOCK) == [
        (16 * BLOCK, 2 * BLOCK),
        (30 * BLOCK, BLOCK),
    ]


@pytest.mark.parametrize(
    "line",
    [
        b'<range_mapping origin_begin="0" length="4" time="0"/>',
        b'<single_mapping origin_block="3" data_block="x" time="0"/>',
    ],
)
def test_a_mapping_without_its_data_block_is_an_error(line: bytes) -> None:
    dump = ThinDump(1, runs=True)
    dump.feed(b'<superblock data_block_size="128">')
    dump.feed(b'<device dev_id="1">')
    with pytest.raises(ThinDumpError, match="data_b"):
        dump.feed(line)


def test_runs_out_of_order_are_an_error() -> None:
    dump = ThinDump(1, runs=True)
    dump.feed(b'<superblock data_block_size="128">')
    dump.feed(b'<device dev_id="1">')
    dump.feed(b'<range_mapping origin_begin="4" data_begin="0" length="4" time="0"/>')
    with pytest.raises(ThinDumpError, match="out of order"):
        dump.feed(b'<single_mapping origin_block="7" data_block="9" time="0"/>')


def _blocks(runs: list[Run]) -> dict[int, int]:
    return {o + k: d + k for o, d, n in runs for k in range(n)}


def _reference(a: list[Run], b: list[Run]) -> list[tuple[int, int]]:
    """Per block: mapped by one only, or to different data blocks; then joined."""
    ma, mb = _blocks(a), _blocks(b)
    out: list[tuple[int, int]] = []
    for block in sorted(set(ma) | set(mb)):
        if ma.get(block) != mb.get(block):
            if out and out[-1][0] + out[-1][1] == block:
                out[-1] = (out[-1][0], out[-1][1] + 1)
            else:
                out.append((block, 1))
    return out


def _runs(draw: list[tuple[int, int, int]]) -> list[Run]:
    """Gaps, data blocks and lengths as sorted, disjoint runs."""
    runs: list[Run] = []
    pos = 0
    for gap, data, length in draw:
        pos += gap
        runs.append((pos, data, length))
        pos += length
    return runs


run_lists = st.lists(
    st.tuples(st.integers(0, 6), st.integers(0, 40), st.integers(1, 8)), max_size=15
).map(_runs)


@fuzz
@given(run_lists, run_lists)
def test_changed_ranges_are_the_blocks_mapped_differently(a: list[Run], b: list[Run]) -> None:
    expected = [(o * 4096, n * 4096) for o, n in _reference(a, b)]
    assert changed_ranges(a, b, 4096) == expected
    assert changed_ranges(b, a, 4096) == expected
    assert changed_ranges(a, a, 4096) == []


def test_a_snapshot_and_its_origin_differ_where_the_origin_was_written() -> None:
    """As a pool shares blocks: the snapshot keeps the origin's data blocks, each block written
    since gets a new one (seeded: thousands of runs, compared with the per-block model)."""
    rng = random.Random(7)
    origin = _runs([(rng.randrange(0, 3), rng.randrange(0, 10**6), rng.randrange(1, 50))
                    for _ in range(2000)])  # fmt: skip
    blocks = _blocks(origin)
    fresh = 10**7
    for block in rng.sample(sorted(blocks), 500):
        blocks[block] = fresh
        fresh += 1
    for block in rng.sample(sorted(blocks), 50):  # discarded since
        del blocks[block]
    later: list[Run] = []
    for block in sorted(blocks):
        if (
            later
            and later[-1][0] + later[-1][2] == block
            and later[-1][1] + later[-1][2] == blocks[block]
        ):
            later[-1] = (later[-1][0], later[-1][1], later[-1][2] + 1)
        else:
            later.append((block, blocks[block], 1))
    expected = [(o * BLOCK, n * BLOCK) for o, n in _reference(later, origin)]
    assert len(expected) > 100
    assert changed_ranges(later, origin, BLOCK) == expected


def test_a_thin_devices_table_gives_its_pool_and_device_id() -> None:
    """ThinDelta's device ids come from the kernel's tables of the devices (dmsetup table)."""
    assert thin_target("0 2097152 thin 253:4 7\n") == ("253:4", 7)
    assert thin_target("0 2097152 thin 253:4 12 253:9") == ("253:4", 12)  # external origin
    assert thin_target("0 2097152 linear 8:16 2048") is None  # not a thin volume
    assert thin_target("0 1024 thin 253:4 7\n1024 1024 thin 253:4 8") is None  # two targets
    assert thin_target("0 2097152 thin 253:4 x") is None
    assert thin_target("0 2097152 thin 253:4 \u00b2") is None  # a digit to str, not to int
    assert thin_target("8 2097152 thin 253:4 7") is None  # not from the device's start
    assert thin_target("") is None

"""The exception table of a thick snapshot's COW device (topolvm.lvm.cowtable), on stores laid
out as the kernel's persistent store lays them out; the same read on real LVM is in
tests/test_lvmd_lvm_volumedata.py."""

from __future__ import annotations

import struct

import pytest

from topolvm.lvm.cowtable import (
    MAGIC,
    CowTableError,
    SnapshotInvalid,
    chunk_ranges,
    header_chunk_bytes,
    written_chunks,
)

CHUNK = 4096  # 8 sectors: 256 exceptions per area
PER_AREA = CHUNK // 16


def store(exceptions: list[int], areas: int | None = None, valid: int = 1) -> bytes:
    """A COW device: the header, then areas of (old, new) pairs, each followed by its data
    chunks (zeros here); ``areas`` metadata areas in all (enough for the pairs if None)."""
    need = len(exceptions) // PER_AREA + 1
    count = need if areas is None else areas
    dev = bytearray(CHUNK * (1 + count * (PER_AREA + 1)))
    struct.pack_into("<IIII", dev, 0, MAGIC, valid, 1, CHUNK // 512)
    for i, old in enumerate(exceptions):
        area, slot = divmod(i, PER_AREA)
        first = 1 + area * (PER_AREA + 1)
        struct.pack_into("<QQ", dev, first * CHUNK + slot * 16, old, first + 1 + slot)
    return bytes(dev)


def chunks_of(dev: bytes) -> set[int]:
    def read(offset: int, length: int) -> bytes:
        return dev[offset : offset + length]

    return written_chunks(read, header_chunk_bytes(dev[:4096]), len(dev))


def test_the_table_lists_the_written_chunks_and_ends_at_the_first_empty_pair() -> None:
    assert chunks_of(store([7, 3, 900, 3])) == {3, 7, 900}
    assert chunks_of(store([])) == set()


def test_a_full_area_goes_on_in_the_next_and_a_full_device_ends_the_table() -> None:
    many = list(range(10, 10 + PER_AREA + 5))  # the first area full, 5 in the second
    assert chunks_of(store(many)) == set(many)
    exactly = list(range(PER_AREA))  # one full area and no room for a second
    assert chunks_of(store(exactly, areas=1)) == set(exactly)


@pytest.mark.parametrize(
    ("header", "error", "message"),
    [
        (struct.pack("<IIII", 0x12345678, 1, 1, 8), CowTableError, "no snapshot header"),
        (struct.pack("<IIII", MAGIC, 1, 2, 8), CowTableError, "version 2"),
        (struct.pack("<IIII", MAGIC, 0, 1, 8), SnapshotInvalid, "overflowed"),
        (struct.pack("<IIII", MAGIC, 1, 1, 12), CowTableError, "not a power of two"),
        (b"SnA", CowTableError, "3 bytes"),
    ],
)
def test_a_header_that_is_not_a_live_store_is_refused(
    header: bytes, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        header_chunk_bytes(header)


def test_a_full_area_followed_by_a_zeroed_one_ends_the_table() -> None:
    exactly = list(range(PER_AREA))  # the kernel zeroes the next area before it fills one
    assert chunks_of(store(exactly, areas=3)) == set(exactly)


def test_a_device_without_room_for_the_first_area_is_an_error() -> None:
    header = store([])[:CHUNK]
    with pytest.raises(CowTableError, match="no metadata area"):
        chunks_of(header)


def test_a_short_read_of_an_area_is_an_error() -> None:
    dev = store([1, 2])
    with pytest.raises(CowTableError, match="read 100 bytes"):
        written_chunks(lambda offset, length: dev[offset : offset + 100], CHUNK, len(dev))


def test_chunks_become_merged_byte_ranges() -> None:
    assert chunk_ranges({5, 1, 2, 3}, 512) == [(512, 3 * 512), (5 * 512, 512)]
    assert chunk_ranges(set(), 512) == []

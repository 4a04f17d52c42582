"""How a copy's sender tells a zero segment, or one its delta's base holds already, from data
(topolvm.transfer.blockio.same_bytes: memcmp on the copy's own buffers)."""

from __future__ import annotations

import pytest

from topolvm.transfer.blockio import aligned, same_bytes

MiB = 1 << 20


@pytest.mark.parametrize("where", [0, 63, 64, MiB // 2, MiB - 1])
def test_a_byte_that_differs_anywhere_is_seen(where: int) -> None:
    zeros = bytes(MiB)
    view, other = aligned(MiB), aligned(MiB)
    assert same_bytes(view, zeros) and same_bytes(view, other)
    view[where] = 1
    assert not same_bytes(view, zeros)
    assert not same_bytes(view, other)
    other[where] = 1
    assert same_bytes(view, other)
    assert same_bytes(view[where:], other[where:]) and not same_bytes(view[where:], zeros[where:])


def test_lengths_slices_and_read_only_buffers() -> None:
    view = aligned(MiB)
    assert not same_bytes(view, bytes(MiB - 1))  # a shorter buffer is never the same
    assert same_bytes(view[:100], bytes(100))
    assert same_bytes(view[:0], b"")
    frozen = memoryview(b"\0" * 4096)  # read-only: compared by copy
    assert same_bytes(frozen, bytes(4096))
    assert not same_bytes(frozen, b"\0" * 4095 + b"\1")
    view[4095] = 7
    assert not same_bytes(view[:4096], frozen) and not same_bytes(frozen, view[:4096])


def test_bytes_are_compared_whatever_the_views_format_or_shape() -> None:
    view, other = aligned(1024), aligned(1024)
    other[600] = 1
    assert not same_bytes(view.cast("I"), other.cast("I"))  # 256 elements: byte 600 differs
    assert not same_bytes(view.cast("B", (128, 8)), other.cast("B", (128, 8)))
    assert not same_bytes(view[::2], other[::2]) and same_bytes(view[1::2], other[1::2])
    plus, minus = aligned(64), aligned(64)
    minus[7] = 0x80  # -0.0 == +0.0 as numbers, not as bytes
    assert not same_bytes(plus.cast("d"), minus.cast("d"))
    assert same_bytes(bytes(64), plus) and not same_bytes(bytes(64), minus)

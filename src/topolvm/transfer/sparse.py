"""How the receiver writes a record stream sparsely and correctly (pure).

A fresh thick LV may hold an earlier volume's bytes, so every ZERO range is zeroed on it
(``BLKZEROOUT``). A fresh thin LV reads zeros where nothing was written, but only at the pool's
chunk granularity: a chunk that gets any write is allocated whole, and with zeroing off
(``skip_block_zeroing``) its unwritten part shows old data. So on a thin target a ZERO range is
skipped only where it covers chunks that get no write at all; inside a chunk that is written,
its zeros are written too.

A delta copy's target holds older data: it is written as a thick one (``chunk`` 0), and its
KEEP ranges are left as they are.

Records arrive in increasing offset order; each call returns the operations to perform.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    zero: bool  # True: write zeros (BLKZEROOUT); False: write the record's data
    offset: int
    length: int


class SparseTarget:
    """``chunk`` is the thin pool's chunk size in bytes; 0 for a thick target."""

    def __init__(self, chunk: int, start: int = 0) -> None:
        if chunk < 0:
            raise ValueError("chunk size must not be negative")
        if chunk and start % chunk:
            raise ValueError(f"a thin target resumes at a chunk boundary, not {start}")
        self.chunk = chunk
        self.position = start
        self._dirty_until = start  # the end of the chunk the last write touched (thin)
        self._skipped_from = start  # the zeros in [_skipped_from, position) were not written

    def _floor(self, offset: int) -> int:
        return offset - offset % self.chunk

    def _ceil(self, offset: int) -> int:
        return -(-offset // self.chunk) * self.chunk

    def data(self, offset: int, length: int) -> list[Op]:
        self._expect(offset, length)
        ops: list[Op] = []
        if self.chunk:
            # zeros skipped earlier in the chunk this write starts in are written now
            first = max(self._skipped_from, self._floor(offset))
            if first < offset:
                ops.append(Op(True, first, offset - first))
            self._dirty_until = self._ceil(offset + length)
        ops.append(Op(False, offset, length))
        self.position = self._skipped_from = offset + length
        return ops

    def zero(self, offset: int, length: int) -> list[Op]:
        self._expect(offset, length)
        end = offset + length
        self.position = end
        if not self.chunk:
            self._skipped_from = end
            return [Op(True, offset, length)]
        ops: list[Op] = []
        written = min(end, self._dirty_until)
        if written > offset:  # the rest of the chunk the last write touched
            ops.append(Op(True, offset, written - offset))
            self._skipped_from = written
        return ops

    def keep(self, offset: int, length: int) -> list[Op]:
        """A range the target holds already (a delta's KEEP): nothing to write."""
        self._expect(offset, length)
        self.position = self._skipped_from = offset + length
        return []

    def finish(self, target_size: int) -> list[Op]:
        """After the last record: a thin target larger than the source gets the rest of the
        last chunk written zeroed (past the source's end, up to the target's)."""
        end = min(self._dirty_until, target_size)
        if self.chunk and end > self.position:
            return [Op(True, self.position, end - self.position)]
        return []

    def _expect(self, offset: int, length: int) -> None:
        if offset != self.position or length <= 0:
            raise ValueError(f"record {offset}+{length} does not follow {self.position}")

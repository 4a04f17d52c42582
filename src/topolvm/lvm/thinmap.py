"""A thin volume's mapped blocks, from ``thin_dump`` (pure; thin_dump(8)).

``thin_dump --dev-id N -m <pool>_tmeta`` prints the pool's metadata (from a reserved metadata
snapshot, so the live pool may go on) as XML, one element a line::

    <superblock uuid="" time="1" transaction="3" ... data_block_size="128" nr_data_blocks="..">
      <device dev_id="1" mapped_blocks="20" transaction="0" creation_time="0" snap_time="1">
        <range_mapping origin_begin="0" data_begin="0" length="16" time="0"/>
        <single_mapping origin_block="20" data_block="30" time="0"/>

Blocks are ``data_block_size`` sectors (512 bytes). :class:`ThinDump` reads those lines one at
a time and keeps the device's mapped ranges as merged byte ranges, so a fragmented volume costs
memory per range, not per line; with ``runs`` it keeps them as runs of blocks with the data
blocks they map to instead, and :func:`changed_ranges` compares two devices' runs: a thin
snapshot shares its origin's data blocks, and a block written since gets a block of its own.
"""

from __future__ import annotations

import re

SECTOR = 512
_ATTR = re.compile(rb'([a-z_]+)="([^"]*)"')


class ThinDumpError(ValueError):
    """thin_dump printed something this parser does not understand."""


def _attrs(line: bytes) -> dict[bytes, bytes]:
    return dict(_ATTR.findall(line))


def _int(attrs: dict[bytes, bytes], key: bytes, line: bytes) -> int:
    try:
        value = int(attrs[key])
    except (KeyError, ValueError):
        raise ThinDumpError(
            f"thin_dump line without a valid {key.decode()}: {line[:200]!r}"
        ) from None
    if value < 0:
        raise ThinDumpError(f"thin_dump line with a negative {key.decode()}: {line[:200]!r}")
    return value


Run = tuple[int, int, int]
"""``(origin_begin, data_begin, length)`` in blocks: the device's blocks from ``origin_begin``
map to the pool's data blocks from ``data_begin``."""


class ThinDump:
    """Fed thin_dump's output line by line; :attr:`ranges` are the mapped ``(offset, length)``
    byte ranges of device ``dev_id``, sorted and merged; :attr:`block_bytes` the pool's chunk.
    With ``runs``, :attr:`runs` are its mappings instead (sorted, joined where both the device's
    and the data blocks follow on), and :attr:`ranges` stays empty."""

    def __init__(self, dev_id: int, *, runs: bool = False) -> None:
        self.dev_id = dev_id
        self.block_bytes = 0
        self.ranges: list[tuple[int, int]] = []
        self.runs: list[Run] = []
        self.found = False
        self._keep_runs = runs
        self._inside = False

    def feed(self, line: bytes) -> None:
        text = line.strip()
        if not text.startswith(b"<"):
            if text:
                raise ThinDumpError(f"unexpected thin_dump output: {text[:200]!r}")
            return
        tag = text[1:].split(None, 1)[0].rstrip(b"/>")
        if tag == b"superblock":
            self.block_bytes = _int(_attrs(text), b"data_block_size", text) * SECTOR
        elif tag == b"device":
            self._inside = _int(_attrs(text), b"dev_id", text) == self.dev_id
            self.found = self.found or self._inside
        elif tag == b"/device":
            self._inside = False
        elif tag in (b"range_mapping", b"single_mapping") and self._inside:
            attrs = _attrs(text)
            if tag == b"range_mapping":
                begin = _int(attrs, b"origin_begin", text)
                length = _int(attrs, b"length", text)
                data = _int(attrs, b"data_begin", text) if self._keep_runs else 0
            else:
                begin, length = _int(attrs, b"origin_block", text), 1
                data = _int(attrs, b"data_block", text) if self._keep_runs else 0
            self._add(begin, length, data, text)

    def _add(self, begin: int, length: int, data: int, line: bytes) -> None:
        if not self.block_bytes:
            raise ThinDumpError("thin_dump printed a mapping before its superblock")
        offset, size = begin * self.block_bytes, length * self.block_bytes
        if length <= 0:
            raise ThinDumpError(f"thin_dump mapping of no blocks: {line[:200]!r}")
        if self._keep_runs:
            self._add_run(begin, length, data)
            return
        if self.ranges:
            last_offset, last_size = self.ranges[-1]
            end = last_offset + last_size
            if offset < end:
                raise ThinDumpError(f"thin_dump mappings out of order at block {begin}")
            if offset == end:
                self.ranges[-1] = (last_offset, last_size + size)
                return
        self.ranges.append((offset, size))

    def _add_run(self, begin: int, length: int, data: int) -> None:
        if self.runs:
            last_begin, last_data, last_length = self.runs[-1]
            if begin < last_begin + last_length:
                raise ThinDumpError(f"thin_dump mappings out of order at block {begin}")
            if begin == last_begin + last_length and data == last_data + last_length:
                self.runs[-1] = (last_begin, last_data, last_length + length)
                return
        self.runs.append((begin, data, length))


def changed_ranges(a: list[Run], b: list[Run], block_bytes: int) -> list[tuple[int, int]]:
    """The ``(offset, length)`` byte ranges, sorted and merged, where devices of runs ``a`` and
    ``b`` (each sorted and disjoint) map a block to different data blocks, or only one maps it.
    One sweep over both lists: the cost is in runs, not blocks."""
    out: list[tuple[int, int]] = []
    end_of_all = (1 << 63, 0, 0)
    i = j = pos = 0
    while i < len(a) or j < len(b):
        a_begin, a_data, a_len = a[i] if i < len(a) else end_of_all
        b_begin, b_data, b_len = b[j] if j < len(b) else end_of_all
        pos = max(pos, min(a_begin, b_begin))
        in_a, in_b = a_begin <= pos, b_begin <= pos  # the runs at i and j end after pos
        # up to the next boundary of either list, each maps pos + k to its data block + k
        end = min(a_begin + a_len if in_a else a_begin, b_begin + b_len if in_b else b_begin)
        if end > pos and (not (in_a and in_b) or a_data - a_begin != b_data - b_begin):
            if out and out[-1][1] == pos:
                out[-1] = (out[-1][0], end)
            else:
                out.append((pos, end))
        pos = end
        if in_a and pos == a_begin + a_len:
            i += 1
        if in_b and pos == b_begin + b_len:
            j += 1
    return [(begin * block_bytes, (end - begin) * block_bytes) for begin, end in out]


def dm_name(vg: str, lv: str, layer: str = "") -> str:
    """The device-mapper name LVM gives ``vg/lv`` (dashes doubled, ``-layer`` appended)."""
    name = f"{vg.replace('-', '--')}-{lv.replace('-', '--')}"
    return f"{name}-{layer}" if layer else name


def thin_target(table: str) -> tuple[str, int] | None:
    """(pool device ``major:minor``, device id) of a thin volume's device-mapper table, as
    ``dmsetup table`` prints it (``0 <sectors> thin <pool> <id> [<external origin>]``); None
    if the table is not one thin target."""
    lines = table.strip().splitlines()
    if len(lines) != 1:
        return None
    fields = lines[0].split()
    if len(fields) < 5 or fields[:1] != ["0"] or fields[2] != "thin":
        return None
    if not (fields[4].isascii() and fields[4].isdigit()):
        return None
    return fields[3], int(fields[4])

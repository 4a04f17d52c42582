"""The transfer stream's frames (pure; docs/mobility.md has the layout).

Every frame is a 36-byte header and a payload::

    magic "TLV1" | kind u8 | flags u8 | reserved u16 | offset u64 | length u64 | payload u32 |
    checksum u64

big-endian. ``checksum`` is XXH3-64 of the first 28 header bytes and the payload, so a flipped
bit in an offset is caught as surely as one in the data. ``offset`` and ``length`` are the
volume range a DATA, ZDATA, ZERO or KEEP record covers (ZERO and KEEP have no payload: zeros,
and, in a delta copy, bytes the receiver holds already and leaves as they are; ZDATA carries
the range's bytes as one zstd frame, sent only to a receiver that asked for it:
:mod:`.compress`); control frames (HELLO, ACCEPT, REFUSE, ACK, END, FAIL) carry a JSON payload
(:mod:`.messages`) and zero in both.
"""

from __future__ import annotations

import enum
import struct

import xxhash

from topolvm.transfer.errors import ChecksumMismatch, ProtocolError

MAGIC = b"TLV1"
_HEAD = struct.Struct(">4sBBHQQI")
_CHECK = struct.Struct(">Q")
HEADER_SIZE = _HEAD.size + _CHECK.size  # 36
SEGMENT = 1 << 20
"""The digest's segment, and the largest DATA payload: a DATA record never crosses a
segment boundary (``offset // SEGMENT == (offset + length - 1) // SEGMENT``)."""
MAX_CONTROL = 64 << 10
"""The largest control payload (a HELLO with its token is a few KiB)."""
MAX_VOLUME = 1 << 62  # no LV is larger; offsets past it are malformed


class Kind(enum.IntEnum):
    HELLO = 1
    ACCEPT = 2
    REFUSE = 3
    DATA = 4
    ZERO = 5
    END = 6
    ACK = 7
    FAIL = 8
    KEEP = 9
    ZDATA = 10


CONTROL = frozenset({Kind.HELLO, Kind.ACCEPT, Kind.REFUSE, Kind.END, Kind.ACK, Kind.FAIL})
RECORDS = frozenset({Kind.DATA, Kind.ZDATA, Kind.ZERO, Kind.KEEP})
_EMPTY = frozenset({Kind.ZERO, Kind.KEEP})  # a volume range without a payload
_CARRIED = frozenset({Kind.DATA, Kind.ZDATA})  # a volume range with its bytes
_LIMITS = {Kind.DATA: SEGMENT, Kind.ZDATA: SEGMENT, Kind.ZERO: 0, Kind.KEEP: 0}


def _checksum(head: bytes | memoryview, payload: bytes | memoryview) -> int:
    h = xxhash.xxh3_64(head)
    if len(payload):
        h.update(payload)
    return int(h.intdigest())


def pack_header(kind: Kind, offset: int, length: int, payload: bytes | memoryview) -> bytes:
    """The header of a frame carrying ``payload`` (send the two one after the other)."""
    head = _HEAD.pack(MAGIC, kind, 0, 0, offset, length, len(payload))
    return head + _CHECK.pack(_checksum(head, payload))


def control(kind: Kind, payload: bytes) -> bytes:
    """A whole control frame."""
    if kind not in CONTROL:
        raise ValueError(f"{kind.name} is not a control frame")
    return pack_header(kind, 0, 0, payload) + payload


class Header:
    """A parsed header; :meth:`verify` checks it against its payload."""

    __slots__ = ("_raw", "checksum", "kind", "length", "offset", "payload_len")

    def __init__(self, raw: bytes | memoryview) -> None:
        if len(raw) != HEADER_SIZE:
            raise ProtocolError(f"a frame header is {HEADER_SIZE} bytes, got {len(raw)}")
        magic, kind, flags, reserved, offset, length, payload_len = _HEAD.unpack_from(raw)
        if magic != MAGIC:
            raise ProtocolError(f"not a transfer frame (magic {bytes(magic)!r})")
        try:
            self.kind = Kind(kind)
        except ValueError:
            raise ProtocolError(f"unknown frame kind {kind}") from None
        if flags or reserved:
            raise ProtocolError(f"unsupported frame flags {flags:#x}/{reserved:#x}")
        limit = _LIMITS.get(self.kind, MAX_CONTROL)
        if payload_len > limit:
            raise ProtocolError(f"{self.kind.name} payload of {payload_len} bytes (max {limit})")
        if self.kind in CONTROL and (offset or length):
            raise ProtocolError(f"{self.kind.name} frame with a volume range")
        if offset >= MAX_VOLUME or length >= MAX_VOLUME:
            raise ProtocolError(f"{self.kind.name} range {offset}+{length} is out of bounds")
        if self.kind is Kind.DATA and length != payload_len:
            raise ProtocolError(f"DATA covers {length} bytes but carries {payload_len}")
        if self.kind is Kind.ZDATA and payload_len >= length:  # what does not shrink is DATA
            raise ProtocolError(f"ZDATA covers {length} bytes but carries {payload_len}")
        if self.kind in _CARRIED:
            if length == 0 or payload_len == 0:
                raise ProtocolError(f"{self.kind.name} record of no bytes")
            if offset // SEGMENT != (offset + length - 1) // SEGMENT:
                raise ProtocolError(f"{self.kind.name} {offset}+{length} crosses a segment "
                                    "boundary")  # fmt: skip
        if self.kind in _EMPTY and length == 0:
            raise ProtocolError(f"{self.kind.name} record of no bytes")
        self._raw = bytes(raw[: _HEAD.size])
        self.offset, self.length, self.payload_len = offset, length, payload_len
        (self.checksum,) = _CHECK.unpack_from(raw, _HEAD.size)

    def verify(self, payload: bytes | memoryview) -> None:
        if len(payload) != self.payload_len:
            raise ProtocolError(f"payload of {len(payload)} bytes, header says {self.payload_len}")
        if _checksum(self._raw, payload) != self.checksum:
            raise ChecksumMismatch(
                f"{self.kind.name} record at offset {self.offset}: checksum mismatch"
            )

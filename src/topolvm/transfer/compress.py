"""Optional compression of a copy's DATA records (zstd at a fast level), for links slower than
the disks (docs/mobility.md, "Performance").

A sender compresses only when the receiver asked for it in its HELLO (``features``: a receiver
asks when the sender's Node publishes that it compresses), so peers of an older release never
see a ZDATA record. Each DATA segment is compressed on its own (a record is decoded alone, and
a resume starts at any checkpoint); one that does not shrink by :data:`WORTHWHILE` travels as
plain DATA. After :data:`MISSES` such segments in a row the sender stops trying for a while
(:data:`BACKOFF` segments, doubling up to :data:`BACKOFF_MAX`): data that does not compress
(media, encrypted or already compressed files) costs a probe now and then, not a compression of
every byte. The whole-volume digest is over the volume's bytes, not the wire's.
"""

from __future__ import annotations

import zstandard

from topolvm.transfer.errors import ProtocolError
from topolvm.transfer.wire import SEGMENT

ZSTD = "zstd"
LEVEL = 1  # zstd's fast end: hundreds of MB/s per core
WORTHWHILE = 0.9  # a compressed segment travels only when at most this share of the raw one
MISSES = 4
BACKOFF = 64
BACKOFF_MAX = 1024


class Compressor:
    """The sender's side: :meth:`compress` returns the ZDATA payload of a DATA segment, or
    None when the segment travels as plain DATA."""

    def __init__(self, level: int = LEVEL) -> None:
        self._z = zstandard.ZstdCompressor(level=level, write_content_size=True)
        self._misses = 0
        self._skip = 0
        self._backoff = BACKOFF
        self.raw_bytes = 0  # of the segments sent compressed
        self.wire_bytes = 0  # their compressed size
        self.tried_bytes = 0  # of every segment compressed (sent so or not)

    def compress(self, data: memoryview) -> bytes | None:
        if self._skip:
            self._skip -= 1
            return None
        out: bytes = self._z.compress(data)
        self.tried_bytes += len(data)
        if len(out) > len(data) * WORTHWHILE:
            self._misses += 1
            if self._misses >= MISSES:
                self._skip, self._misses = self._backoff, 0
                self._backoff = min(self._backoff * 2, BACKOFF_MAX)
            return None
        self._misses, self._backoff = 0, BACKOFF
        self.raw_bytes += len(data)
        self.wire_bytes += len(out)
        return out


class Decompressor:
    """The receiver's side: a ZDATA payload back into the volume's ``length`` bytes."""

    def __init__(self) -> None:
        self._z = zstandard.ZstdDecompressor()

    def decompress(self, payload: memoryview, length: int, into: memoryview) -> memoryview:
        """The ``length`` bytes of ``payload``, in ``into`` (a page-aligned buffer of at least
        :data:`~.wire.SEGMENT` bytes: written with ``O_DIRECT``). Anything but one frame of
        exactly ``length`` bytes (bytes after it, a second frame) is a :class:`ProtocolError`."""
        if length > SEGMENT or len(into) < length:
            raise ProtocolError(f"ZDATA of {length} bytes (a segment is {SEGMENT})")
        try:
            params = zstandard.get_frame_parameters(payload)
            if params.content_size != length:
                raise ProtocolError(
                    f"ZDATA frame holds {params.content_size} bytes, its record {length}"
                )
            data = self._z.decompress(payload, max_output_size=length, read_across_frames=False,
                                      allow_extra_data=False)  # fmt: skip
        except zstandard.ZstdError as e:
            raise ProtocolError(f"ZDATA that does not decompress: {e}") from None
        if len(data) != length:
            raise ProtocolError(f"ZDATA decompressed to {len(data)} bytes, its record {length}")
        out = into[:length]
        out[:] = data
        return out

"""What the transfer's two ends are given by the node: the volumes it reads and writes (through
lvmd), the job a sender authorised, and the limits every copy of a node shares."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from topolvm.transfer import messages


@dataclass(frozen=True)
class VolumeInfo:
    """Where a volume's bytes are (lvmd's DescribeLV)."""

    path: str
    size: int
    thin: bool
    chunk: int  # the thin pool's chunk size; 0 for thick
    uuid: str


class Volumes(Protocol):
    async def describe(self, name: str, device_class: str, with_uuid: bool = False) -> VolumeInfo:
        """``with_uuid``: the identity a resume is checked against (a source's) is wanted."""

    async def mapped(self, name: str, device_class: str) -> list[tuple[int, int]] | None:
        """A thin volume's mapped byte ranges; None when they cannot be known (an lvmd
        without VolumeData, no thin_dump): the volume is then read whole."""

    async def changed(
        self, name: str, base: str, device_class: str, thin: bool = True
    ) -> list[tuple[int, int]] | None:
        """Byte ranges where volume ``name`` may differ from ``base``, sorted and merged: for
        two thin volumes of one pool, where they map other blocks; for two thick cuts of one
        origin (``thin`` False), the chunks written since the older one. None when unknown:
        every range is compared."""


@dataclass(frozen=True)
class Job:
    """A copy a sender authorised: the target LogicalVolume (``target``, UID ``uid``) on
    ``target_node`` is filled from this node's LV ``volume`` (of ``device_class``: the source
    LogicalVolume ``source`` itself, or a point-in-time cut of it). With a ``base`` (an LV of
    this node in the same device class, as large as ``volume``, whose bytes the target holds
    already) only what differs from it is sent: a delta copy."""

    uid: str
    target: str
    target_node: str
    volume: str
    device_class: str
    source: str  # the source LogicalVolume's name, for logs and status
    base: str = ""


Authorise = Callable[[messages.Hello], Awaitable[Job]]
"""Checks a HELLO (its token, its job); raises :class:`~.errors.Refused` with the reason."""


@dataclass(frozen=True)
class Limits:
    """Per node: ``concurrency`` copies at once in each direction, ``bandwidth`` bytes per
    second per copy (0: no cap, counted on the wire), ``io_timeout`` seconds without a byte
    before a connection is given up; ``compress``: the sender compresses DATA records for a
    receiver that can read them (:mod:`.compress`); ``streams``: the most connections one copy
    this node receives uses, each for a part of the volume (:mod:`.streams`)."""

    concurrency: int = 2
    bandwidth: int = 0
    io_timeout: float = 30.0
    compress: bool = False
    streams: int = 1

"""A verification's cut and its digest (blocking I/O; run in a worker thread): the names of the
cuts a node makes to verify its volumes, and the content digest of a volume read whole.

The digest is the copy's whole-volume chain (:mod:`topolvm.transfer.digest`): bytes are fed as
read, a thin volume's unmapped ranges as zeros, so equal content gives equal digests whether a
volume is thin or thick, sparse or not, and a full copy's ``status.copy.digest`` equals it. The
volume is read the way the transfer's sender reads one (:class:`~topolvm.transfer.pipeline.
RecordSource`: ``O_DIRECT`` into page-aligned buffers, the page cache dropped behind).
"""

from __future__ import annotations

import logging
import os
import threading

from topolvm.transfer import pipeline, plan, wire
from topolvm.transfer.blockio import Volume
from topolvm.transfer.errors import ConnectionLost

# ``verify.<LogicalVolume UID>``, tagged ``topolvm/cut`` as a copy's cuts: it lives while its
# node reads it, and its node's sweep removes one whose verification is over
VERIFY_PREFIX = "verify."
# the least copy-on-write area of a thick verification cut, as a share of its origin, when the
# node has no room for one as large: the volume's pod may write while the cut is read
VERIFY_COW_SHARE = 8


def verify_cut_name(lv_uid: str) -> str:
    return VERIFY_PREFIX + lv_uid


def uid_of_verify_cut(lv_name: str) -> str | None:
    return lv_name[len(VERIFY_PREFIX) :] if lv_name.startswith(VERIFY_PREFIX) else None


log = logging.getLogger(__name__)
NICE = 19  # a digest read's CPU priority: the least (a moved pod starts on the node meanwhile)


def in_background() -> None:
    """The calling thread (a digest's reader) yields the CPU to everything else: a move's
    target node reads its verification cut while the moved pod starts, and hashing half a GiB
    took the pod's start a second longer in the test bed's one-CPU guests."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except OSError as e:  # the read goes on, at the normal priority
        log.warning("a verification read keeps its CPU priority", extra={"error": str(e)})


class Stopped(Exception):
    """The read was stopped (the job was cancelled)."""


def content_digest(
    path: str, size: int, mapped: list[tuple[int, int]] | None, stop: threading.Event,
    bandwidth: int = 0,
) -> bytes:  # fmt: skip
    """The digest of the first ``size`` bytes of the volume at ``path``: where a thin volume
    maps blocks (``mapped``, sorted byte ranges) read, the rest zeros; ``None``: read whole.
    At most ``bandwidth`` bytes read per second (0: no limit). Raises
    :class:`~topolvm.transfer.errors.SourceFailed` for a read that fails (an overflowed COW
    cut reads as I/O errors), :class:`Stopped` once ``stop`` is set."""
    volume = Volume(path, writable=False)
    throttle = pipeline.Throttle(bandwidth)
    try:
        pieces = plan.mapped(size, mapped) if mapped is not None else plan.full(size)
        source = pipeline.RecordSource(volume, size, pieces)
        for kind, _, length, _ in source.records():
            if stop.is_set():
                raise Stopped("the verification was stopped")
            if kind is wire.Kind.DATA and bandwidth:
                try:
                    throttle.take(length, stop)
                except ConnectionLost as e:  # the throttle's wait ends when stop is set
                    raise Stopped("the verification was stopped") from e
        return source.digest.final()
    finally:
        volume.close()

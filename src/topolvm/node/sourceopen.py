"""Whether a move's source is closed before its final cut (docs/mobility.md, "Moving a claim").

The only sign that a moved claim's workload stopped is that its pod object is gone; a pod
force-deleted on a node cut off from the API server can go on writing. The source node asks
lvmd who holds the LV open (VolumeData's ``OpenState``: device-mapper's open count, mounts,
stacked devices) and makes the second cut only once nothing does. A kubelet unstages a volume a
moment after its pod went, so a volume still open is asked about again for a few seconds (udev's
probes open a device briefly too) before the copy is told to wait.
"""

from __future__ import annotations

import asyncio
import logging

from grpclib.const import Status

from topolvm.node.lvmd_client import LvmdCallError, LvmdClient
from topolvm.proto import volumedata_pb2 as vd

log = logging.getLogger(__name__)
PATIENCE = 5.0  # seconds a volume may take to close before the copy waits
EVERY = 0.5


class OpenUnknown(Exception):
    """lvmd could not tell whether the volume is open (it is asked again later)."""


def holding(state: vd.OpenStateResponse) -> str:
    """What holds a volume open, as the copy's message says it ("" when nothing does)."""
    if not state.active or state.open_count <= 0:
        return ""
    parts = []
    if state.mounts:
        parts.append("mounted at " + ", ".join(state.mounts))
    if state.holders:
        parts.append("under " + ", ".join(state.holders))
    parts.append(f"open count {state.open_count}")
    return "; ".join(parts)


async def still_open(
    lvmd: LvmdClient, volume: str, device_class: str, patience: float | None = None,
    every: float | None = None, *, unknown_closed: bool = True,
) -> str:  # fmt: skip
    """What holds the LV ``volume`` open after waiting up to ``patience`` seconds (default
    :data:`PATIENCE`) for it to close; "" once nothing does, or when lvmd cannot tell (an lvmd
    without ``OpenState``, logged; with ``unknown_closed`` False that raises
    :class:`OpenUnknown` too). Raises :class:`OpenUnknown` for other lvmd errors."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (PATIENCE if patience is None else patience)
    every = EVERY if every is None else every
    while True:
        try:
            state = await lvmd.open_state(volume, device_class)
        except LvmdCallError as e:
            if e.code is Status.UNIMPLEMENTED and unknown_closed:
                ctx = {"lv": volume, "error": str(e)}
                log.warning("lvmd cannot tell whether a volume is open: the final cut is made "
                            "without that check", extra=ctx)  # fmt: skip
                return ""
            raise OpenUnknown(f"lvmd cannot tell whether {volume} is open: {e.message}") from e
        held = holding(state)
        if not held or loop.time() >= deadline:
            return held
        await asyncio.sleep(every)

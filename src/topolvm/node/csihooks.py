"""What NodeService needs from the rest of topolvm-node: the LogicalVolumes (by volume id), and
what else a publish and an unpublish do (the pods' IO limits, node/iolimiter.py; a move's final
cut once its source closes, node/finalcut.py), run so that they never fail the CSI call."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

log = logging.getLogger(__name__)

HOOK_TIMEOUT = 30.0  # a hook that takes longer is abandoned: the publish goes on without it


class VolumeLookup(Protocol):
    async def device_class_of(self, volume_id: str) -> str | None:
        """Device class of the LogicalVolume whose status.volumeID is volume_id.

        None if there is none.
        """

    async def unfilled(self, volume_id: str) -> str | None:
        """Why the volume may not be published yet: a copy still fills it (None: it may)."""


class PublishHooks(Protocol):
    """What else a publish and an unpublish do (the pod's IO limits: node/iolimiter.py; a
    move's final cut: node/finalcut.py); a hook logs its own failures and never fails the
    call."""

    async def publishing(self, volume_id: str, target: str) -> None:
        """Before the volume is mounted at ``target`` (quick: the publish waits for it)."""

    async def published(self, volume_id: str, target: str, context: Mapping[str, str]) -> None:
        """After the volume is published at ``target``."""

    async def unpublishing(self, volume_id: str, target: str) -> None:
        """Before the volume is unpublished from ``target``."""

    async def unpublished(self, volume_id: str, target: str) -> None:
        """After the volume is unmounted from ``target``."""


async def run_hooks(hooks: Sequence[PublishHooks], which: str, *args: Any) -> None:
    """``hook.<which>(*args)`` of each hook in turn, each with its own time limit: a failure or
    a hang is logged, never the call's, and never keeps the next hook from running."""
    for hook in hooks:
        await _run_hook(hook, which, *args)


async def _run_hook(hook: PublishHooks, which: str, *args: Any) -> None:
    try:
        await asyncio.wait_for(getattr(hook, which)(*args), HOOK_TIMEOUT)
    except TimeoutError:
        log.warning("publish hook timed out", extra={"hook": which, "volume_id": args[0],
                                                      "secs": HOOK_TIMEOUT})  # fmt: skip
    except Exception:
        log.exception("publish hook failed", extra={"hook": which, "volume_id": args[0]})

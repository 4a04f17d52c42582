"""Process lifecycle shared by the daemons."""

from __future__ import annotations

import asyncio
import signal


async def until_terminated() -> None:
    """Return once SIGTERM or SIGINT arrives (daemons then shut down gracefully)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)

"""How the app starts the webhook (every replica) and the reconcilers (the leader)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from topolvm.controller.app import Part, TopolvmController


async def start_webhook(app: TopolvmController) -> list[tuple[str, Part]]:
    """Start the pod webhook; returns (name, stop) pairs."""
    return []


async def run_reconcilers(app: TopolvmController) -> None:
    """Run the node, PVC and LogicalVolume-GC reconcilers until cancelled."""
    await asyncio.Event().wait()

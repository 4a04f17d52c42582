"""Change events: what the store records for every write and what a watch sees of one."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from aiohttp import web

from tests.kube_emulator.objects import JSON
from tests.kube_emulator.selectors import Predicate


@dataclass
class Event:
    rv: int
    store_key: tuple[str, str]
    type: str  # ADDED / MODIFIED / DELETED
    old: JSON | None
    new: JSON


@dataclass(eq=False)
class Watcher:
    store_key: tuple[str, str]
    queue: asyncio.Queue[Event | str | None] = field(default_factory=asyncio.Queue)
    bookmarks: bool = False


def transition(ev: Event, match: Predicate) -> list[tuple[str, JSON]]:
    """The events a filtered watch sees for one change."""
    was = ev.old is not None and ev.type != "ADDED" and match(ev.old)
    if ev.type == "DELETED":
        return [("DELETED", ev.new)] if was else []
    now = match(ev.new)
    if was and now:
        return [("MODIFIED", ev.new)]
    if was:
        return [("DELETED", ev.new)]
    if now:
        return [("ADDED", ev.new)]
    return []


async def send(resp: web.StreamResponse, kind: str, obj: JSON) -> None:
    """Write one watch event as a line of JSON."""
    await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

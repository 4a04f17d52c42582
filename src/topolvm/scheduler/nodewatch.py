"""Keeps the extender's node cache current from a watch on Nodes (``--node-cache`` mode)."""

from __future__ import annotations

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from topolvm.k8s.api import Obj
from topolvm.k8s.runtime import Informer
from topolvm.scheduler.nodecache import NodeCache


def node_informer(client: AsyncClient, cache: NodeCache) -> Informer:
    """An informer on Nodes that feeds ``cache``; run it with ``await informer.run()``.

    Every full list (at start, after a 410 or a broken watch, and every resync) re-stamps all
    entries, so the resync period stays well below the cache's max age: a quiet node is never
    mistaken for a stale one. Repeated list failures mark the cache unsynced, which turns every
    node into "unknown capacity" (never zero) until the next successful list.
    """
    informer = Informer(client, Node, resync=min(300.0, cache.max_age / 3))

    def on_event(event: str, obj: Obj) -> None:
        if event == "DELETED":
            cache.delete(str(obj["metadata"]["name"]))
        else:
            cache.upsert(obj)

    def on_sync(ok: bool, reason: str) -> None:
        if ok:
            cache.mark_synced()
        else:
            cache.mark_unsynced(reason)

    informer.add_handler(on_event)
    informer.add_sync_handler(on_sync)
    return informer

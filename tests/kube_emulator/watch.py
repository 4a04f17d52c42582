"""Watches: newline-delimited JSON events, replayed history, 410 Expired, bookmarks."""

from __future__ import annotations

import asyncio
import builtins
import copy

from aiohttp import web

from tests.kube_emulator.errors import ApiFailure, status_body
from tests.kube_emulator.events import Event, Watcher, send, transition
from tests.kube_emulator.objects import JSON, ResourceType, served
from tests.kube_emulator.verbs import Verbs


class Watches(Verbs):
    """Watch streams on the store's changes.

    ``bookmark_interval`` is the period of BOOKMARK events for watches that asked for them
    with ``allowWatchBookmarks=true``.
    """

    bookmark_interval: float

    async def close_watches(self) -> None:
        """End every open watch stream (like an apiserver restart)."""
        for w in list(self._watchers):
            w.queue.put_nowait(None)
        await asyncio.sleep(0)

    async def send_bookmarks(self) -> None:
        """Send a BOOKMARK now to every watch that allows bookmarks."""
        for w in self._watchers:
            if w.bookmarks:
                w.queue.put_nowait("BOOKMARK")
        await asyncio.sleep(0)

    async def _watch(
        self, request: web.Request, rtype: ResourceType, namespace: str, query: dict[str, str]
    ) -> web.StreamResponse:
        match = self._select(rtype, namespace, query)
        rv_param = query.get("resourceVersion", "")
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        watcher = Watcher(rtype.store_key, bookmarks=query.get("allowWatchBookmarks") == "true")
        initial: builtins.list[tuple[str, JSON]] = []
        expired: JSON | None = None
        if rv_param in ("", "0"):
            items = sorted(self._store[rtype.store_key].items())
            initial = [("ADDED", copy.deepcopy(o)) for _, o in items if match(o)]
        else:
            try:
                since = int(rv_param)
            except ValueError as e:
                raise ApiFailure(400, f"invalid resource version: {rv_param!r}") from e
            if since < self._floor:
                expired = status_body(
                    410, f"too old resource version: {since} ({self._floor})", "Expired"
                )
            else:
                for ev in self._history:
                    if ev.rv > since and ev.store_key == rtype.store_key:
                        initial.extend(transition(ev, match))
        if expired is None:
            self._watchers.add(watcher)  # no await since the snapshot: nothing is missed
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout is not None else None
        try:
            await resp.prepare(request)
            if expired is not None:
                await send(resp, "ERROR", expired)
                await resp.write_eof()
                return resp
            for kind, obj in initial:
                await send(resp, kind, served(rtype, obj))
            next_bookmark = loop.time() + self.bookmark_interval
            while True:
                now = loop.time()
                waits = [next_bookmark - now] if watcher.bookmarks else []
                if deadline is not None:
                    waits.append(deadline - now)
                if deadline is not None and deadline <= now:
                    break
                try:
                    item = await asyncio.wait_for(
                        watcher.queue.get(), max(0.0, min(waits)) if waits else None
                    )
                except TimeoutError:
                    item = "BOOKMARK" if watcher.bookmarks and loop.time() >= next_bookmark else ""
                if item is None:
                    break
                if item == "BOOKMARK":
                    next_bookmark = loop.time() + self.bookmark_interval
                    bookmark = {
                        "kind": rtype.kind,
                        "apiVersion": rtype.api_version,
                        "metadata": {"resourceVersion": str(self._rv)},
                    }
                    await send(resp, "BOOKMARK", bookmark)
                elif isinstance(item, Event):
                    for kind, obj in transition(item, match):
                        await send(resp, kind, served(rtype, obj))
            await resp.write_eof()
        except ConnectionResetError:
            pass
        finally:
            self._watchers.discard(watcher)
        return resp

"""A small level-triggered reconcile runtime: informers feed a work queue of object keys.

- :class:`Informer` keeps a cache of one resource: list, then watch from the list's
  resourceVersion; a 410 Gone or a broken stream re-lists; a periodic resync re-lists too, so
  missed deletions are noticed and every object is reconciled again.
- :class:`WorkQueue` holds each key at most once. A key is never processed by two workers at the
  same time: a key added while it is being processed runs again afterwards.
- :class:`Controller` runs a reconcile function over the queue with per-key exponential backoff on
  failure and ``requeue_after`` for periodic checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient

from topolvm.k8s.api import Obj, Resource, list_all, to_dict
from topolvm.k8s.errors import Gone, KubeError, describe, translated_stream

log = logging.getLogger(__name__)

EventHandler = Callable[[str, Obj], None]
"""Called with ("ADDED" | "MODIFIED" | "DELETED", object) for every change the cache sees."""

SyncHandler = Callable[[bool, str], None]
"""Called with (True, "") after every successful list, (False, reason) while listing fails."""


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


def resource_version(obj: Obj) -> int:
    """``metadata.resourceVersion`` as a number (etcd's revision), 0 when absent or not one.
    Kubernetes calls it opaque; the API server this runs against gives revisions."""
    try:
        return int(obj.get("metadata", {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class Informer:
    """Cache of one resource kept current by list + watch."""

    def __init__(
        self,
        client: AsyncClient,
        resource: Resource,
        *,
        labels: dict[str, Any] | None = None,
        fields: dict[str, Any] | None = None,
        resync: float = 600.0,
        max_backoff: float = 30.0,
    ):
        self.client = client
        self.resource = resource
        self.labels = labels
        self.fields = fields
        self.resync = resync
        self.max_backoff = max_backoff
        self.cache: dict[str, Obj] = {}
        self.synced = asyncio.Event()
        self.handlers: list[EventHandler] = []
        self.sync_handlers: list[SyncHandler] = []
        self.unsynced_after = 3  # consecutive failures before sync handlers hear about it
        self.kind = getattr(resource, "__name__", str(resource))
        self.lists = 0  # number of full lists done, for tests and diagnostics

    def add_handler(self, handler: EventHandler) -> None:
        self.handlers.append(handler)

    def add_sync_handler(self, handler: SyncHandler) -> None:
        self.sync_handlers.append(handler)

    def _sync(self, ok: bool, reason: str) -> None:
        for handler in self.sync_handlers:
            try:
                handler(ok, reason)
            except Exception:
                log.exception("sync handler failed", extra={"kind": self.kind})

    def get(self, key: str) -> Obj | None:
        return self.cache.get(key)

    def values(self) -> Iterable[Obj]:
        return list(self.cache.values())

    def _emit(self, event: str, obj: Obj) -> None:
        for handler in self.handlers:
            try:
                handler(event, obj)
            except Exception:
                log.exception("event handler failed", extra={"kind": self.kind, "event": event})

    def _apply(self, event: str, obj: Obj) -> None:
        key = object_key(obj)
        if event == "DELETED":
            self.cache.pop(key, None)
        else:
            old = self.cache.get(key)
            if old is not None and resource_version(old) > resource_version(obj) > 0:
                return  # an older version than we already have (relist raced a watch)
            self.cache[key] = obj
            event = "MODIFIED" if old is not None else "ADDED"
        self._emit(event, obj)

    def _filters(self) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if self.labels:
            kw["labels"] = self.labels
        if self.fields:
            kw["fields"] = self.fields
        return kw

    async def relist(self) -> str:
        """Replace the cache with a fresh list; emit changes and deletions. Returns the list RV."""
        items, rv = await list_all(self.client, self.resource, **self._filters())
        self.lists += 1
        fresh = {object_key(o): o for o in items}
        for key in set(self.cache) - set(fresh):
            self._apply("DELETED", self.cache[key])
        for obj in fresh.values():
            self._apply("ADDED", obj)
        self.synced.set()
        self._sync(True, "")
        return rv

    async def _watch(self, rv: str) -> None:
        """Apply watch events until the resync deadline. Raises on stream errors (incl. 410)."""
        deadline = time.monotonic() + self.resync * random.uniform(0.9, 1.1)
        stream = self.client.watch(self.resource, resource_version=rv or None, **self._filters())
        iterator = translated_stream(stream).__aiter__()
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                try:
                    event, obj = await asyncio.wait_for(iterator.__anext__(), remaining)
                except TimeoutError:
                    return
                if event in ("ADDED", "MODIFIED", "DELETED"):
                    self._apply(event, to_dict(obj))
        finally:
            with contextlib.suppress(Exception):
                await iterator.aclose()  # type: ignore[attr-defined]

    async def run(self) -> None:
        """Keep the cache current until cancelled."""
        failures = 0
        while True:
            try:
                rv = await self.relist()
                failures = 0
                await self._watch(rv)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                failures += 1
                delay = min(self.max_backoff, 0.2 * 2 ** min(failures, 10))
                gone = isinstance(e, Gone)
                if failures >= self.unsynced_after:
                    self._sync(False, describe(e))
                level = logging.INFO if gone else logging.WARNING
                log.log(
                    level,
                    f"{self.kind} watch ended, listing again: {describe(e)}",
                    extra={"kind": self.kind, "retry_in": round(delay, 2)},
                )
                await asyncio.sleep(0 if gone else delay)


@dataclass
class Result:
    """What a reconcile asks for: ``requeue_after`` seconds (None = only on the next event)."""

    requeue_after: float | None = None


Reconcile = Callable[[str], Awaitable[Result | None]]


class WorkQueue:
    """A set-like FIFO of keys with per-key serialization and delayed adds."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def add(self, key: str) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.put_nowait(key)

    def add_after(self, key: str, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        old = self._timers.pop(key, None)
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        if old is not None and old.when() < when:
            self._timers[key] = old  # an earlier retry is already scheduled
            return
        if old is not None:
            old.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> str:
        key = await self._queue.get()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.put_nowait(key)

    def __len__(self) -> int:
        return len(self._dirty)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


class Controller:
    """Runs ``reconcile(key)`` for queued keys with ``workers`` concurrent workers."""

    def __init__(
        self,
        name: str,
        reconcile: Reconcile,
        *,
        workers: int = 4,
        base_backoff: float = 0.05,
        max_backoff: float = 300.0,
    ):
        self.name = name
        self.reconcile = reconcile
        self.workers = workers
        self.base_backoff = base_backoff
        self.max_backoff = max_backoff
        self.queue = WorkQueue()
        self._failures: dict[str, int] = {}

    def enqueue(self, key: str, after: float = 0.0) -> None:
        self.queue.add_after(key, after)

    def backoff(self, key: str) -> float:
        failures = self._failures.get(key, 0)
        return float(min(self.max_backoff, self.base_backoff * 2**failures))

    async def _process(self, key: str) -> None:
        started = time.monotonic()
        try:
            result = await self.reconcile(key)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            delay = self.backoff(key)
            self._failures[key] = self._failures.get(key, 0) + 1
            log.warning(
                f"reconcile failed: {describe(e)}",
                extra={"controller": self.name, "key": key, "retry_in": round(delay, 3)},
                exc_info=not isinstance(e, KubeError | ReconcileError),
            )
            self.queue.add_after(key, delay)
            return
        self._failures.pop(key, None)
        log.debug(
            "reconciled",
            extra={
                "controller": self.name,
                "key": key,
                "secs": round(time.monotonic() - started, 4),
            },
        )
        if result is not None and result.requeue_after is not None:
            self.queue.add_after(key, result.requeue_after)

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self._process(key)
            finally:
                self.queue.done(key)

    async def run(self) -> None:
        """Process the queue until cancelled."""
        try:
            async with asyncio.TaskGroup() as tg:
                for _ in range(self.workers):
                    tg.create_task(self._worker())
        finally:
            self.queue.close()


class ReconcileError(Exception):
    """An expected failure: logged without a traceback and retried with backoff."""

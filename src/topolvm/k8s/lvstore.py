"""Access to LogicalVolume objects for the controller and the node (spec §5.1): create and
wait for the node's answer, find by volume id through an index, raise ``spec.size``, delete and
wait until gone. Reads go to the informer cache first and to the API when the cache has not seen
an object yet; writes go through ``k8s.api``'s helpers only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lightkube import AsyncClient

from topolvm.constants import Names
from topolvm.k8s import api
from topolvm.k8s.errors import Conflict
from topolvm.k8s.lvobject import InvalidQuantity, LogicalVolumeObject, format_quantity
from topolvm.k8s.runtime import Informer

log = logging.getLogger(__name__)

POLL_FIRST = 1.0  # upstream polls 1 s, doubling to 10 s; informer events wake us earlier
POLL_MAX = 10.0


@dataclass(frozen=True)
class VolumeRequest:
    """What the controller asks a node to create (the object's ``spec``), and the metadata
    it starts with."""

    name: str
    node_name: str
    size: int
    device_class: str = ""
    lvcreate_option_class: str = ""
    source: str = ""
    access_type: str = ""
    copy_source: str = ""  # spec.copy.source: fill it from this LogicalVolume (another node's)
    copy_keep_cut: bool = False  # a move's copy: the source's node keeps its first cut
    io_limits: tuple[tuple[str, int], ...] = ()  # spec.ioLimits (topolvm.iolimits.to_spec)
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    finalizers: tuple[str, ...] = ()

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "nodeName": self.node_name,
                               "size": format_quantity(self.size)}  # fmt: skip
        for key, value in (("deviceClass", self.device_class),
                           ("lvcreateOptionClass", self.lvcreate_option_class),
                           ("source", self.source), ("accessType", self.access_type)):  # fmt: skip
            if value:
                out[key] = value
        if self.copy_source:
            out["copy"] = {"source": self.copy_source}
            if self.copy_keep_cut:
                out["copy"]["keepCut"] = True
        if self.io_limits:
            out["ioLimits"] = dict(self.io_limits)
        return out

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name}
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        if self.finalizers:
            meta["finalizers"] = list(self.finalizers)
        return meta

    def compatible(self, lv: LogicalVolumeObject) -> bool:
        """Upstream's rule for a retried create: same name, source and size (and, for a copy,
        the same node and source)."""
        if lv.copy_source != self.copy_source or (
            self.copy_source and lv.node_name != self.node_name
        ):
            return False
        return lv.name == self.name and lv.source == self.source and lv.size == self.size


class IncompatibleVolume(Exception):
    """An object of that name exists with another size or source."""


class VolumeFailed(Exception):
    """The node reported a failure in ``status.code`` (a gRPC code) and ``status.message``."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class AmbiguousVolumeId(Exception):
    """More than one LogicalVolume carries the same ``status.volumeID``."""


def requested_at_now() -> str:
    """``<p>/resize-requested-at`` as upstream writes it (Go's ``time.Time.String()``)."""
    now = datetime.now(UTC)
    return now.strftime("%Y-%m-%d %H:%M:%S.%f000 +0000 UTC")


class LogicalVolumeStore:
    def __init__(self, client: AsyncClient, names: Names, informer: Informer):
        self.client = client
        self.names = names
        self.informer = informer
        self.resource = api.logicalvolume_resource(names)
        self._by_volume_id: dict[str, set[str]] = {}
        self._volume_id_of: dict[str, str] = {}
        self._waiters: dict[str, set[asyncio.Event]] = {}
        informer.add_handler(self._on_event)

    # -- index and wake-ups --------------------------------------------------------------

    def _on_event(self, event: str, obj: api.Obj) -> None:
        name = str(obj["metadata"]["name"])
        old = self._volume_id_of.pop(name, "")
        if old:
            self._by_volume_id.get(old, set()).discard(name)
        vid = str((obj.get("status") or {}).get("volumeID") or "")
        if event != "DELETED" and vid:
            self._volume_id_of[name] = vid
            self._by_volume_id.setdefault(vid, set()).add(name)
        for waiter in self._waiters.get(name, ()):
            waiter.set()

    @contextlib.contextmanager
    def _watching(self, name: str) -> Iterator[asyncio.Event]:
        """An event set on every informer change of ``name``, registered before the caller
        reads the object, so that no change between the read and the wait is lost."""
        event = asyncio.Event()
        self._waiters.setdefault(name, set()).add(event)
        try:
            yield event
        finally:
            waiters = self._waiters.get(name)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[name]

    async def _synced(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.informer.synced.wait(), 10)

    # -- reads ---------------------------------------------------------------------------

    async def get(self, name: str, *, fresh: bool = False) -> LogicalVolumeObject | None:
        """By object name: the cache, then the API (or the API only when ``fresh``)."""
        obj = None if fresh else self.informer.get(name)
        if obj is None:
            obj = await api.get(self.client, self.resource, name)
        return None if obj is None else LogicalVolumeObject.from_dict(obj)

    async def find_by_volume_id(self, volume_id: str) -> LogicalVolumeObject | None:
        """By ``status.volumeID`` (= LV name = CSI volume id): the index, then a full list."""
        await self._synced()
        names = sorted(self._by_volume_id.get(volume_id, ()))
        objs = [o for o in (self.informer.get(n) for n in names) if o is not None]
        if not objs:  # the cache may lag behind a status update that just happened
            items, _ = await api.list_all(self.client, self.resource)
            objs = [o for o in items if (o.get("status") or {}).get("volumeID") == volume_id]
        if len(objs) > 1:
            found = ", ".join(str(o["metadata"]["name"]) for o in objs)
            raise AmbiguousVolumeId(f"volume id {volume_id} is claimed by {found}")
        return LogicalVolumeObject.from_dict(objs[0]) if objs else None

    def cached_node_of(self, volume_id: str) -> str | None:
        """The node of the one LogicalVolume whose ``status.volumeID`` is ``volume_id``, from the
        cache only (None when it is not there, or not yet synced): for reads that must stay
        cheap, such as an admission webhook's."""
        objs = [o for o in (self.informer.get(n) for n in self._by_volume_id.get(volume_id, ()))
                if o is not None]  # fmt: skip
        if len(objs) != 1:
            return None
        return str((objs[0].get("spec") or {}).get("nodeName") or "") or None

    async def device_class_of(self, volume_id: str) -> str | None:
        lv = await self.find_by_volume_id(volume_id)
        return None if lv is None else lv.device_class

    async def unfilled(self, volume_id: str) -> str | None:
        """What the copy that fills the volume is doing, while it is not done."""
        lv = await self.find_by_volume_id(volume_id)
        if lv is None or lv.copy_done:
            return None
        copy = lv.copy
        if copy is None:
            return "a copy is to fill it"
        done = f" ({copy.done_bytes} of {copy.total_bytes} bytes)" if copy.total_bytes else ""
        return f"a copy fills it: {copy.phase}{done} {copy.message}".rstrip()

    def all(self) -> list[LogicalVolumeObject]:
        """Every LogicalVolume in the cache that reads as one."""
        out = []
        for obj in self.informer.values():
            with contextlib.suppress(InvalidQuantity, KeyError, TypeError, ValueError):
                out.append(LogicalVolumeObject.from_dict(obj))
        return out

    def on_node(self, node_name: str) -> list[LogicalVolumeObject]:
        return [
            LogicalVolumeObject.from_dict(o)
            for o in self.informer.values()
            if (o.get("spec") or {}).get("nodeName") == node_name
        ]

    # -- writes and waits ----------------------------------------------------------------

    async def create(self, request: VolumeRequest) -> LogicalVolumeObject:
        """Create the object, or return the existing one when it is compatible."""
        existing = await self.get(request.name)
        if existing is None:
            body = {"apiVersion": f"{self.names.group}/v1", "kind": "LogicalVolume",
                    "metadata": request.metadata(), "spec": request.spec()}  # fmt: skip
            try:
                created = await api.create(self.client, self.resource.from_dict(body))
                return LogicalVolumeObject.from_dict(created)
            except Conflict:  # created meanwhile (a retried call): compare with it
                pass
            existing = await self.get(request.name, fresh=True)
            if existing is None:
                raise IncompatibleVolume(f"LogicalVolume {request.name} is being replaced; retry")
        if not request.compatible(existing):
            raise IncompatibleVolume("Incompatible LogicalVolume already exists")
        return existing

    async def _until(
        self, name: str, done: Callable[[LogicalVolumeObject | None], Awaitable[bool]]
    ) -> None:
        delay = POLL_FIRST
        with self._watching(name) as changed:
            while True:
                changed.clear()
                if await done(await self.get(name)):
                    return
                try:
                    await asyncio.wait_for(changed.wait(), delay)
                    continue  # the informer saw a change: read it from the cache
                except TimeoutError:
                    delay = min(delay * 2, POLL_MAX)
                # no event: an informer that lags must not make us trust a stale cache
                if await done(await self.get(name, fresh=True)):
                    return

    async def wait_created(self, name: str, *, filled: bool = True) -> LogicalVolumeObject:
        """Until the node set ``status.volumeID`` and, with ``filled``, a copy's target holds
        its data (``status.copy.phase`` Done). A failure code deletes the object and raises
        :class:`VolumeFailed` with the node's code (ResourceExhausted makes the provisioner
        choose another node)."""
        result: list[LogicalVolumeObject] = []

        async def done(lv: LogicalVolumeObject | None) -> bool:
            if lv is None:
                raise VolumeFailed(5, f"LogicalVolume {name} was deleted while being created")
            if lv.code:
                await self.delete(name)
                raise VolumeFailed(lv.code, lv.message)
            if lv.volume_id and (lv.copy_done or not filled):
                result.append(lv)
                return True
            return False

        await self._until(name, done)
        return result[0]

    async def delete(self, name: str, *, uid: str = "", resource_version: str = "") -> None:
        """Delete by name; an object already gone is fine. With ``uid`` (and
        ``resource_version``) only the object read (unchanged since): else
        :class:`~topolvm.k8s.errors.PreconditionFailed`, and nothing is deleted."""
        await api.delete(self.client, self.resource, name, uid=uid,
                         resource_version=resource_version)  # fmt: skip

    async def delete_and_wait(self, name: str) -> None:
        """Delete and return once the node removed its LV (its finalizer) and the object is gone."""
        await self.delete(name)

        async def gone(lv: LogicalVolumeObject | None) -> bool:
            return lv is None

        await self._until(name, gone)

    async def raise_size(self, name: str, size: int) -> LogicalVolumeObject | None:
        """Set ``spec.size`` (never lower it) and the resize-requested-at annotation."""

        def mutate(obj: api.Obj) -> bool:
            meta = obj["metadata"]
            meta.setdefault("annotations", {})[self.names.resize_requested_at] = requested_at_now()
            obj["spec"]["size"] = format_quantity(size)
            return True

        stored = await api.modify(self.client, self.resource, name, mutate)
        return None if stored is None else LogicalVolumeObject.from_dict(stored)

    async def update_io_limits(
        self, name: str, update: Callable[[dict[str, Any]], dict[str, int]]
    ) -> LogicalVolumeObject | None:
        """``spec.ioLimits`` made ``update(stored)`` (none: removed), compare-and-swap on the
        object as read; None if it is gone."""

        def mutate(obj: api.Obj) -> bool:
            stored = dict(obj["spec"].get("ioLimits") or {})
            limits = update(stored)
            if limits == stored:
                return False
            if limits:
                obj["spec"]["ioLimits"] = dict(limits)
            else:
                obj["spec"].pop("ioLimits", None)
            return True

        stored = await api.modify(self.client, self.resource, name, mutate)
        return None if stored is None else LogicalVolumeObject.from_dict(stored)

    async def wait_resized(self, name: str, size: int) -> LogicalVolumeObject:
        """Until ``status.currentSize >= size``; a failure code raises :class:`VolumeFailed`."""
        result: list[LogicalVolumeObject] = []

        async def done(lv: LogicalVolumeObject | None) -> bool:
            if lv is None:
                raise VolumeFailed(5, f"LogicalVolume {name} is not found")
            if lv.current_size is not None and lv.current_size >= size:
                result.append(lv)
                return True
            if lv.code:
                raise VolumeFailed(lv.code, lv.message)
            return False

        await self._until(name, done)
        return result[0]

"""The object store: served types, one global resourceVersion, the history watches replay."""

from __future__ import annotations

import asyncio
import builtins
import copy
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

import yaml

from tests.kube_emulator.events import Event, Watcher
from tests.kube_emulator.objects import (
    CRD_DIR,
    DEFAULT_CRDS,
    JSON,
    ResourceType,
    now_rfc3339,
    spec_of,
)


class Store:
    """Stored objects by type and (namespace, name), with the retained change history.

    ``history_limit`` is the number of retained watch events (older resource versions get
    a 410). Serves the built-in kinds our components use and the CRDs in ``crds`` (by
    default the LogicalVolume CRDs of deploy/crds).
    """

    def __init__(self, *, history_limit: int = 1000, crds: Iterable[Path] | None = None) -> None:
        self.history_limit = history_limit
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._store: dict[tuple[str, str], dict[tuple[str, str], JSON]] = {}
        self._rv = 1
        self._history: deque[Event] = deque()
        self._floor = 0  # watches from a resourceVersion below this get 410 Expired
        self._watchers: set[Watcher] = set()
        # what the cluster's other parts do at once with an object created through the API (a
        # kubelet reporting a pod it was given, say): each may change the object, status too
        self.on_create: list[Callable[[JSON], None]] = []

        self.register("", "v1", "nodes", "Node", False, True, status_on_create=True)
        self.register("", "v1", "pods", "Pod", True, True, selectable_fields=("spec.nodeName",))
        self.register("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, True)
        self.register("storage.k8s.io", "v1", "csidrivers", "CSIDriver", False, False)
        self.register("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, False)
        self.register(
            "storage.k8s.io", "v1", "csistoragecapacities", "CSIStorageCapacity", True, False
        )
        self.register("coordination.k8s.io", "v1", "leases", "Lease", True, False)
        for path in crds if crds is not None else [CRD_DIR / n for n in DEFAULT_CRDS]:
            self.register_crd(yaml.safe_load(path.read_text()))

    # -- registry ------------------------------------------------------------

    def register(
        self,
        group: str,
        version: str,
        plural: str,
        kind: str,
        namespaced: bool,
        status_subresource: bool,
        selectable_fields: Iterable[str] = (),
        *,
        custom: bool = False,
        status_on_create: bool = False,
    ) -> ResourceType:
        """Serve a resource. Several versions of one group/plural share one storage.

        ``custom`` marks a custom resource (strategic merge patch refused, resourceVersion
        required on PUT); ``status_on_create`` keeps a status sent with a create.
        """
        rtype = ResourceType(
            group, version, plural, kind, namespaced, status_subresource,
            tuple(selectable_fields), custom, status_on_create,
        )  # fmt: skip
        self._types[group, version, plural] = rtype
        self._store.setdefault(rtype.store_key, {})
        return rtype

    def register_crd(self, manifest: JSON) -> list[ResourceType]:
        """Serve every version of a ``CustomResourceDefinition`` manifest."""
        spec = manifest["spec"]
        names = spec["names"]
        out = []
        for ver in spec["versions"]:
            if not ver.get("served", True):
                continue
            sub = ver.get("subresources") or spec.get("subresources") or {}
            fields = [f["jsonPath"].lstrip(".") for f in ver.get("selectableFields") or []]
            out.append(
                self.register(
                    spec["group"], ver["name"], names["plural"], names["kind"],
                    spec.get("scope", "Namespaced") == "Namespaced", "status" in sub,
                    fields, custom=True,
                )
            )  # fmt: skip
        return out

    def _find_type(self, plural: str, group: str | None) -> ResourceType:
        found = {
            t.store_key: t
            for t in self._types.values()
            if t.plural == plural and (group is None or t.group == group)
        }
        if len(found) != 1:
            raise KeyError(f"{len(found)} resources match plural={plural!r} group={group!r}")
        return next(iter(found.values()))

    def _type_of(self, obj: JSON) -> ResourceType:
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        group, _, version = api_version.rpartition("/")
        for t in self._types.values():
            if (t.group, t.version, t.kind) == (group, version, kind):
                return t
        raise KeyError(f"no resource registered for {api_version} {kind}")

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion."""
        return str(self._rv)

    def compact(self) -> None:
        """Drop the whole watch history: watches from any older resourceVersion get 410."""
        self._history.clear()
        self._floor = self._rv

    # -- direct state access (no HTTP) --------------------------------------

    def get(
        self, plural: str, name: str, namespace: str | None = None, *, group: str | None = None
    ) -> JSON | None:
        """A deep copy of a stored object, or None. ``group`` is needed only when ambiguous."""
        rtype = self._find_type(plural, group)
        obj = self._store[rtype.store_key].get((namespace or "", name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(
        self, plural: str, *, group: str | None = None, namespace: str | None = None
    ) -> builtins.list[JSON]:
        """Deep copies of the stored objects, sorted by namespace and name."""
        rtype = self._find_type(plural, group)
        items = sorted(self._store[rtype.store_key].items())
        return [copy.deepcopy(o) for k, o in items if namespace is None or k[0] == namespace]

    def create(self, obj: JSON) -> JSON:
        """Create or replace ``obj`` (identified by apiVersion/kind/namespace/name) at once.

        Bypasses validation and optimistic locking but bumps the resourceVersion and emits
        watch events like a write; status and finalizers are taken as given.
        """
        rtype = self._type_of(obj)
        new = copy.deepcopy(obj)
        meta = new.setdefault("metadata", {})
        key = (meta.get("namespace", "") if rtype.namespaced else "", meta["name"])
        old = self._store[rtype.store_key].get(key)
        if old is None:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", now_rfc3339())
            meta.setdefault("generation", 1)
            return self._commit(rtype, key, None, new, "ADDED")
        for k in ("uid", "creationTimestamp"):
            meta.setdefault(k, old["metadata"].get(k))
        meta["generation"] = old["metadata"].get("generation", 1) + (spec_of(old) != spec_of(new))
        return self._commit(rtype, key, old, new, "MODIFIED")

    async def put(self, obj: JSON) -> JSON:
        """Async form of :meth:`create` (lets watch streams run)."""
        out = self.create(obj)
        await asyncio.sleep(0)
        return out

    def remove_now(
        self, plural: str, name: str, namespace: str | None = None, *, group: str | None = None
    ) -> JSON | None:
        """Remove an object at once, ignoring finalizers; returns it (None if absent)."""
        rtype = self._find_type(plural, group)
        key = (namespace or "", name)
        old = self._store[rtype.store_key].get(key)
        if old is None:
            return None
        return self._commit(rtype, key, old, copy.deepcopy(old), "DELETED")

    async def remove(
        self, plural: str, name: str, namespace: str | None = None, *, group: str | None = None
    ) -> JSON | None:
        """Async form of :meth:`remove_now`."""
        out = self.remove_now(plural, name, namespace, group=group)
        await asyncio.sleep(0)
        return out

    # -- storage core --------------------------------------------------------

    def _commit(
        self, rtype: ResourceType, key: tuple[str, str], old: JSON | None, new: JSON, kind: str
    ) -> JSON:
        self._rv += 1
        new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
        new["metadata"]["resourceVersion"] = str(self._rv)
        store = self._store[rtype.store_key]
        if kind == "DELETED":
            store.pop(key, None)
        else:
            store[key] = new
        event = Event(self._rv, rtype.store_key, kind, copy.deepcopy(old), copy.deepcopy(new))
        if len(self._history) >= self.history_limit:
            self._floor = self._history.popleft().rv
        self._history.append(event)
        for w in self._watchers:
            if w.store_key == rtype.store_key:
                w.queue.put_nowait(event)
        return copy.deepcopy(new)

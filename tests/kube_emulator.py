"""A small, faithful Kubernetes API server emulator for tests (aiohttp).

The real kube-apiserver runs in the cluster tier (devtools/testbed/controlplane.py); this
emulator serves only what that one cannot be made to do on demand: injected 500s and 409s,
closed watches, expired resourceVersions, counted requests (docs/testing.md). The production
Kubernetes client (lightkube) talks real HTTP to it. It implements the parts of the API
machinery our components rely on, with the real status codes, reasons and messages:

* one global ``resourceVersion`` bumped on every write; create/get/list/replace/patch/delete
  on registered resources, cluster-scoped or namespaced (also listed across namespaces);
* label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``) and field
  selectors (``metadata.name``, ``metadata.namespace`` and the resource's selectable fields;
  anything else is a 400 like the real API), ``limit``/``continue`` paging;
* optimistic concurrency (a stale ``metadata.resourceVersion`` in a PUT or in the result of a
  PATCH is a 409 Conflict), merge / JSON / strategic-merge patches (the latter is refused for
  custom resources with 415), status subresources, ``metadata.generation``;
* finalizers: DELETE sets ``deletionTimestamp``; emptying the finalizers then removes the
  object; no new finalizer may be added to an object being deleted (422);
* watches: newline-delimited JSON events filtered by selectors, synthetic ADDED events for
  ``resourceVersion`` unset/"0", replay from a retained history otherwise, an ``ERROR`` event
  with a 410 ``Expired`` Status when the requested version is too old, bookmarks,
  ``timeoutSeconds``; :meth:`KubeEmulator.close_watches` ends every stream;
* fault injection (:meth:`KubeEmulator.inject`) and a request log (:attr:`KubeEmulator.requests`).

Not emulated: authentication, admission, schema validation/defaulting, server-side apply
(415), ``dryRun`` (ignored), ``managedFields``, garbage collection of owned objects.

Run standalone with ``python -m tests.kube_emulator --port 8080``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import builtins
import contextlib
import copy
import json
import random
import re
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from aiohttp import web

JSON = dict[str, Any]

REPO_ROOT = Path(__file__).resolve().parent.parent
CRD_DIR = REPO_ROOT / "deploy" / "crds"
DEFAULT_CRDS = ("logicalvolumes.topolvm.io.yaml", "logicalvolumes.topolvm.cybozu.com.yaml")

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what the apiserver uses for generateName


def now_rfc3339() -> str:
    """The current UTC time as a Kubernetes ``Time`` (second precision)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(
    code: int, message: str, reason: str | None = None, details: JSON | None = None
) -> JSON:
    """A Kubernetes ``Status`` failure object."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown"),
        "details": details or {},
        "code": code,
    }


class ApiFailure(Exception):
    """Raised inside the emulator to answer with a ``Status`` (never reaches clients)."""

    def __init__(
        self, code: int, message: str, reason: str | None = None, details: JSON | None = None
    ) -> None:
        super().__init__(message)
        self.body = status_body(code, message, reason, details)
        self.code = code


@dataclass(frozen=True)
class ResourceType:
    """One served resource (a group/version/plural)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool
    selectable_fields: tuple[str, ...] = ()
    custom: bool = False  # a CRD: no strategic merge patch, resourceVersion required on PUT
    status_on_create: bool = False  # keep a client-supplied status on create (nodes do)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        """``plural.group`` as used in error messages (just ``plural`` for core)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def store_key(self) -> tuple[str, str]:
        return (self.group, self.plural)


@dataclass
class RecordedRequest:
    """One request as received by the emulator."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any


@dataclass
class _Fault:
    method: str | None
    plural: str
    name: str | None
    subresource: str | None
    code: int
    reason: str | None
    message: str | None
    times: int


@dataclass
class _Event:
    rv: int
    store_key: tuple[str, str]
    type: str  # ADDED / MODIFIED / DELETED
    old: JSON | None
    new: JSON


@dataclass(eq=False)
class _Watcher:
    store_key: tuple[str, str]
    queue: asyncio.Queue[_Event | str | None] = field(default_factory=asyncio.Queue)
    bookmarks: bool = False


# ---------------------------------------------------------------------------- selectors

_LABEL_TERM = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9._/-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<val>[A-Za-z0-9._-]*)|\s+(?P<set>in|notin)\s*\((?P<vals>[^)]*)\))?\s*$"
)
_FIELD_TERM = re.compile(r"^\s*(?P<key>[A-Za-z0-9._-]+)\s*(?P<op>==|=|!=)\s*(?P<val>[^,]*?)\s*$")

Predicate = Callable[[JSON], bool]


def _split_terms(selector: str) -> list[str]:
    terms, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    return [t for t in terms if t.strip()]


def _label_ok(labels: dict[str, str], key: str, op: str, values: frozenset[str]) -> bool:
    if op == "!":
        return key not in labels
    if op == "exists":
        return key in labels
    if op in ("=", "==", "in"):
        return key in labels and labels[key] in values
    return labels.get(key) not in values  # "!=" and "notin": an absent label matches


def parse_label_selector(selector: str) -> Predicate:
    """Compile a label selector; raises :class:`ApiFailure` (400) when it does not parse."""
    reqs: list[tuple[str, str, frozenset[str]]] = []
    for term in _split_terms(selector):
        m = _LABEL_TERM.match(term)
        if m is None or (m["neg"] and (m["op"] or m["set"])):
            raise ApiFailure(400, f"unable to parse requirement: {term!r}")
        if m["neg"]:
            reqs.append((m["key"], "!", frozenset()))
        elif m["op"]:
            reqs.append((m["key"], m["op"], frozenset([m["val"]])))
        elif m["set"]:
            vals = frozenset(v.strip() for v in m["vals"].split(",") if v.strip())
            reqs.append((m["key"], m["set"], vals))
        else:
            reqs.append((m["key"], "exists", frozenset()))

    def match(obj: JSON) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(_label_ok(labels, k, op, vs) for k, op, vs in reqs)

    return match


def field_value(obj: JSON, path: str) -> str:
    """The string form of a field for field selectors ("" when absent)."""
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def parse_field_selector(selector: str, rtype: ResourceType) -> Predicate:
    """Compile a field selector; unsupported fields are a 400 like the real API."""
    allowed = {"metadata.name", "metadata.namespace", *rtype.selectable_fields}
    reqs: list[tuple[str, bool, str]] = []  # (field, must equal?, value)
    for term in _split_terms(selector):
        m = _FIELD_TERM.match(term)
        if m is None:
            raise ApiFailure(400, f"invalid selector: {selector!r}; can't understand {term!r}")
        if m["key"] not in allowed:
            raise ApiFailure(400, f"field label not supported: {m['key']}")
        reqs.append((m["key"], m["op"] != "!=", m["val"]))

    def match(obj: JSON) -> bool:
        return all((field_value(obj, k) == v) == eq for k, eq, v in reqs)

    return match


# ---------------------------------------------------------------------------- patches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise ApiFailure(422, f"invalid JSON pointer: {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def _walk(doc: Any, tokens: list[str]) -> Any:
    for tok in tokens:
        if isinstance(doc, dict) and tok in doc:
            doc = doc[tok]
        elif isinstance(doc, list) and tok.isdigit() and int(tok) < len(doc):
            doc = doc[int(tok)]
        else:
            raise ApiFailure(422, f"doc is missing path: /{'/'.join(tokens)}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    parent, last = _walk(doc, tokens[:-1]), tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise ApiFailure(422, f"unable to remove nonexistent key: {last}: missing value")


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent, last = _walk(doc, tokens[:-1]), tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list) and last == "-":
        parent.append(value)
    elif isinstance(parent, list) and last.isdigit() and int(last) <= len(parent):
        parent.insert(int(last), value)
    else:
        raise ApiFailure(422, f"add operation does not apply: doc is missing path: /{last}")
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test)."""
    if not isinstance(ops, list):
        raise ApiFailure(400, "json patch must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict):
            raise ApiFailure(400, "json patch operation must be an object")
        kind, tokens = op.get("op"), _pointer(op.get("path"))
        if kind == "add":
            doc = _add(doc, tokens, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, tokens)
        elif kind == "replace":
            if not tokens:
                doc = copy.deepcopy(op.get("value"))
                continue
            _remove(doc, tokens)
            doc = _add(doc, tokens, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            src = _pointer(op.get("from"))
            value = _remove(doc, src) if kind == "move" else copy.deepcopy(_walk(doc, src))
            doc = _add(doc, tokens, value)
        elif kind == "test":
            if _walk(doc, tokens) != op.get("value"):
                raise ApiFailure(422, f"testing value /{'/'.join(tokens)} failed: test failed")
        else:
            raise ApiFailure(422, f"unexpected kind: {kind!r}")
    return doc


# ---------------------------------------------------------------------------- emulator


class KubeEmulator:
    """An in-process Kubernetes API server emulator serving real HTTP on 127.0.0.1.

    ``history_limit`` is the number of retained watch events (older resource versions get
    a 410); ``bookmark_interval`` is the period of BOOKMARK events for watches that asked
    for them with ``allowWatchBookmarks=true``.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        history_limit: int = 1000,
        bookmark_interval: float = 1.0,
        crds: Iterable[Path] | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.history_limit = history_limit
        self.bookmark_interval = bookmark_interval
        self.requests: list[RecordedRequest] = []
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._store: dict[tuple[str, str], dict[tuple[str, str], JSON]] = {}
        self._rv = 1
        self._history: deque[_Event] = deque()
        self._floor = 0  # watches from a resourceVersion below this get 410 Expired
        self._watchers: set[_Watcher] = set()
        self._faults: list[_Fault] = []
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

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

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> str:
        """Start serving; returns the base URL."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None
        sock = server.sockets[0]  # type: ignore[attr-defined]
        self.port = sock.getsockname()[1]
        self._url = f"http://{self.host}:{self.port}"
        return self._url

    async def stop(self) -> None:
        """End every watch and stop serving."""
        await self.close_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> KubeEmulator:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("the emulator is not started")
        return self._url

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion."""
        return str(self._rv)

    # -- test controls -------------------------------------------------------

    def inject(
        self,
        method: str | None,
        plural: str,
        *,
        name: str | None = None,
        subresource: str | None = None,
        code: int = 409,
        reason: str | None = None,
        message: str | None = None,
        times: int = 1,
    ) -> None:
        """Make the next ``times`` matching requests fail with a Status, changing nothing.

        ``method`` is an HTTP method (``GET`` covers get, list and watch) or ``LIST``/``WATCH``
        or None for any; ``name`` None matches any object and collection requests;
        ``subresource`` None matches only the main resource, ``"status"`` only the status
        subresource, ``"*"`` both. A 409 without ``reason`` is the real optimistic-lock
        Conflict.
        """
        self._faults.append(
            _Fault(
                method.upper() if method else None, plural, name, subresource, code, reason,
                message, times,
            )
        )  # fmt: skip

    @property
    def pending_faults(self) -> int:
        """How many injected failures have not been served yet."""
        return sum(f.times for f in self._faults)

    def compact(self) -> None:
        """Drop the whole watch history: watches from any older resourceVersion get 410."""
        self._history.clear()
        self._floor = self._rv

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
        meta["generation"] = old["metadata"].get("generation", 1) + (_spec(old) != _spec(new))
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
        event = _Event(self._rv, rtype.store_key, kind, copy.deepcopy(old), copy.deepcopy(new))
        if len(self._history) >= self.history_limit:
            self._floor = self._history.popleft().rv
        self._history.append(event)
        for w in self._watchers:
            if w.store_key == rtype.store_key:
                w.queue.put_nowait(event)
        return copy.deepcopy(new)

    # -- HTTP ----------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        ctype = request.content_type if request.body_exists else ""
        raw = await request.read() if request.body_exists else b""
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode(errors="replace")
        self.requests.append(RecordedRequest(request.method, request.path, query, ctype, body))
        try:
            return await self._route(request, query, ctype, body)
        except ApiFailure as e:
            return _json_response(e.body, status=e.code)

    async def _route(
        self, request: web.Request, query: dict[str, str], ctype: str, body: Any
    ) -> web.StreamResponse:
        path = request.path.rstrip("/")
        parts = [p for p in path.split("/") if p]
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path == "/version":
            return _json_response(
                {"major": "1", "minor": "33", "gitVersion": "v1.33.0-emulator", "platform": ""}
            )
        discovery = self._discovery(parts)
        if discovery is not None:
            return _json_response(discovery)
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiFailure(404, "the server could not find the requested resource")
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        rtype = self._types.get((group, version, rest[0])) if rest else None
        if rtype is None or len(rest) > 3 or (len(rest) == 3 and rest[2] != "status"):
            raise ApiFailure(404, "the server could not find the requested resource")
        if rtype.status_subresource is False and len(rest) == 3:
            raise ApiFailure(404, "the server could not find the requested resource")
        if namespace and not rtype.namespaced:
            raise ApiFailure(404, "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        method = request.method
        watch = query.get("watch") in ("true", "1")
        self._check_faults(rtype, method, name, sub, watch)

        if name is None:
            if method == "GET" and watch:
                return await self._watch(request, rtype, namespace, query)
            if method == "GET":
                return _json_response(self._list(rtype, namespace, query))
            if method == "POST":
                if rtype.namespaced and not namespace:
                    raise ApiFailure(405, "the server does not allow this method")
                return _json_response(self._create(rtype, namespace, body, ctype), status=201)
            if method == "DELETE":
                return _json_response(self._delete_collection(rtype, namespace, query))
        elif method == "GET":
            return _json_response(self._get(rtype, namespace, name))
        elif method == "PUT":
            return _json_response(self._replace(rtype, namespace, name, sub, body, ctype))
        elif method == "PATCH":
            return _json_response(self._patch(rtype, namespace, name, sub, body, ctype))
        elif method == "DELETE" and sub is None:
            return _json_response(self._delete(rtype, namespace, name, body))
        raise ApiFailure(405, "the server does not allow this method on the requested resource")

    def _discovery(self, parts: builtins.list[str]) -> JSON | None:
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if parts == ["apis"]:
            groups: dict[str, builtins.list[str]] = {}
            for t in self._types.values():
                if t.group and t.version not in groups.setdefault(t.group, []):
                    groups[t.group].append(t.version)
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": g,
                        "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                        "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                    }
                    for g, vs in groups.items()
                ],
            }
        if parts == ["api", "v1"] or (len(parts) == 3 and parts[0] == "apis"):
            group, version = ("", "v1") if parts[0] == "api" else (parts[1], parts[2])
            types = [t for t in self._types.values() if (t.group, t.version) == (group, version)]
            if not types:
                return None
            verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update"]
            resources: builtins.list[JSON] = []
            for t in types:
                resources.append(
                    {"name": t.plural, "kind": t.kind, "namespaced": t.namespaced,
                     "singularName": t.kind.lower(), "verbs": [*verbs, "watch"]}
                )  # fmt: skip
                if t.status_subresource:
                    resources.append(
                        {"name": f"{t.plural}/status", "kind": t.kind, "namespaced": t.namespaced,
                         "singularName": "", "verbs": ["get", "patch", "update"]}
                    )  # fmt: skip
            return {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": types[0].api_version,
                "resources": resources,
            }
        return None

    def _check_faults(
        self, rtype: ResourceType, method: str, name: str | None, sub: str | None, watch: bool
    ) -> None:
        verbs = {method}
        if method == "GET" and name is None:
            verbs.add("WATCH" if watch else "LIST")
        for fault in self._faults:
            if fault.times <= 0 or fault.plural != rtype.plural:
                continue
            if fault.method is not None and fault.method not in verbs:
                continue
            if fault.name is not None and fault.name != name:
                continue
            if fault.subresource not in ("*", sub):
                continue
            fault.times -= 1
            self._faults = [f for f in self._faults if f.times > 0]
            if fault.code == 409 and fault.reason in (None, "Conflict") and fault.message is None:
                raise self._conflict(rtype, name or "")
            raise ApiFailure(
                fault.code,
                fault.message or f"injected failure ({fault.code})",
                fault.reason,
                self._details(rtype, name),
            )
        self._faults = [f for f in self._faults if f.times > 0]

    # -- errors --------------------------------------------------------------

    @staticmethod
    def _details(rtype: ResourceType, name: str | None, kind: str | None = None) -> JSON:
        details: JSON = {"group": rtype.group, "kind": kind or rtype.plural}
        if name:
            details["name"] = name
        return details

    def _not_found(self, rtype: ResourceType, name: str) -> ApiFailure:
        return ApiFailure(
            404, f'{rtype.resource} "{name}" not found', details=self._details(rtype, name)
        )

    def _conflict(self, rtype: ResourceType, name: str, why: str | None = None) -> ApiFailure:
        why = why or (
            "the object has been modified; please apply your changes to the latest version "
            "and try again"
        )
        return ApiFailure(
            409,
            f'Operation cannot be fulfilled on {rtype.resource} "{name}": {why}',
            "Conflict",
            self._details(rtype, name),
        )

    def _invalid(self, rtype: ResourceType, name: str, field_path: str, why: str) -> ApiFailure:
        qualified = f"{rtype.kind}.{rtype.group}" if rtype.group else rtype.kind
        details = self._details(rtype, name, rtype.kind)
        details["causes"] = [{"reason": "FieldValueInvalid", "message": why, "field": field_path}]
        message = f'{qualified} "{name}" is invalid: {field_path}: {why}'
        return ApiFailure(422, message, None, details)

    # -- verbs ---------------------------------------------------------------

    def _get(self, rtype: ResourceType, namespace: str, name: str) -> JSON:
        obj = self._store[rtype.store_key].get((namespace, name))
        if obj is None:
            raise self._not_found(rtype, name)
        return obj

    def _select(self, rtype: ResourceType, namespace: str, query: dict[str, str]) -> Predicate:
        label = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""), rtype)

        def match(obj: JSON) -> bool:
            if namespace and obj["metadata"].get("namespace", "") != namespace:
                return False
            return label(obj) and fields(obj)

        return match

    def _list(self, rtype: ResourceType, namespace: str, query: dict[str, str]) -> JSON:
        match = self._select(rtype, namespace, query)
        items = [(k, o) for k, o in sorted(self._store[rtype.store_key].items()) if match(o)]
        meta: JSON = {"resourceVersion": str(self._rv)}
        cont = query.get("continue")
        if cont:
            try:
                after = tuple(json.loads(base64.urlsafe_b64decode(cont)))
            except ValueError as e:
                raise ApiFailure(400, "continue key is not valid") from e
            items = [(k, o) for k, o in items if k > after]
        limit = int(query.get("limit") or 0)
        if 0 < limit < len(items):
            items = items[:limit]
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(items[-1][0]).encode()).decode()
        return {
            "kind": f"{rtype.kind}List",
            "apiVersion": rtype.api_version,
            "metadata": meta,
            "items": [self._served(rtype, o) for _, o in items],
        }

    @staticmethod
    def _served(rtype: ResourceType, obj: JSON) -> JSON:
        return {**obj, "apiVersion": rtype.api_version, "kind": rtype.kind}

    def _create(self, rtype: ResourceType, namespace: str, body: Any, ctype: str) -> JSON:
        if ctype != "application/json":
            raise ApiFailure(415, f"the body of the request was in an unknown format: {ctype}")
        if not isinstance(body, dict):
            raise ApiFailure(400, "the body of the request is not a JSON object")
        obj = copy.deepcopy(body)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        if rtype.namespaced:
            if meta.get("namespace", namespace) != namespace:
                raise ApiFailure(
                    400,
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request",
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(_NAME_CHARS, k=5))
        name = meta.get("name")
        if not name:
            raise self._invalid(
                rtype, "", "metadata.name", "Required value: name or generateName is required"
            )
        if meta.get("resourceVersion"):
            raise ApiFailure(400, "resourceVersion should not be set on objects to be created")
        key = (namespace, name)
        if key in self._store[rtype.store_key]:
            raise ApiFailure(
                409,
                f'{rtype.resource} "{name}" already exists',
                "AlreadyExists",
                self._details(rtype, name),
            )
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(k, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        if rtype.status_subresource and not rtype.status_on_create:
            obj.pop("status", None)
        return self._commit(rtype, key, None, obj, "ADDED")

    def _replace(
        self,
        rtype: ResourceType,
        namespace: str,
        name: str,
        sub: str | None,
        body: Any,
        ctype: str,
    ) -> JSON:
        if ctype != "application/json":
            raise ApiFailure(415, f"the body of the request was in an unknown format: {ctype}")
        if not isinstance(body, dict):
            raise ApiFailure(400, "the body of the request is not a JSON object")
        current = self._get(rtype, namespace, name)
        if rtype.custom and not (body.get("metadata") or {}).get("resourceVersion"):
            raise self._invalid(
                rtype, name, "metadata.resourceVersion",
                "Invalid value: 0x0: must be specified for an update",
            )  # fmt: skip
        return self._update(rtype, namespace, name, sub, current, copy.deepcopy(body))

    def _patch(
        self,
        rtype: ResourceType,
        namespace: str,
        name: str,
        sub: str | None,
        body: Any,
        ctype: str,
    ) -> JSON:
        accepted = [JSON_PATCH, MERGE_PATCH, APPLY_PATCH]
        if not rtype.custom:
            accepted.insert(2, STRATEGIC_PATCH)
        if ctype not in accepted or ctype == APPLY_PATCH:
            raise ApiFailure(
                415,
                "the body of the request was in an unknown format - accepted media types "
                "include: " + ", ".join(accepted),
            )
        if isinstance(body, str):
            raise ApiFailure(400, "the patch is not valid JSON")
        current = self._get(rtype, namespace, name)
        if ctype == JSON_PATCH:
            new = json_patch(current, body)
        else:
            if not isinstance(body, dict):
                raise ApiFailure(400, "a merge patch must be a JSON object")
            new = merge_patch(current, body)
        if not isinstance(new, dict):
            raise ApiFailure(422, "the patched object is not a JSON object")
        return self._update(rtype, namespace, name, sub, current, new)

    def _update(
        self,
        rtype: ResourceType,
        namespace: str,
        name: str,
        sub: str | None,
        current: JSON,
        new: JSON,
    ) -> JSON:
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            meta = new["metadata"] = {}
        cur_meta = current["metadata"]
        rv = meta.get("resourceVersion")
        if rv and rv != cur_meta["resourceVersion"]:
            raise self._conflict(rtype, name)
        if meta.get("name", name) != name:
            raise ApiFailure(
                400,
                f"the name of the object ({meta.get('name')}) does not match the name on the "
                f"URL ({name})",
            )
        if rtype.namespaced and meta.get("namespace", namespace) != namespace:
            raise ApiFailure(
                400,
                "the namespace of the provided object does not match the namespace sent on the "
                "request",
            )
        if meta.get("uid") and meta["uid"] != cur_meta["uid"]:
            raise self._invalid(
                rtype, name, "metadata.uid", f'Invalid value: "{meta["uid"]}": field is immutable'
            )
        if sub == "status":
            status = new.get("status")
            new = copy.deepcopy(current)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
            meta = new["metadata"]
        elif rtype.status_subresource:
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        for k in ("uid", "name", "creationTimestamp", "deletionTimestamp"):
            if k in cur_meta:
                meta[k] = cur_meta[k]
            else:
                meta.pop(k, None)
        if "deletionGracePeriodSeconds" in cur_meta:
            meta["deletionGracePeriodSeconds"] = cur_meta["deletionGracePeriodSeconds"]
        if rtype.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        meta["generation"] = cur_meta.get("generation", 1) + (_spec(current) != _spec(new))
        meta["resourceVersion"] = cur_meta["resourceVersion"]
        new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
        finalizers = meta.get("finalizers") or []
        if not finalizers:
            meta.pop("finalizers", None)
        if "deletionTimestamp" in cur_meta:
            added = [f for f in finalizers if f not in (cur_meta.get("finalizers") or [])]
            if added:
                found = "[]string{" + ", ".join(json.dumps(f) for f in added) + "}"
                raise self._invalid(
                    rtype, name, "metadata.finalizers",
                    "Forbidden: no new finalizers can be added if the object is being deleted, "
                    f"found new finalizers {found}",
                )  # fmt: skip
        if new == current:
            return current  # a no-op update does not bump the resourceVersion
        key = (namespace, name)
        if "deletionTimestamp" in cur_meta and not finalizers:
            return self._commit(rtype, key, current, new, "DELETED")
        return self._commit(rtype, key, current, new, "MODIFIED")

    def _delete(self, rtype: ResourceType, namespace: str, name: str, body: Any) -> JSON:
        current = self._get(rtype, namespace, name)
        pre = body.get("preconditions") if isinstance(body, dict) else None
        if isinstance(pre, dict):
            meta = current["metadata"]
            if pre.get("uid") and pre["uid"] != meta["uid"]:
                raise self._conflict(
                    rtype,
                    name,
                    f"Precondition failed: UID in precondition: {pre['uid']}, "
                    f"UID in object meta: {meta['uid']}",
                )
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
                raise self._conflict(
                    rtype,
                    name,
                    "Precondition failed: ResourceVersion in precondition: "
                    f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                    f"{meta['resourceVersion']}",
                )
        return self._delete_obj(rtype, (namespace, name), current)

    def _delete_obj(self, rtype: ResourceType, key: tuple[str, str], current: JSON) -> JSON:
        if current["metadata"].get("finalizers"):
            if "deletionTimestamp" in current["metadata"]:
                return current
            new = copy.deepcopy(current)
            new["metadata"].update(deletionTimestamp=now_rfc3339(), deletionGracePeriodSeconds=0)
            return self._commit(rtype, key, current, new, "MODIFIED")
        return self._commit(rtype, key, current, copy.deepcopy(current), "DELETED")

    def _delete_collection(
        self, rtype: ResourceType, namespace: str, query: dict[str, str]
    ) -> JSON:
        match = self._select(rtype, namespace, query)
        items = [(k, o) for k, o in sorted(self._store[rtype.store_key].items()) if match(o)]
        deleted = [self._delete_obj(rtype, k, o) for k, o in items]
        return {
            "kind": f"{rtype.kind}List",
            "apiVersion": rtype.api_version,
            "metadata": {"resourceVersion": str(self._rv)},
            "items": deleted,
        }

    # -- watch ---------------------------------------------------------------

    async def _watch(
        self, request: web.Request, rtype: ResourceType, namespace: str, query: dict[str, str]
    ) -> web.StreamResponse:
        match = self._select(rtype, namespace, query)
        rv_param = query.get("resourceVersion", "")
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        watcher = _Watcher(rtype.store_key, bookmarks=query.get("allowWatchBookmarks") == "true")
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
                        initial.extend(_transition(ev, match))
        if expired is None:
            self._watchers.add(watcher)  # no await since the snapshot: nothing is missed
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout is not None else None
        try:
            await resp.prepare(request)
            if expired is not None:
                await _send(resp, "ERROR", expired)
                await resp.write_eof()
                return resp
            for kind, obj in initial:
                await _send(resp, kind, self._served(rtype, obj))
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
                    await _send(resp, "BOOKMARK", bookmark)
                elif isinstance(item, _Event):
                    for kind, obj in _transition(item, match):
                        await _send(resp, kind, self._served(rtype, obj))
            await resp.write_eof()
        except ConnectionResetError:
            pass
        finally:
            self._watchers.discard(watcher)
        return resp


def _json_response(body: Any, status: int = 200) -> web.Response:
    # Exactly "application/json" like the apiserver: lightkube only decodes a Status from
    # error responses whose Content-Type is exactly that (no charset parameter).
    return web.Response(
        body=json.dumps(body).encode(), status=status, headers={"Content-Type": "application/json"}
    )


def _spec(obj: JSON) -> JSON:
    """Everything that counts for ``metadata.generation``."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _transition(ev: _Event, match: Predicate) -> list[tuple[str, JSON]]:
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


async def _send(resp: web.StreamResponse, kind: str, obj: JSON) -> None:
    await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")


async def _serve(host: str, port: int) -> None:
    async with KubeEmulator(host=host, port=port) as emu:
        print(emu.url, flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the Kubernetes API emulator.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.host, args.port))


if __name__ == "__main__":
    main()

"""The emulator itself: HTTP routing and discovery, lifecycle, fault injection."""

from __future__ import annotations

import asyncio
import builtins
import json
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web

from tests.kube_emulator.errors import ApiFailure
from tests.kube_emulator.faults import Fault, Faults
from tests.kube_emulator.objects import JSON, RecordedRequest
from tests.kube_emulator.watch import Watches


class KubeEmulator(Watches):
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
        self.bookmark_interval = bookmark_interval
        self.requests: list[RecordedRequest] = []
        self._faults = Faults()
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        super().__init__(history_limit=history_limit, crds=crds)

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
        delay: float = 0.0,
    ) -> None:
        """Make the next ``times`` matching requests fail with a Status, changing nothing.

        ``method`` is an HTTP method (``GET`` covers get, list and watch) or ``LIST``/``WATCH``
        or None for any; ``name`` None matches any object and collection requests;
        ``subresource`` None matches only the main resource, ``"status"`` only the status
        subresource, ``"*"`` both. A 409 without ``reason`` is the real optimistic-lock
        Conflict. With ``delay``, the requests are served that many seconds late instead
        (changing what they change then), so a request sent later overtakes them.
        """
        self._faults.add(
            Fault(
                method.upper() if method else None, plural, name, subresource, code, reason,
                message, times, delay,
            )
        )  # fmt: skip

    @property
    def pending_faults(self) -> int:
        """How many injected failures have not been served yet."""
        return self._faults.pending

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
        pause = self._faults.check(rtype, method, name, sub, watch)
        if pause:
            await asyncio.sleep(pause)

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


def _json_response(body: Any, status: int = 200) -> web.Response:
    # Exactly "application/json" like the apiserver: lightkube only decodes a Status from
    # error responses whose Content-Type is exactly that (no charset parameter).
    return web.Response(
        body=json.dumps(body).encode(), status=status, headers={"Content-Type": "application/json"}
    )

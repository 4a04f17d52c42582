"""The extender's HTTP server: ``/predicate``, ``/prioritize``, ``/status``, ``/metrics``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import msgspec
import prometheus_client
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from prometheus_client import CollectorRegistry

from topolvm import daemon
from topolvm.config.scheduler import SchedulerConfig, default_config
from topolvm.constants import Names, names
from topolvm.daemon import Parts, cannot_listen
from topolvm.k8s.api import make_client
from topolvm.metrics import exposition
from topolvm.scheduler.extender import BadRequest
from topolvm.scheduler.metrics import Metrics
from topolvm.scheduler.nodecache import NodeCache
from topolvm.scheduler.nodewatch import node_informer
from topolvm.scheduler.status import VERBS, State, status_document, wired_text
from topolvm.scheduler.verbs import Extender

log = logging.getLogger("topolvm.scheduler")
access_log = logging.getLogger("topolvm.scheduler.access")

DEFAULT_WIRING_WARNING_AFTER = 600.0
_JSON = "application/json"


class AccessLog(AbstractAccessLogger):
    """One log record per request, like upstream's access log."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        access_log.info(
            "access",
            extra={
                "status": response.status,
                "method": request.method,
                "url": str(request.rel_url),
                "request_size": request.content_length or 0,
                "response_size": response.body_length,
                "remote": request.remote,
                "user_agent": request.headers.get("User-Agent", ""),
                "duration_ms": round(time * 1e3, 3),
            },
        )


STATE = web.AppKey("state", State)


def _path_label(request: web.Request, prefix: str) -> str:
    path = request.path
    for verb in VERBS:
        if path == f"{prefix}/{verb}":
            return verb
    if path in ("/status", "/metrics"):
        return path[1:]
    return "other"


def make_app(
    config: SchedulerConfig | None = None,
    *,
    cache: NodeCache | None = None,
    plugin_names: Names | None = None,
    registry: CollectorRegistry | None = None,
    wall_clock: Callable[[], float] = time.time,
    wiring_warning_after: float = DEFAULT_WIRING_WARNING_AFTER,
) -> web.Application:
    """The extender as an aiohttp application. ``cache`` enables nodeCacheCapable requests."""
    config = config or default_config()
    if config.node_cache and cache is None:
        raise ValueError("node-cache mode needs a NodeCache")
    if cache is not None:
        cache.use_divisor(config.divisor)
    registry = registry if registry is not None else CollectorRegistry()
    metrics = Metrics(registry)
    plugin_names = plugin_names or names()
    state = State(
        extender=Extender(config, cache, plugin_names),
        metrics=metrics,
        wall_clock=wall_clock,
        wiring_warning_after=wiring_warning_after,
        started_at=wall_clock(),
    )
    metrics.mode.labels(
        "managed-resource" if config.managed_resource else "extender",
        plugin_names.capacity_resource if config.managed_resource else "",
        "true" if cache is not None else "false",
    ).set(1)
    if cache is not None:
        metrics.cache_nodes.set_function(lambda: len(cache))
        metrics.cache_synced.set_function(lambda: 1 if cache.synced else 0)
    prefix = config.path_prefix

    @web.middleware
    async def observe(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        started = time.perf_counter()
        label = _path_label(request, prefix)

        def record(status: int) -> None:
            metrics.requests.labels(label, str(status)).inc()
            metrics.latency.labels(label).observe(time.perf_counter() - started)

        try:
            response = await handler(request)
        except web.HTTPNotFound:
            response = web.Response(status=404, text="not found\n")
        except web.HTTPException as e:
            record(e.status)
            raise
        except Exception:
            log.exception("unexpected error", extra={"path": request.path})
            response = web.Response(status=500, text="internal error\n")
        record(response.status)
        return response

    app = web.Application(middlewares=[observe], client_max_size=config.max_request_bytes)
    app[STATE] = state
    for verb in VERBS:
        app.router.add_route("*", f"{prefix}/{verb}", _verb_handler(verb))
    app.router.add_get("/status", _status)
    app.router.add_get("/metrics", _metrics)
    app.cleanup_ctx.append(_wiring_watchdog)
    return app


def _verb_handler(verb: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        state = request.app[STATE]
        if request.method != "POST":
            return web.Response(
                status=405,
                headers={"Allow": "POST"},
                text=f"method {request.method} not allowed: kube-scheduler calls "
                f"{request.path} with POST and an ExtenderArgs JSON body\n",
            )
        state.called(verb)
        body = await request.read()
        ext = state.extender
        try:
            reply = ext.predicate(body) if verb == "predicate" else ext.prioritize(body)
        except BadRequest as e:
            log.warning(
                f"bad {verb} request: {e}",
                extra={"path": request.path, "remote": request.remote},
            )
            return web.Response(status=400, text=f"bad request: {e}\n")
        return web.Response(body=reply, content_type=_JSON)

    return handle


async def _status(request: web.Request) -> web.Response:
    doc = status_document(request.app[STATE])
    return web.Response(body=msgspec.json.encode(doc), content_type=_JSON)


async def _metrics(request: web.Request) -> web.Response:
    answer = exposition(request.app[STATE].metrics.registry)
    return web.Response(body=answer.body, headers={"Content-Type": answer.content_type})


async def _wiring_watchdog(app: web.Application) -> AsyncIterator[None]:
    """Warn, every ``wiring_warning_after`` seconds, while kube-scheduler has never called."""
    state = app[STATE]

    async def watch() -> None:
        while True:
            await asyncio.sleep(state.wiring_warning_after)
            if state.last_request is None:
                log.warning(
                    "kube-scheduler has not called the extender yet",
                    extra={"wired": wired_text(state, state.wall_clock())},
                )

    task = asyncio.create_task(watch())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class SchedulerDaemon:
    """The extender's HTTP server and, in node-cache mode, the Node watch that feeds it."""

    def __init__(
        self, app: web.Application, host: str, port: int,
        node_watch: Coroutine[Any, Any, None] | None = None,
    ) -> None:  # fmt: skip
        self.app, self.host, self.port = app, host, port
        self.node_watch = node_watch
        self.parts = Parts("topolvm-scheduler")

    async def start(self) -> None:
        if self.node_watch is not None:
            self.parts.spawn(self.node_watch, "node-watch")
        where = (self.host, self.port)
        runner = web.AppRunner(self.app, access_log_class=AccessLog)
        await runner.setup()
        try:
            await web.TCPSite(runner, *where).start()
        except OSError as e:
            await runner.cleanup()
            raise cannot_listen("the extender", where, e) from e
        self.parts.on_stop("the extender server", runner.cleanup)
        state = self.app[STATE]
        config = state.extender.config
        log.info(
            "topolvm-scheduler started",
            extra={
                "listen": f"{self.host}:{self.port}",
                "mode": "managed-resource" if config.managed_resource else "extender",
                "node_cache": state.extender.cache is not None,
                "path_prefix": config.path_prefix,
            },
        )
        if config.managed_resource:
            resource = state.extender.names.capacity_resource
            log.warning(
                f"managed-resource mode: pods carrying {resource} stay Pending "
                f"('Insufficient {resource}') unless kube-scheduler is configured with this "
                "extender and managedResources (see 'topolvm scheduler print-config "
                "--managed-resource'); /status and the metric "
                "topolvm_scheduler_last_request_timestamp_seconds show whether kube-scheduler calls"
            )

    async def stop(self) -> None:
        await self.parts.stop()


async def serve(
    app: web.Application, host: str, port: int,
    node_watch: Coroutine[Any, Any, None] | None = None,
) -> None:  # fmt: skip
    """Serve until SIGTERM/SIGINT (or until the Node watch fails), then shut down gracefully."""
    await daemon.serve(SchedulerDaemon(app, host, port, node_watch))


async def run(config: SchedulerConfig, kubeconfig: str | None) -> None:
    """Serve the extender ``config`` describes; in node-cache mode with the Node watch that
    feeds the cache as a part (its client from ``kubeconfig``)."""
    cache = NodeCache(names(), max_age=config.node_cache_max_age) if config.node_cache else None
    app = make_app(config, cache=cache, plugin_names=names(), registry=prometheus_client.REGISTRY)
    host, port = config.listen_address
    if cache is None:
        await serve(app, host, port)
        return
    client = make_client(kubeconfig)
    try:
        await serve(app, host, port, node_informer(client, cache).run())
    finally:
        await client.close()

"""Prometheus exposition over aiohttp, shared by the daemons that serve ``/metrics``."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def metrics_app(registry: CollectorRegistry) -> web.Application:
    """An application serving ``registry`` on ``/metrics``."""

    async def handler(_: web.Request) -> web.Response:
        return metrics_response(registry)

    app = web.Application()
    app.router.add_get("/metrics", handler)
    return app


def metrics_response(registry: CollectorRegistry) -> web.Response:
    """The current samples of ``registry`` in Prometheus' text format."""
    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )

"""Prometheus exposition over aiohttp, shared by the daemons that serve ``/metrics``."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class MetricsServerError(Exception):
    """The metrics listener could not be opened; the message names the address."""


def metrics_app(registry: CollectorRegistry) -> web.Application:
    """An application serving ``registry`` on ``/metrics``."""

    async def handler(_: web.Request) -> web.Response:
        return metrics_response(registry)

    app = web.Application()
    app.router.add_get("/metrics", handler)
    return app


async def start_metrics_server(registry: CollectorRegistry, host: str, port: int) -> web.AppRunner:
    """Serve ``registry`` on ``http://host:port/metrics``; the caller cleans the runner up.
    Every daemon's ``--metrics-bind-address`` goes through here."""
    runner = web.AppRunner(metrics_app(registry), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as e:
        await runner.cleanup()
        raise MetricsServerError(f"cannot serve metrics on {host}:{port}: {e.strerror}") from e
    return runner


def metrics_response(registry: CollectorRegistry) -> web.Response:
    """The current samples of ``registry`` in Prometheus' text format."""
    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )

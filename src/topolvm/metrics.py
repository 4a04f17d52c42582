"""Prometheus exposition over aiohttp, shared by the daemons that serve ``/metrics``."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def metrics_response(registry: CollectorRegistry) -> web.Response:
    """The current samples of ``registry`` in Prometheus' text format."""
    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )

"""Prometheus exposition, shared by the daemons that serve ``/metrics``."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from topolvm.gethttp import Answer


def exposition(registry: CollectorRegistry) -> Answer:
    """The current samples of ``registry`` in Prometheus' text format."""
    return Answer(200, generate_latest(registry), CONTENT_TYPE_LATEST)

"""What ``GET /status`` reports: the mode, and whether kube-scheduler is wired to the extender.

Each ``/predicate`` (filter) and ``/prioritize`` call that kube-scheduler makes (a POST) is
counted, with its time. Calls coming in at all are the sign that kube-scheduler is configured
with this extender; ``wired`` says it in words.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from topolvm.scheduler.metrics import Metrics
from topolvm.scheduler.verbs import Extender

VERBS = ("predicate", "prioritize")


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="milliseconds")


@dataclass
class VerbCalls:
    """Calls kube-scheduler made to one verb since start."""

    count: int = 0
    last: float | None = None


@dataclass
class State:
    extender: Extender
    metrics: Metrics
    wall_clock: Callable[[], float]
    wiring_warning_after: float
    started_at: float = 0.0
    last_request: float | None = None
    last_request_path: str | None = None
    calls: dict[str, VerbCalls] = field(default_factory=lambda: {v: VerbCalls() for v in VERBS})

    def called(self, verb: str) -> None:
        """Record one call of ``verb`` by kube-scheduler (a POST, whatever its answer)."""
        now = self.wall_clock()
        self.last_request, self.last_request_path = now, verb
        self.metrics.last_request.set(now)
        calls = self.calls[verb]
        calls.count += 1
        calls.last = now


def status_document(state: State) -> dict[str, Any]:
    ext = state.extender
    now = state.wall_clock()
    managed = ext.config.managed_resource
    last = state.last_request
    doc: dict[str, Any] = {
        "status": "ok",
        "mode": "managed-resource" if managed else "extender",
        "managedResource": ext.names.capacity_resource if managed else None,
        "nodeCacheCapable": ext.cache is not None,
        "startedAt": iso(state.started_at),
        "lastRequestTime": iso(last),
        "lastRequestPath": state.last_request_path,
        "secondsSinceLastRequest": _since(now, last),
        "calls": {
            verb: {
                "count": calls.count,
                "lastTime": iso(calls.last),
                "secondsSinceLast": _since(now, calls.last),
            }
            for verb, calls in state.calls.items()
        },
        "wired": wired_text(state, now),
    }
    cache = ext.cache
    if cache is not None:
        doc["nodeCache"] = {
            "synced": cache.synced,
            "nodes": len(cache),
            "maxAgeSeconds": cache.max_age,
        }
    return doc


def _since(now: float, ts: float | None) -> float | None:
    return None if ts is None else round(now - ts, 3)


def wired_text(state: State, now: float) -> str:
    if state.last_request is not None:
        return (
            f"yes: kube-scheduler called {state.last_request_path} "
            f"{now - state.last_request:.0f}s ago"
        )
    since = f"no /predicate or /prioritize call since start {now - state.started_at:.0f}s ago"
    resource = state.extender.names.capacity_resource
    if state.extender.config.managed_resource:
        return (
            f"unknown: {since}. In managed-resource mode kube-scheduler only calls for pods "
            f"requesting {resource}; if such pods are Pending with "
            f"'Insufficient {resource}', kube-scheduler is not wired"
        )
    return (
        f"unknown: {since}. kube-scheduler calls this extender for every pod it schedules, so "
        "it is probably not wired (pods still schedule, without capacity checks)"
    )

"""Kubernetes timestamps (RFC 3339, UTC, whole seconds: ``2026-11-29T08:00:00Z``) as the
objects' status fields hold them: now, and the seconds to or from one."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

STAMP = "%Y-%m-%dT%H:%M:%SZ"


def now() -> str:
    return datetime.now(UTC).strftime(STAMP)


def _parsed(stamp: str) -> datetime | None:
    try:
        return datetime.strptime(stamp, STAMP).replace(tzinfo=UTC)
    except ValueError:
        return None


def later(stamp: str, seconds: int) -> str:
    """``stamp`` plus ``seconds``; raises ValueError for a stamp that is not one."""
    return (datetime.strptime(stamp, STAMP).replace(tzinfo=UTC)
            + timedelta(seconds=seconds)).strftime(STAMP)  # fmt: skip


def seconds_until(stamp: str) -> float:
    """Seconds from now until ``stamp`` (0 if past or unreadable)."""
    then = _parsed(stamp)
    return 0.0 if then is None else max(0.0, then.timestamp() - time.time())


def seconds_since(stamp: str) -> int:
    """Whole seconds from ``stamp`` until now (0 if to come or unreadable)."""
    then = _parsed(stamp)
    return 0 if then is None else max(0, int(time.time() - then.timestamp()))

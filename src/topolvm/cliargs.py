"""Command-line values every daemon takes: listen addresses and durations. One parser each, so
``topolvm lvmd``, ``node``, ``scheduler`` (and later ``controller``) accept and reject the same
spellings with the same messages."""

from __future__ import annotations

import argparse
import math


def parse_listen(value: str) -> tuple[str, int]:
    """``[host]:port`` → (host, port); an empty host means every interface. ValueError names
    the expected form."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected [host]:port, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def bind_address(value: str) -> tuple[str, int] | None:
    """argparse type for ``--*-bind-address``: ``[host]:port``; "0" or "" disables it."""
    if value in ("", "0"):
        return None
    try:
        return parse_listen(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_seconds(value: str) -> float:
    """argparse type for durations in seconds (> 0, finite)."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not math.isfinite(seconds) or not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {value!r}")
    return seconds

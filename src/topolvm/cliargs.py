"""Command-line values every daemon takes: listen addresses and durations. One parser each, so
``topolvm lvmd``, ``node``, ``scheduler`` (and later ``controller``) accept and reject the same
spellings with the same messages."""

from __future__ import annotations

import argparse
import math
import re

from topolvm.constants import legacy_from_env


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


def byte_rate(value: str) -> int:
    """argparse type for a bandwidth in bytes per second: a Kubernetes quantity (``100Mi``,
    ``50M``, ``1048576``); 0 means no limit."""
    from topolvm.k8s.lvobject import InvalidQuantity, parse_quantity

    try:
        rate = parse_quantity(value.strip())
    except InvalidQuantity:
        raise argparse.ArgumentTypeError(
            f"not a bandwidth: {value!r} (bytes per second, as a quantity: 100Mi, 50M, 0)"
        ) from None
    if rate < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value!r}")
    return rate


def positive_seconds(value: str) -> float:
    """argparse type for durations in seconds (> 0, finite)."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not math.isfinite(seconds) or not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {value!r}")
    return seconds


_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def go_duration(value: str) -> float:
    """argparse type for Go-style durations as upstream's flags take them (``15s``, ``1m30s``,
    ``100ms``, ``1h``); a bare number is seconds. Returns seconds (> 0)."""
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pos, seconds = 0, 0.0
        for m in _GO_DURATION.finditer(text):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _GO_UNITS[m.group(2)]
            pos = m.end()
        if pos != len(text) or not text:
            raise argparse.ArgumentTypeError(
                f"not a duration: {value!r} (examples: 15s, 1m30s, 500ms, 1h)"
            ) from None
    if not math.isfinite(seconds) or not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value!r}")
    return seconds


def go_bool(value: str) -> bool:
    """argparse type for Go boolean flags given a value (``--flag=false``)."""
    lowered = value.strip().lower()
    if lowered in ("1", "t", "true", "yes"):
        return True
    if lowered in ("0", "f", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {value!r} (true or false)")


def add_bool_flag(parser: argparse.ArgumentParser, flag: str, default: bool, help: str) -> None:
    """``--flag`` (true), ``--flag=true|false`` as Go's flag package takes booleans."""
    parser.add_argument(
        flag, type=go_bool, nargs="?", const=True, default=default, metavar="BOOL",
        help=f"{help} (default {str(default).lower()})",
    )  # fmt: skip


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    """``--kubeconfig`` and ``--legacy``, as topolvm-node and topolvm-controller take them."""
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: in-cluster service account, then $KUBECONFIG)",
    )
    parser.add_argument(
        "--legacy",
        action="store_true",
        default=legacy_from_env(),
        help="use the legacy topolvm.cybozu.com names (default: set when $USE_LEGACY is non-empty)",
    )

"""topolvm-scheduler configuration file, with upstream's keys (``listen``, ``default-divisor``,
``divisors``, ``profiling-bind-address``) plus this project's extender options."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import msgspec

from topolvm.cliargs import parse_listen
from topolvm.config.decode import convert, read_mapping
from topolvm.config.errors import ConfigError, invalid

DEFAULT_LISTEN = ":8000"
DEFAULT_MAX_REQUEST_BYTES = 128 << 20
DEFAULT_NODE_CACHE_MAX_AGE = 900.0


def _positive(key: str, v: float) -> None:
    if not math.isfinite(v) or v <= 0:
        raise invalid(key, f"{key} must be a finite number > 0")


class SchedulerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    listen: str = DEFAULT_LISTEN
    default_divisor: float = msgspec.field(default=1.0, name="default-divisor")
    divisors: dict[str, float] = msgspec.field(default_factory=dict)
    # Upstream's Go pprof endpoint: accepted so upstream files load, but there is nothing to serve.
    profiling_bind_address: str = msgspec.field(default="", name="profiling-bind-address")
    # This project's additions.
    managed_resource: bool = msgspec.field(default=False, name="managed-resource")
    node_cache: bool = msgspec.field(default=False, name="node-cache")
    node_cache_max_age: float = msgspec.field(
        default=DEFAULT_NODE_CACHE_MAX_AGE, name="node-cache-max-age"
    )
    path_prefix: str = msgspec.field(default="", name="path-prefix")
    max_request_bytes: Annotated[int, msgspec.Meta(ge=1 << 10, le=1 << 32)] = msgspec.field(
        default=DEFAULT_MAX_REQUEST_BYTES, name="max-request-bytes"
    )

    def __post_init__(self) -> None:
        try:
            parse_listen(self.listen)
        except ValueError as e:
            raise invalid("listen", str(e)) from None
        _positive("default-divisor", self.default_divisor)
        for dc, d in self.divisors.items():
            if not math.isfinite(d) or d <= 0:
                # Upstream's start-up error is "invalid divisor".
                raise invalid(
                    "divisors", f"invalid divisor for device-class {dc!r}: must be > 0, got {d}"
                )
        _positive("node-cache-max-age", self.node_cache_max_age)
        prefix = self.path_prefix
        if prefix and (not prefix.startswith("/") or prefix.endswith("/") or "//" in prefix):
            raise invalid(
                "path-prefix",
                "path-prefix must start with '/' and not end with '/' (e.g. /topolvm)",
            )

    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_listen(self.listen)

    def divisor(self, device_class: str) -> float:
        return self.divisors.get(device_class, self.default_divisor)


def default_config() -> SchedulerConfig:
    """The configuration without a file (upstream's default when ``--config`` is not given)."""
    return SchedulerConfig()


def _divisor_types(data: dict[Any, Any], source: str) -> None:
    # msgspec names a bad dict value only as divisors[...]; this names the device class.
    divisors = data.get("divisors")
    if isinstance(divisors, dict):
        for dc, d in divisors.items():
            if isinstance(d, bool) or not isinstance(d, int | float) or abs(d) >= 2**63:
                raise ConfigError(
                    f"{source}: divisors.{dc}: should be a number below 2^63 (value {d!r})"
                )


def parse_scheduler_config(text: str, source: str = "scheduler config") -> SchedulerConfig:
    data = read_mapping(text, source, empty=True)
    _divisor_types(data, source)
    return convert(data, SchedulerConfig, source)


def load_scheduler_config(path: str | Path | None) -> SchedulerConfig:
    """Read the file at ``path``; ``None`` or "" gives the built-in defaults, as upstream."""
    if not path:
        return default_config()
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read scheduler config {p}: {e.strerror}") from e
    return parse_scheduler_config(text, str(p))

"""topolvm-scheduler configuration file, with upstream's keys (``listen``, ``default-divisor``,
``divisors``, ``profiling-bind-address``) plus this project's extender options."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from topolvm.cliargs import parse_listen
from topolvm.config.errors import ConfigError, describe

DEFAULT_LISTEN = ":8000"
DEFAULT_MAX_REQUEST_BYTES = 128 << 20
DEFAULT_NODE_CACHE_MAX_AGE = 900.0


def _positive(v: float, what: str) -> float:
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{what} must be a finite number > 0")
    return float(v)


class SchedulerConfig(BaseModel):
    model_config = ConfigDict(
        extra="forbid", validate_by_name=False, validate_by_alias=True, frozen=True
    )

    listen: StrictStr = DEFAULT_LISTEN
    default_divisor: StrictFloat = Field(1.0, alias="default-divisor")
    divisors: dict[StrictStr, StrictFloat] = Field(default_factory=dict)
    # Upstream's Go pprof endpoint: accepted so upstream files load, but there is nothing to serve.
    profiling_bind_address: StrictStr = Field("", alias="profiling-bind-address")
    # This project's additions.
    managed_resource: StrictBool = Field(False, alias="managed-resource")
    node_cache: StrictBool = Field(False, alias="node-cache")
    node_cache_max_age: StrictFloat = Field(DEFAULT_NODE_CACHE_MAX_AGE, alias="node-cache-max-age")
    path_prefix: StrictStr = Field("", alias="path-prefix")
    max_request_bytes: Annotated[StrictInt, Field(ge=1 << 10, le=1 << 32)] = Field(
        DEFAULT_MAX_REQUEST_BYTES, alias="max-request-bytes"
    )

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        parse_listen(v)
        return v

    @field_validator("default_divisor")
    @classmethod
    def _default_divisor(cls, v: float) -> float:
        return _positive(v, "default-divisor")

    @field_validator("divisors")
    @classmethod
    def _divisors(cls, v: dict[str, float]) -> dict[str, float]:
        out = {}
        for dc, d in v.items():
            if not math.isfinite(d) or d <= 0:
                # Upstream's start-up error is "invalid divisor".
                raise ValueError(f"invalid divisor for device-class {dc!r}: must be > 0, got {d}")
            out[dc] = float(d)
        return out

    @field_validator("node_cache_max_age")
    @classmethod
    def _max_age(cls, v: float) -> float:
        return _positive(v, "node-cache-max-age")

    @field_validator("path_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if v and (not v.startswith("/") or v.endswith("/") or "//" in v):
            raise ValueError("path-prefix must start with '/' and not end with '/' (e.g. /topolvm)")
        return v

    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_listen(self.listen)

    def divisor(self, device_class: str) -> float:
        return self.divisors.get(device_class, self.default_divisor)


def default_config() -> SchedulerConfig:
    """The configuration without a file (upstream's default when ``--config`` is not given)."""
    return SchedulerConfig.model_validate({})


def parse_scheduler_config(text: str, source: str = "scheduler config") -> SchedulerConfig:
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {e}") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys, got {type(data).__name__}")
    try:
        return SchedulerConfig.model_validate(data)
    except ValidationError as e:
        raise describe(e, source) from e


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

"""Readable configuration errors that name the key and the offending value."""

from __future__ import annotations

from pydantic import ValidationError


class ConfigError(Exception):
    """A configuration file or value is invalid; the message names the key and value."""


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def describe(err: ValidationError, source: str) -> ConfigError:
    lines = []
    for e in err.errors():
        loc = _loc(tuple(e["loc"]))
        prefix = f"{source}: {loc}: " if loc else f"{source}: "
        msg = e["msg"].removeprefix("Value error, ")
        value = e.get("input")
        if e["type"] == "missing":
            lines.append(f"{prefix}is required")
        elif e["type"] == "extra_forbidden":
            lines.append(f"{prefix}unknown key (value {value!r})")
        elif isinstance(value, dict | list):
            lines.append(f"{prefix}{msg}")
        else:
            lines.append(f"{prefix}{msg} (value {value!r})")
    return ConfigError("\n".join(lines))

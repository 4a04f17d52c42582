"""YAML configuration files decoded into frozen ``msgspec`` structs.

msgspec checks the shape (types, required and unknown keys, bounds); each struct's
``__post_init__`` checks the rules, raising ``errors.invalid(key, message)``. A failure becomes
one ``ConfigError`` line, ``<source>: <key path>: <what is wrong> (value <value>)``, with the
value looked up in the file's data. msgspec rather than pydantic keeps about 8 MB out of every
node's memory (docs/topolvm-node.md, "Footprint").
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
import yaml

from topolvm.config.errors import ConfigError

_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_KEY_IN = re.compile(r"^Expected `str`(?:, got `[^`]*`)? - at `key` in `\$(?P<path>[^`]*)`$")
_FIELD = re.compile(r"^Object (?P<what>missing required|contains unknown) field `(?P<key>[^`]*)`$")
_RULE = re.compile(r"^(?P<key>[A-Za-z][\w.\[\]-]*): (?P<msg>.*)$", re.S)
_PART = re.compile(r"\.([^.\[]+)|\[(\d+)\]")
_MISSING = object()
T = TypeVar("T")


def read_mapping(text: str, source: str, *, empty: bool = False) -> dict[Any, Any]:
    """The YAML document in ``text`` as a mapping; ``empty`` lets a blank file mean ``{}``."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {e}") from e
    if data is None and empty:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys, got {type(data).__name__}")
    return data


def convert(data: dict[Any, Any], kind: type[T], source: str) -> T:
    """``data`` as a ``kind`` struct, or a ``ConfigError`` naming the key path and the value."""
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as e:
        raise ConfigError(describe(str(e), data, source)) from None


def describe(error: str, data: object, source: str) -> str:
    if (key_in := _KEY_IN.match(error)) is not None:
        return f"{source}: {_display(key_in['path']) or '(top level)'}: keys must be strings"
    at = _AT.match(error)
    assert at is not None  # the pattern matches any text
    msg, path = at["msg"], at["path"] or ""
    if (field := _FIELD.match(msg)) is not None:
        path += "." + field["key"]
        msg = "is required" if field["what"] == "missing required" else "unknown key"
    elif (rule := _RULE.match(msg)) is not None:
        key = rule["key"]
        path += key if key.startswith("[") else "." + key
        msg = rule["msg"]
    value = _lookup(data, path)
    if value is not _MISSING and not isinstance(value, dict | list) and msg != "is required":
        msg += f" (value {value!r})"
    where = _display(path)
    return f"{source}: {where}: {msg}" if where else f"{source}: {msg}"


def _display(path: str) -> str:
    return path.removeprefix(".")


def _lookup(data: object, path: str) -> object:
    for name, index in _PART.findall(path):
        if name and isinstance(data, dict) and name in data:
            data = data[name]
        elif index and isinstance(data, list) and int(index) < len(data):
            data = data[int(index)]
        else:
            return _MISSING
    return data

"""The ``capacity.<plugin>/<device-class>`` annotations: one codec for everyone who reads or
writes them (spec §0, §7.1, §9.1, §15.4).

On a Node (written by topolvm-node, read by the scheduler extender and the controller) the value
is the free bytes of the class as a decimal string, read the way upstream's Go reads it
(``strconv.ParseUint(v, 10, 64)``). ``capacity.<plugin>/00default`` is the default class. On a
Pod (written by the pod webhook, read by the extender) the value is the sum of requested bytes.
"""

from __future__ import annotations

from collections.abc import Mapping

from topolvm.constants import DEFAULT_DEVICE_CLASS_KEY, Names

UINT64_MAX = (1 << 64) - 1
INT64_MAX = (1 << 63) - 1

NodeCapacities = dict[str, tuple[int | None, str]]
"""Annotation suffix (device class, ``00default``) → (bytes, or None if invalid; raw value)."""


class BadCapacityAnnotation(ValueError):
    """A pod annotation that is not a number of bytes; the message names it."""


def class_key(device_class: str) -> str:
    """The annotation suffix of a device class ("" is the default class)."""
    return device_class or DEFAULT_DEVICE_CLASS_KEY


def parse_node_value(raw: str) -> int | None:
    """A node annotation value as bytes; None when upstream could not parse it either."""
    if not raw.isascii() or not raw.isdigit():
        return None
    n = int(raw)
    return n if n <= UINT64_MAX else None


def encode_node(names: Names, default_free: int, by_class: Mapping[str, int]) -> dict[str, str]:
    """Node annotations for ``default_free`` (the default class) and each named class."""
    out = {names.capacity_prefix + DEFAULT_DEVICE_CLASS_KEY: str(default_free)}
    for device_class, free in by_class.items():
        out[names.capacity_annotation(device_class)] = str(free)
    return out


def decode_node(names: Names, annotations: Mapping[str, object] | None) -> NodeCapacities:
    """Every capacity annotation of a Node, parsed; foreign annotations are ignored."""
    prefix = names.capacity_prefix
    out: NodeCapacities = {}
    for key, value in (annotations or {}).items():
        if isinstance(key, str) and key.startswith(prefix):
            raw = value if isinstance(value, str) else str(value)
            out[key[len(prefix) :]] = (parse_node_value(raw), raw)
    return out


def node_free(names: Names, annotations: Mapping[str, object] | None, device_class: str) -> int:
    """Free bytes of ``device_class`` on a Node; a missing or invalid annotation counts as 0
    (the controller's reading: such a node offers nothing)."""
    raw = (annotations or {}).get(names.capacity_annotation(device_class))
    if not isinstance(raw, str):
        return 0
    return parse_node_value(raw) or 0


def encode_pod(names: Names, by_key: Mapping[str, int]) -> dict[str, str]:
    """Pod annotations: requested bytes per annotation suffix (see :func:`class_key`)."""
    return {names.capacity_prefix + key: str(size) for key, size in sorted(by_key.items())}


def decode_pod(
    names: Names, annotations: Mapping[str, str] | None, where: str = "pod"
) -> dict[str, int]:
    """Annotation suffix → requested bytes. Upstream silently ignores a value that is not an
    int64; here it raises :class:`BadCapacityAnnotation` naming ``where`` and the key."""
    prefix = names.capacity_prefix
    out: dict[str, int] = {}
    for key, value in (annotations or {}).items():
        if not key.startswith(prefix):
            continue
        v = value[1:] if value.startswith("+") else value
        place = f"{where} annotation {key}"
        if v.startswith("-") and v[1:].isascii() and v[1:].isdigit():
            raise BadCapacityAnnotation(
                f"{place}: {value!r} is negative; expected a number of bytes"
            )
        if not v.isascii() or not v.isdigit():
            raise BadCapacityAnnotation(f"{place}: {value!r} is not an integer number of bytes")
        n = int(v)
        if n > INT64_MAX:
            raise BadCapacityAnnotation(f"{place}: {value!r} is larger than the int64 maximum")
        out[key[len(prefix) :]] = n
    return dict(sorted(out.items()))

"""IO limits per volume (issue 41, groundwork): a VolumeAttributesClass's parameters, as CSI
passes them in ``mutable_parameters``, checked and made into the limits a LogicalVolume's spec
keeps; those, for a volume of a given size, into the cgroup v2 ``io.max`` line of its device.
Pure: no I/O, so the controller (validation, the spec) and the node (the line it writes) share
one reading.

Keys, each alone or with others (a value is a positive whole quantity, ``20Mi`` or ``1000``;
``max`` or no key is no limit):

- ``topolvm.io/read-bytes-per-second``, ``topolvm.io/write-bytes-per-second``,
  ``topolvm.io/bytes-per-second`` (both directions);
- ``topolvm.io/read-iops``, ``topolvm.io/write-iops``, ``topolvm.io/iops`` (both);
- each of these with ``-per-gib``: the limit scales with the volume's size (and its expansion).

A key for one direction refines a key for both. OpenEBS LVM LocalPV's names (``qosIopsLimit``,
``qosBandwithPerSec``, ...; spelled so) are read as the matching key, so classes carry over.

A new class changes the limits its keys name and no other (CSI: a key that is absent changes
nothing); ``max`` lifts one (:func:`parse_change`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from topolvm.quantity import InvalidQuantity, parse_quantity

PREFIX = "topolvm.io/"
GiB = 1 << 30
NO_LIMIT = "max"
# the least limit: Linux refuses 1 in io.max (blk-throttle from 4.14 until 2024)
LEAST = 2
# what io.max takes: bytes per second as u64, IO per second as unsigned int; at or above,
# a limit is no limit (a per-GiB limit on a large volume)
BYTES_MAX = 2**64 - 1
IOPS_MAX = 2**32 - 1
# the limits a spec keeps, and the io.max key of each
FIELDS: dict[str, str] = {
    "readBytesPerSecond": "rbps", "writeBytesPerSecond": "wbps",
    "readIOPS": "riops", "writeIOPS": "wiops",
}  # fmt: skip
PER_GIB = "PerGiB"  # a spec field's suffix for a limit per GiB of the volume
_BASES: dict[str, tuple[str, ...]] = {
    "read-bytes-per-second": ("readBytesPerSecond",),
    "write-bytes-per-second": ("writeBytesPerSecond",),
    "bytes-per-second": ("readBytesPerSecond", "writeBytesPerSecond"),
    "read-iops": ("readIOPS",),
    "write-iops": ("writeIOPS",),
    "iops": ("readIOPS", "writeIOPS"),
}
# key -> (the fields it sets, per GiB)
KEYS: dict[str, tuple[tuple[str, ...], bool]] = {
    **{PREFIX + base: (fields, False) for base, fields in _BASES.items()},
    **{f"{PREFIX}{base}-per-gib": (fields, True) for base, fields in _BASES.items()},
}
ALIASES: dict[str, str] = {  # OpenEBS LVM LocalPV's keys
    "qosIopsLimit": PREFIX + "iops",
    "qosIopsReadLimit": PREFIX + "read-iops",
    "qosIopsWriteLimit": PREFIX + "write-iops",
    "qosBandwithPerSec": PREFIX + "bytes-per-second",
    "qosBandwithReadPerSec": PREFIX + "read-bytes-per-second",
    "qosBandwithWritePerSec": PREFIX + "write-bytes-per-second",
}
# topolvm-node's warning Event when a volume's limits cannot be put in force (topolvm doctor
# reads it), posted about the LogicalVolume in this namespace (the object is cluster-wide)
NOT_IN_FORCE_REASON = "IOLimitsNotInForce"
EVENT_NAMESPACE = "default"
# topolvm-node's condition on its Node: True when the node cannot put limits in force at all
NODE_CONDITION = "TopoLVMIOLimitsUnsupported"


class InvalidLimits(ValueError):
    """A parameter that is not a limit; ``key`` names it (the CSI call's INVALID_ARGUMENT)."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key = key


@dataclass(frozen=True)
class Limit:
    value: int  # per second, or per second and GiB of the volume
    per_gib: bool = False

    def at(self, size_bytes: int) -> int:
        """The limit for a volume of ``size_bytes``: at least :data:`LEAST` (io.max takes no 0
        nor 1)."""
        if not self.per_gib:
            return self.value
        return max(LEAST, -(-self.value * size_bytes // GiB))


@dataclass(frozen=True)
class IoLimits:
    """Limits by spec field (``readBytesPerSecond``, ...); a field absent has none."""

    limits: Mapping[str, Limit] = field(default_factory=dict)

    @property
    def none(self) -> bool:
        return not self.limits

    def at(self, size_bytes: int) -> dict[str, int | None]:
        """Each io.max key's limit for a volume of ``size_bytes`` (None: ``max``, also for a
        limit past what io.max takes)."""
        out: dict[str, int | None] = {}
        for f, key in FIELDS.items():
            value = self.limits[f].at(size_bytes) if f in self.limits else None
            ceiling = IOPS_MAX if key.endswith("iops") else BYTES_MAX
            out[key] = None if value is None or value >= ceiling else value
        return out

    def to_spec(self) -> dict[str, int]:
        """What a LogicalVolume's ``spec.ioLimits`` keeps."""
        return {f + (PER_GIB if lim.per_gib else ""): lim.value
                for f, lim in sorted(self.limits.items())}  # fmt: skip

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None) -> IoLimits:
        """The limits of ``spec.ioLimits`` (as :meth:`to_spec` wrote them)."""
        limits: dict[str, Limit] = {}
        for name, value in (spec or {}).items():
            per_gib = name.endswith(PER_GIB)
            f = name.removesuffix(PER_GIB) if per_gib else name
            if f not in FIELDS:
                raise InvalidLimits(name, f"not an IO limit (one of {', '.join(FIELDS)})")
            if isinstance(value, bool) or not isinstance(value, int) or value < LEAST:
                raise InvalidLimits(name, f"not a whole number of at least {LEAST}: {value!r}")
            if f in limits:
                raise InvalidLimits(name, f"{f} is given both per GiB and not")
            limits[f] = Limit(value, per_gib)
        return cls(limits)


@dataclass(frozen=True)
class Change:
    """What a class's parameters say, per spec field: a new limit, or None (``max``: lifted).
    A field no key names is not here: the class leaves it as it is."""

    fields: Mapping[str, Limit | None] = field(default_factory=dict)

    def applied_to(self, limits: IoLimits) -> IoLimits:
        out = dict(limits.limits)
        for f, limit in self.fields.items():
            out.pop(f, None)  # per GiB or not: the new one replaces either
            if limit is not None:
                out[f] = limit
        return IoLimits(out)


def parse_change(params: Mapping[str, str]) -> Change:
    """What a class's parameters change. Raises :class:`InvalidLimits` naming the first key
    that is unknown, has a value that is not a whole quantity of at least 2 or ``max``, or sets
    a limit another key of the same kind already set."""
    chosen: dict[str, tuple[str, Limit | None, int]] = {}  # field -> (key, limit, how specific)
    for given in sorted(params):
        key = ALIASES.get(given, given)
        if key not in KEYS:
            raise InvalidLimits(given, f"not an IO limit key (one of {', '.join(KEYS)}, or "
                                f"{', '.join(ALIASES)})")  # fmt: skip
        fields, per_gib = KEYS[key]
        limit = _value(given, params[given], per_gib)
        for f in fields:
            prior = chosen.get(f)
            if prior is not None and prior[2] == len(fields):  # the same kind: one must go
                raise InvalidLimits(given, f"sets {f}, which {prior[0]} sets too")
            if prior is None or prior[2] > len(fields):  # one direction refines both
                chosen[f] = (given, limit, len(fields))
    return Change({f: limit for f, (_, limit, _) in chosen.items()})


def parse(params: Mapping[str, str]) -> IoLimits:
    """The limits a class's parameters ask for, on a volume that has none (CreateVolume)."""
    return parse_change(params).applied_to(IoLimits())


def _value(key: str, raw: str, per_gib: bool) -> Limit | None:
    text = str(raw).strip()
    if text == NO_LIMIT:
        return None
    try:
        value = parse_quantity(text, whole=True)
    except InvalidQuantity:
        value = 0
    if value < LEAST:
        raise InvalidLimits(key, f"{raw!r} is not a whole quantity of at least {LEAST}, or "
                            f"{NO_LIMIT!r}")  # fmt: skip
    return Limit(value, per_gib)


def io_max_line(major: int, minor: int, limits: IoLimits, size_bytes: int) -> str:
    """The ``io.max`` line for device ``major:minor``: every key written, ``max`` where there is
    no limit (a key left out would keep an earlier limit)."""
    values = limits.at(size_bytes)
    keys = " ".join(f"{k}={NO_LIMIT if v is None else v}" for k, v in values.items())
    return f"{major}:{minor} {keys}"

"""Kubernetes quantities (``1Gi``, ``20Mi``, ``1.5Gi``) as whole numbers and back: pure, for
every layer (the LogicalVolume's sizes, a VolumeAttributesClass's limits)."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

_SUFFIXES: dict[str, int | Decimal] = {
    "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "m": Decimal("0.001"), "u": Decimal("0.000001"), "n": Decimal("0.000000001"), "": 1,
}  # fmt: skip
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)


class InvalidQuantity(ValueError):
    pass


# Kubernetes reads a quantity's bytes as an int64 (resource.Quantity.Value()); so does this.
MAX_QUANTITY = 2**63 - 1
_MAX_DIGITS = 19  # a number whose exponent is above this exceeds MAX_QUANTITY before any suffix


def parse_quantity(value: Any, *, whole: bool = False) -> int:
    """A Kubernetes quantity (``1Gi``, ``1073741824``, ``1.5Gi``) as a whole number, rounded
    up; with ``whole``, one that is not a whole number (``1.5``, ``500m``) is refused."""
    if isinstance(value, bool):
        raise InvalidQuantity(f"not a quantity: {value!r}")
    if isinstance(value, int):
        if value > MAX_QUANTITY:
            raise InvalidQuantity(f"quantity {value!r} is larger than {MAX_QUANTITY} bytes")
        return value
    if not isinstance(value, str):
        raise InvalidQuantity(f"not a quantity: {value!r}")
    m = _QUANTITY.match(value.strip())
    if m is None:
        raise InvalidQuantity(f"not a quantity: {value!r}")
    number, exponent, suffix = m.groups()
    try:
        base = Decimal(number + (exponent or ""))
        # Anyone who may write the object can write "1e30000000": refuse what no volume can
        # be before computing it (a huge exponent costs seconds, or overflows Decimal).
        if base and base.adjusted() > _MAX_DIGITS:
            raise InvalidQuantity(f"quantity {value!r} is larger than {MAX_QUANTITY} bytes")
        amount = base * Decimal(_SUFFIXES[suffix or ""])
    except ArithmeticError as e:  # decimal's InvalidOperation, Overflow, ...
        raise InvalidQuantity(f"not a quantity: {value!r}") from e
    rounded = int(amount.to_integral_value(rounding="ROUND_CEILING"))
    if whole and rounded != amount:
        raise InvalidQuantity(f"quantity {value!r} is not a whole number")
    if rounded > MAX_QUANTITY:
        raise InvalidQuantity(f"quantity {value!r} is larger than {MAX_QUANTITY} bytes")
    return rounded


def format_quantity(size: int) -> str:
    """Bytes in BinarySI form, as upstream writes them (``1Gi``, ``1023Mi``, ``4097``)."""
    if size == 0:
        return "0"
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = int(_SUFFIXES[suffix])
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)

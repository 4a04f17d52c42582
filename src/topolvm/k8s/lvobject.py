"""The LogicalVolume custom resource as a typed view over its JSON (spec §5)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
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


def parse_quantity(value: Any) -> int:
    """A Kubernetes quantity (``1Gi``, ``1073741824``, ``1.5Gi``) as whole bytes, rounded up."""
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
    whole = int(amount.to_integral_value(rounding="ROUND_CEILING"))
    if whole > MAX_QUANTITY:
        raise InvalidQuantity(f"quantity {value!r} is larger than {MAX_QUANTITY} bytes")
    return whole


def format_quantity(size: int) -> str:
    """Bytes in BinarySI form, as upstream writes them (``1Gi``, ``1023Mi``, ``4097``)."""
    if size == 0:
        return "0"
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = int(_SUFFIXES[suffix])
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


@dataclass
class LogicalVolumeObject:
    """What the node and controller read from a LogicalVolume object.

    Three types carry the name "logical volume"; each is named by its role: this one is the
    Kubernetes object, ``lvm.report.LvRecord`` is a row of ``lvs``, and the protobuf
    ``LogicalVolume`` is lvmd's wire message.
    """

    name: str
    uid: str
    resource_version: str
    node_name: str
    size: int
    device_class: str = ""
    lvcreate_option_class: str = ""
    source: str = ""
    access_type: str = ""
    volume_id: str = ""
    code: int = 0
    message: str = ""
    current_size: int | None = None
    deleting: bool = False
    finalizers: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> LogicalVolumeObject:
        """Raises InvalidQuantity/KeyError/TypeError for objects that break the schema."""
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        current = status.get("currentSize")
        return cls(
            name=str(meta["name"]),
            uid=str(meta.get("uid", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            node_name=str(spec.get("nodeName", "")),
            size=parse_quantity(spec.get("size", 0)),
            device_class=str(spec.get("deviceClass") or ""),
            lvcreate_option_class=str(spec.get("lvcreateOptionClass") or ""),
            source=str(spec.get("source") or ""),
            access_type=str(spec.get("accessType") or ""),
            volume_id=str(status.get("volumeID") or ""),
            code=int(status.get("code") or 0),
            message=str(status.get("message") or ""),
            current_size=None if current is None else parse_quantity(current),
            deleting=bool(meta.get("deletionTimestamp")),
            finalizers=list(meta.get("finalizers") or []),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
        )


def status_dict(
    *, volume_id: str, code: int, message: str, current_size: int | None
) -> dict[str, Any]:
    """The ``status`` object as upstream writes it (empty fields omitted)."""
    out: dict[str, Any] = {}
    if volume_id:
        out["volumeID"] = volume_id
    if code:
        out["code"] = code
    if message:
        out["message"] = message
    if current_size is not None:
        out["currentSize"] = format_quantity(current_size)
    return out

"""Validation of every externally supplied value before it reaches an LVM command line."""

from __future__ import annotations

import re

from topolvm.lvm.errors import InvalidInput

# LVM's own rules (lvm(8) "VALID NAMES"): letters, digits and "+_.-", may not start with "-",
# may not be "." or "..", may not use reserved prefixes/suffixes of internal LVs.
_LV_NAME = re.compile(r"[A-Za-z0-9+_.][A-Za-z0-9+_.-]*")
_LV_RESERVED_PREFIXES = ("snapshot", "pvmove")
_LV_RESERVED_PARTS = (
    "_cdata", "_cmeta", "_corig", "_iorig", "_mimage", "_mlog", "_pmspare", "_rimage",
    "_rmeta", "_tdata", "_tmeta", "_vdata", "_vorigin", "_wcorig",
)  # fmt: skip
MAX_LV_NAME = 127
# lvm(8): tags may contain [A-Za-z0-9_+.-/=!:&#], must not start with "-", up to 1024 chars.
_TAG = re.compile(r"[A-Za-z0-9_+./=!:&#][A-Za-z0-9_+./=!:&#-]*")
MAX_TAG = 1024
INT64_MAX = 2**63 - 1


def lv_name(name: str, what: str = "logical volume name") -> str:
    """Return ``name`` if LVM would accept it as an LV name and it cannot be read as an option."""
    if not name:
        raise InvalidInput(f"{what} is empty")
    if len(name) > MAX_LV_NAME:
        raise InvalidInput(f"{what} {name[:40]!r}... is longer than {MAX_LV_NAME} characters")
    if _LV_NAME.fullmatch(name) is None or name in (".", ".."):
        raise InvalidInput(
            f"invalid {what} {name!r}: use letters, digits and '+_.-', not starting with '-'"
        )
    if name.startswith(_LV_RESERVED_PREFIXES) or any(p in name for p in _LV_RESERVED_PARTS):
        raise InvalidInput(f"invalid {what} {name!r}: LVM reserves that prefix or suffix")
    return name


def tag(value: str) -> str:
    """Return ``value`` if it is a valid LVM tag."""
    if not value or len(value) > MAX_TAG or _TAG.fullmatch(value) is None:
        raise InvalidInput(
            f"invalid tag {value[:60]!r}: 1-{MAX_TAG} characters of [A-Za-z0-9_+./=!:&#-], "
            "not starting with '-'"
        )
    return value


def size_bytes(value: int, what: str = "size_bytes") -> int:
    """Return a strictly positive int64 size."""
    if value <= 0:
        raise InvalidInput(f"{what} must be positive, got {value}")
    if value > INT64_MAX:
        raise InvalidInput(f"{what} {value} is too large")
    return value

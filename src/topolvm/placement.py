"""Where a restore or clone may be filled: ``<plugin>/restore-placement`` of a StorageClass or
VolumeSnapshotClass (pure; docs/mobility.md, "A restore stays local when it can"). The pod
webhook applies it (``controller/restoreplace.py``), the StorageClass check of CreateVolume
refuses a bad value, and ``topolvm doctor`` reads it to explain a copy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from topolvm.constants import Names

SOURCE_NODE, ANYWHERE = "source-node", "anywhere"


class PlacementValueError(ValueError):
    """``<plugin>/restore-placement`` is neither ``source-node`` nor ``anywhere``."""


def prefers_source(params: Any, names: Names, what: str = "parameters") -> bool:
    """Whether a StorageClass's or VolumeSnapshotClass's ``parameters`` keep the preference
    for the source's node; raises :class:`PlacementValueError` (naming ``what``) for a value
    that is neither choice."""
    key = names.restore_placement_param
    value = (params if isinstance(params, Mapping) else {}).get(key, "") or SOURCE_NODE
    if value not in (SOURCE_NODE, ANYWHERE):
        raise PlacementValueError(
            f"{what}: {key} must be {SOURCE_NODE} or {ANYWHERE}, got {value!r}"
        )
    return value == SOURCE_NODE


def placement_error(params: Any, names: Names, what: str) -> str:
    """What is wrong with ``params``' restore placement ("" when nothing is)."""
    try:
        prefers_source(params, names, what)
    except PlacementValueError as e:
        return str(e)
    return ""

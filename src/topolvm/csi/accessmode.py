"""A CSI access mode's name, for messages, whatever number a caller sent."""

from __future__ import annotations

from typing import Any, cast

from topolvm.proto import csi_pb2 as csi

AccessMode = csi.VolumeCapability.AccessMode


def mode_name(mode: int) -> str:
    try:
        return AccessMode.Mode.Name(cast(Any, mode))
    except ValueError:
        return "UNKNOWN"

"""What a CreateVolume or ControllerModifyVolume asks for, checked before anything is written:
the volume capabilities, and the IO limits of a VolumeAttributesClass (docs/qos.md)."""

from __future__ import annotations

from typing import Any

from topolvm import iolimits
from topolvm.csi.accessmode import mode_name
from topolvm.csi.mountflags import check_mount_flags
from topolvm.proto import csi_pb2 as csi
from topolvm.rpc import status

SINGLE_NODE_WRITER = csi.VolumeCapability.AccessMode.SINGLE_NODE_WRITER


def check_capabilities(caps: Any) -> tuple[bool, str]:
    """(block?, fs type) of the first capability, after checking every one."""
    if not caps:
        raise status.InvalidArgument("no volume capabilities are provided")
    for cap in caps:
        if cap.WhichOneof("access_type") not in ("block", "mount"):
            raise status.InvalidArgument("unknown or empty access_type")
        if cap.HasField("access_mode") and cap.access_mode.mode != SINGLE_NODE_WRITER:
            mode = cap.access_mode.mode
            raise status.InvalidArgument(f"unsupported access mode: {mode_name(mode)} ({mode})")
        if cap.WhichOneof("access_type") == "mount":
            check_mount_flags(cap.mount.mount_flags)
    first = caps[0]
    block = first.WhichOneof("access_type") == "block"
    return block, "" if block else first.mount.fs_type


def io_limits_of(mutable_parameters: Any) -> tuple[tuple[str, int], ...]:
    """A new volume's VolumeAttributesClass parameters as ``spec.ioLimits`` (docs/qos.md)."""
    return tuple(io_change_of(mutable_parameters).applied_to(iolimits.IoLimits()).to_spec().items())


def io_change_of(mutable_parameters: Any) -> iolimits.Change:
    """What a VolumeAttributesClass's parameters change; a key or value that is not a limit is
    INVALID_ARGUMENT, so that csi-resizer marks the class Infeasible instead of retrying it."""
    try:
        return iolimits.parse_change(dict(mutable_parameters))
    except iolimits.InvalidLimits as e:
        raise status.InvalidArgument(f"VolumeAttributesClass parameter {e}") from e


def changed_spec(change: iolimits.Change, stored: dict[str, Any]) -> dict[str, int]:
    """``spec.ioLimits`` after ``change``: the keys it names changed, the others kept (CSI: an
    absent key changes nothing). A stored spec that does not read (written by hand) is
    replaced as a whole."""
    try:
        current = iolimits.IoLimits.from_spec(stored)
    except iolimits.InvalidLimits:
        current = iolimits.IoLimits()
    return change.applied_to(current).to_spec()

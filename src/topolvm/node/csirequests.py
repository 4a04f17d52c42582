"""Checks of CSI Node requests' fields and what they imply (mount options), pure: each bad
field is an INVALID_ARGUMENT naming it."""

from __future__ import annotations

from topolvm.csi.mountflags import check_mount_flags
from topolvm.proto import csi_pb2 as csi
from topolvm.rpc import status

AccessMode = csi.VolumeCapability.AccessMode


def mount_options(
    readonly: bool, mount: csi.VolumeCapability.MountVolume, fstype: str
) -> list[str]:
    """``ro`` if read-only, then the StorageClass mount flags, then ``nouuid`` for xfs."""
    check_mount_flags(mount.mount_flags)
    options = ["ro"] if readonly else []
    for flag in mount.mount_flags:
        if flag == "rw" and readonly:
            raise status.InvalidArgument(
                'mount option "rw" is specified even though read only mode is specified',
            )
        if flag:
            options.append(flag)
    if fstype == "xfs":
        options.append("nouuid")  # clones and snapshots share their origin's UUID
    return options


def require(value: str, what: str) -> None:
    if not value:
        raise status.InvalidArgument(f"no {what} is provided")


def check_capacity_range(request: csi.NodeExpandVolumeRequest) -> None:
    required = request.capacity_range.required_bytes
    limit = request.capacity_range.limit_bytes
    if required < 0:
        raise status.InvalidArgument("required capacity must not be negative")
    if limit < 0:
        raise status.InvalidArgument("capacity limit must not be negative")
    if limit != 0 and required > limit:
        raise status.InvalidArgument(
            f"requested capacity exceeds limit capacity: request={required} limit={limit}",
        )

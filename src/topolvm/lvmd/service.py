"""What lvmd's two gRPC services (``proto.LVService``, ``proto.VGService``; lvservice.py and
vgservice.py, as upstream splits them) share: error mapping, call logging, the device-class
lookup and the LogicalVolume message."""

from __future__ import annotations

import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from topolvm.config.lvmd import DeviceClass, LvmdConfig
from topolvm.lvm.errors import InvalidInput, LvmError
from topolvm.lvm.report import LvRecord
from topolvm.lvmd.capacity import PoolMissing
from topolvm.proto import lvmd_pb2 as pb
from topolvm.rpc import status

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def translate(e: Exception) -> status.StatusError | None:
    if isinstance(e, InvalidInput):
        return status.InvalidArgument(str(e))
    if isinstance(e, PoolMissing):
        return status.Internal(f"failed to get pool from device class: {e}")
    if isinstance(e, LvmError):
        return status.Internal(str(e))
    return None


# "name" would clash with LogRecord.name: log it as "lv".
_LOGGED = {"name": "lv", "device_class": "device_class", "size_bytes": "size_bytes",
           "source_volume": "source_volume", "access_type": "access_type"}  # fmt: skip


def rpc_of(service: str) -> Callable[[F], F]:
    """The decorator of ``service``'s unary methods: errors mapped to gRPC status codes, every
    call logged with its request context and timing."""
    return status.rpc(service, lambda r: status.fields_of(r, _LOGGED), translate)


def block_device(path: str) -> tuple[int, int, int] | None:
    """(major, minor, size in bytes) of an active LV's device node, from stat and sysfs."""
    try:
        st = os.stat(path)
        if not stat.S_ISBLK(st.st_mode):
            return None
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
        sectors = int(Path(f"/sys/dev/block/{major}:{minor}/size").read_text())
    except (OSError, ValueError):
        return None
    return major, minor, sectors * 512


def dm_uuid(major: int, minor: int) -> str:
    """A device-mapper device's uuid, from sysfs ("" when it has none or cannot be read)."""
    try:
        return Path(f"/sys/dev/block/{major}:{minor}/dm/uuid").read_text()
    except OSError:
        return ""


def resolve(config: LvmdConfig, name: str) -> DeviceClass:
    dc = config.device_class(name)
    if dc is None:
        raise status.NotFound(f"device-class not found: {name}")
    return dc


def to_pb(lv: LvRecord, *, full: bool) -> pb.LogicalVolume:
    msg = pb.LogicalVolume(name=lv.name, size_bytes=lv.size, dev_major=lv.major, dev_minor=lv.minor)
    if full:
        msg.tags.extend(lv.tags)
        msg.path = lv.path
        msg.attr = lv.attr
    return msg

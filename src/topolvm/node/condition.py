"""Volume health from LVM's ``lv_attr`` (spec §4.6), reported as the CSI VolumeCondition."""

from __future__ import annotations

from dataclasses import dataclass

LV_ATTR_LENGTH = 10
HEALTHY = "volume is healthy and operating normally"

PARTIAL_ACTIVATION = (
    "found partial activation of physical volumes, one or more physical volumes are setup "
    "incorrectly"
)
UNKNOWN_HEALTH = "unknown volume health reported, verification on the host system is required"
WRITECACHE_ERROR = "write cache error signifies that dm-writecache reports an error"
THIN_POOL_FAILED = (
    "thin pool encounters serious failures and hence no further I/O is permitted at all"
)
THIN_POOL_OUT_OF_DATA = (
    "thin pool is out of data space, no further data can be written to the thin pool without "
    "extension"
)
THIN_POOL_METADATA_READ_ONLY = (
    "metadata read only signifies that thin pool encounters certain types of failures, but it's "
    "still possible to do data reads. However, no metadata changes are allowed"
)
THIN_VOLUME_FAILED = (
    "the underlying thin pool entered a failed state and no further I/O is permitted"
)
RAID_REFRESH_NEEDED = (
    "RAID volume requires a refresh, one or more Physical Volumes have suffered a write error. "
    "This could be due to temporary failure of the Physical Volume or an indication it is "
    "failing. The device should be refreshed or replaced"
)
RAID_MISMATCHES = (
    "RAID volume has portions of the array that are not coherent. Inconsistencies are detected "
    'by initiating a check RAID logical volume. The scrubbing operations, "check" and "repair", '
    'can be performed on a RAID volume via the "lvchange" command'
)
RAID_RESHAPING = (
    "RAID volume is currently reshaping. Reshaping signifies a RAID Logical Volume is either "
    "undergoing a stripe addition/removal, a stripe size or RAID algorithm change"
)
RAID_RESHAPE_REMOVED = "RAID volume signifies freed raid images after reshaping"
RAID_WRITE_MOSTLY = (
    "RAID volume is marked as write-mostly. this signifies the devices in a RAID 1 logical "
    "volume have been marked write-mostly. This means that reading from this device will be "
    "avoided, and other devices will be preferred for reading (unless no other devices are "
    "available). This minimizes the I/O to the specified device"
)
SUSPENDED = "logical volume is in a suspended state, no I/O is permitted"
INVALID_SNAPSHOT = "logical volume is an invalid snapshot, no I/O is permitted"
MERGE_FAILED = "snapshot merge failed, no I/O is permitted"
INACTIVE_TABLES = "mapped device present with inactive tables, no I/O is permitted"
NO_TABLES = "mapped device present without tables, no I/O is permitted"
THIN_POOL_CHECK_NEEDED = "a thin pool check is needed"
UNKNOWN_STATE = "unknown volume state, verification on the host system is required"
HISTORICAL = (
    "historical volume state (volume no longer exists but is kept around in logs), "
    "verification on the host system is required"
)
UNKNOWN_OPEN = (
    "logical volume underlying device state is unknown, verification on the host system is required"
)

_ANY_TYPE_HEALTH = {"p": PARTIAL_ACTIVATION, "X": UNKNOWN_HEALTH, "E": WRITECACHE_ERROR}
_THIN_POOL_HEALTH = {
    "F": THIN_POOL_FAILED,
    "D": THIN_POOL_OUT_OF_DATA,
    "M": THIN_POOL_METADATA_READ_ONLY,
}
_THIN_VOLUME_HEALTH = {"F": THIN_VOLUME_FAILED}
_RAID_HEALTH = {
    "r": RAID_REFRESH_NEEDED,
    "m": RAID_MISMATCHES,
    "s": RAID_RESHAPING,
    "R": RAID_RESHAPE_REMOVED,
    "w": RAID_WRITE_MOSTLY,
}
_STATE = {
    "s": SUSPENDED,
    "S": SUSPENDED,
    "I": INVALID_SNAPSHOT,
    "m": MERGE_FAILED,
    "M": MERGE_FAILED,
    "i": INACTIVE_TABLES,
    "d": NO_TABLES,
    "c": THIN_POOL_CHECK_NEEDED,
    "C": THIN_POOL_CHECK_NEEDED,
    "X": UNKNOWN_STATE,
    "h": HISTORICAL,
}


class InvalidLvAttr(ValueError):
    """``lv_attr`` is not the 10-character string LVM reports."""


@dataclass(frozen=True)
class Condition:
    abnormal: bool
    message: str


def condition_from_attr(attr: str) -> Condition:
    """The volume's condition from its ``lv_attr``; :class:`InvalidLvAttr` if malformed."""
    if len(attr) != LV_ATTR_LENGTH:
        raise InvalidLvAttr(
            f"failed to parse attributes returned from logical volume service: {attr} is an "
            f"invalid length lv_attr, expected {LV_ATTR_LENGTH}, but got {len(attr)}"
        )
    vol_type, state, open_, health = attr[0], attr[4], attr[5], attr[8]
    message = _ANY_TYPE_HEALTH.get(health)
    if message is None and vol_type == "t":
        message = _THIN_POOL_HEALTH.get(health)
    if message is None and vol_type == "V":
        message = _THIN_VOLUME_HEALTH.get(health)
    if message is None and vol_type in ("r", "R"):
        message = _RAID_HEALTH.get(health)
    if message is None:
        message = _STATE.get(state)
    if message is None and open_ == "X":
        message = UNKNOWN_OPEN
    if message is None:
        return Condition(abnormal=False, message=HEALTHY)
    return Condition(abnormal=True, message=message)

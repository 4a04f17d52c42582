"""VolumeCondition from lv_attr (spec §4.6): every abnormal case and its message."""

from __future__ import annotations

import asyncio

import pytest

from topolvm.node import condition as c
from topolvm.node.condition import Condition, InvalidLvAttr, condition_from_attr
from topolvm.node.csirequests import mount_options
from topolvm.node.mounter import parse_mountinfo, unescape
from topolvm.proto import csi_pb2 as csi
from topolvm.rpc.locks import KeyedLocks
from topolvm.rpc.status import StatusError
from topolvm.rpc.transport import Status


def attr(vol_type: str = "-", state: str = "a", open_: str = "o", health: str = "-") -> str:
    """A 10-char lv_attr with the given type (1), state (5), open (6) and health (9) chars."""
    return f"{vol_type}wi-{state}{open_}--{health}-"


def test_attr_helper_builds_ten_chars() -> None:
    assert attr() == "-wi-ao----"
    assert attr("V", "a", "-", "F") == "Vwi-a---F-"


@pytest.mark.parametrize(
    "raw", ["-wi-ao----", "Vwi-aotz--", "twi-aotz--", "rwi-aor---", "owi-a-----", "-wi-------"]
)
def test_healthy(raw: str) -> None:
    assert condition_from_attr(raw) == Condition(False, c.HEALTHY)
    assert c.HEALTHY == "volume is healthy and operating normally"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        # health (char 9), any volume type
        (attr(health="p"), c.PARTIAL_ACTIVATION),
        (attr(health="X"), c.UNKNOWN_HEALTH),
        (attr(health="E"), c.WRITECACHE_ERROR),
        (attr("V", health="p"), c.PARTIAL_ACTIVATION),
        # thin pools
        (attr("t", health="F"), c.THIN_POOL_FAILED),
        (attr("t", health="D"), c.THIN_POOL_OUT_OF_DATA),
        (attr("t", health="M"), c.THIN_POOL_METADATA_READ_ONLY),
        # thin volumes
        (attr("V", health="F"), c.THIN_VOLUME_FAILED),
        # RAID (with and without initial sync)
        (attr("r", health="r"), c.RAID_REFRESH_NEEDED),
        (attr("r", health="m"), c.RAID_MISMATCHES),
        (attr("r", health="s"), c.RAID_RESHAPING),
        (attr("r", health="R"), c.RAID_RESHAPE_REMOVED),
        (attr("r", health="w"), c.RAID_WRITE_MOSTLY),
        (attr("R", health="r"), c.RAID_REFRESH_NEEDED),
        (attr("R", health="w"), c.RAID_WRITE_MOSTLY),
        # state (char 5)
        (attr(state="s"), c.SUSPENDED),
        (attr(state="S"), c.SUSPENDED),
        (attr(state="I"), c.INVALID_SNAPSHOT),
        (attr(state="m"), c.MERGE_FAILED),
        (attr(state="M"), c.MERGE_FAILED),
        (attr(state="i"), c.INACTIVE_TABLES),
        (attr(state="d"), c.NO_TABLES),
        (attr(state="c"), c.THIN_POOL_CHECK_NEEDED),
        (attr(state="C"), c.THIN_POOL_CHECK_NEEDED),
        (attr(state="X"), c.UNKNOWN_STATE),
        (attr(state="h"), c.HISTORICAL),
        # open (char 6)
        (attr(open_="X"), c.UNKNOWN_OPEN),
    ],
)
def test_abnormal(raw: str, message: str) -> None:
    assert len(raw) == 10
    assert condition_from_attr(raw) == Condition(True, message)


@pytest.mark.parametrize(
    "raw",
    [
        attr("-", health="F"),  # F/D/M only matter for thin pools and (F) thin volumes
        attr("-", health="D"),
        attr("V", health="D"),
        attr("V", health="M"),
        attr("-", health="r"),  # r/m/s/R/w only matter for RAID
        attr("t", health="w"),
        attr("V", health="m"),
    ],
)
def test_type_specific_health_ignored_for_other_types(raw: str) -> None:
    assert condition_from_attr(raw) == Condition(False, c.HEALTHY)


def test_health_is_checked_before_state_and_open() -> None:
    assert condition_from_attr(attr("t", "s", "X", "D")).message == c.THIN_POOL_OUT_OF_DATA
    assert condition_from_attr(attr("-", "I", "X", "-")).message == c.INVALID_SNAPSHOT


def test_fixed_messages() -> None:
    assert c.PARTIAL_ACTIVATION.startswith("found partial activation of physical volumes")
    assert c.SUSPENDED == "logical volume is in a suspended state, no I/O is permitted"
    assert c.THIN_POOL_CHECK_NEEDED == "a thin pool check is needed"
    messages = [v for k, v in vars(c).items() if k.isupper() and isinstance(v, str)]
    abnormal = [m for m in messages if m != c.HEALTHY and m != str(c.LV_ATTR_LENGTH)]
    assert len(set(abnormal)) == len(abnormal)  # each case has its own message


@pytest.mark.parametrize("raw", ["", "-wi-ao---", "-wi-ao-----", "-wi-ao---- "])
def test_invalid_length(raw: str) -> None:
    with pytest.raises(InvalidLvAttr, match="invalid length lv_attr, expected 10"):
        condition_from_attr(raw)


# -- mountinfo parsing (host-side; used by the node service) ---------------------------------


def test_mountinfo_parsing_with_escapes_and_optional_fields() -> None:
    text = (
        "22 20 254:0 / /run/a\\040b rw,relatime shared:5 master:1 - ext4 /dev/mapper/vg-a rw\n"
        "23 20 0:5 /mapper/vg-b /run/blk ro,relatime - devtmpfs devtmpfs rw,mode=755\n"
        "24 20 0:19 / /run/back\\134slash rw - btrfs /dev/vg/c rw,ssd\n"
        "garbage line\n"
    )
    entries = parse_mountinfo(text)
    assert [e.mount_point for e in entries] == ["/run/a b", "/run/blk", "/run/back\\slash"]
    first = entries[0]
    assert (first.major, first.minor, first.fstype, first.source) == (
        254,
        0,
        "ext4",
        "/dev/mapper/vg-a",
    )
    assert not first.readonly
    assert entries[1].readonly and entries[1].root == "/mapper/vg-b"
    assert unescape("a\\011b\\012c") == "a\tb\nc"


# -- mount options and per-volume locks (host-side helpers of the node service) -----------------


def test_mount_options_order() -> None:
    mount = csi.VolumeCapability.MountVolume(mount_flags=["noatime", "", "commit=30"])
    assert mount_options(False, mount, "ext4") == ["noatime", "commit=30"]
    assert mount_options(True, mount, "ext4") == ["ro", "noatime", "commit=30"]
    assert mount_options(True, mount, "xfs") == ["ro", "noatime", "commit=30", "nouuid"]
    assert mount_options(False, csi.VolumeCapability.MountVolume(mount_flags=["rw"]), "xfs") == [
        "rw",
        "nouuid",
    ]
    with pytest.raises(StatusError) as e:
        mount_options(True, csi.VolumeCapability.MountVolume(mount_flags=["rw"]), "ext4")
    assert e.value.code == Status.INVALID_ARGUMENT


async def test_volume_locks_serialise_one_volume_only() -> None:
    locks = KeyedLocks()
    order: list[str] = []

    async def work(volume: str, tag: str, delay: float) -> None:
        async with locks.hold(volume):
            order.append(f"{tag}+")
            await asyncio.sleep(delay)
            order.append(f"{tag}-")

    await asyncio.gather(work("a", "a1", 0.05), work("a", "a2", 0.0), work("b", "b1", 0.01))
    assert order.index("a1-") < order.index("a2+")  # same volume: one after the other
    assert order.index("b1+") < order.index("a1-")  # another volume: concurrently
    assert len(locks) == 0

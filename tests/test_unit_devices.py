"""lvmd's view of the kernel's block-device events (src/topolvm/lvmd/devices.py): the uevent
format, the sysfs fingerprint, and the coalescing of a burst of real kernel events (synthetic
``change`` events the host kernel sends for one of its loop devices when asked through sysfs)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from topolvm.lvmd.devices import (
    SYS_CLASS_BLOCK,
    DeviceEvents,
    concerns_lvm,
    fingerprint,
    parse_uevent,
)

# as the kernel sent it for `echo change > /sys/class/block/loop0/uevent`
LOOP_CHANGE = (
    b"change@/devices/virtual/block/loop0\x00ACTION=change\x00DEVPATH=/devices/virtual/block/loop0"
    b"\x00SUBSYSTEM=block\x00SYNTH_UUID=0\x00MAJOR=7\x00MINOR=0\x00DEVNAME=loop0\x00DEVTYPE=disk"
    b"\x00DISKSEQ=1\x00SEQNUM=2133\x00"
)


def test_a_kernel_uevent_is_parsed() -> None:
    event = parse_uevent(LOOP_CHANGE)
    assert event is not None
    assert (event.action, event.devpath, event.subsystem) == (
        "change", "/devices/virtual/block/loop0", "block",
    )  # fmt: skip
    assert event.env["DEVNAME"] == "loop0" and concerns_lvm(event)


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00\x00", b"libudev\x00\xfe\xed\xca\xfe", b"add@\x00ACTION=add", b"@/devices/x\x00"],
)
def test_what_is_not_a_kernel_uevent_is_ignored(data: bytes) -> None:
    assert parse_uevent(data) is None


def test_other_subsystems_do_not_concern_lvm() -> None:
    event = parse_uevent(b"add@/devices/virtual/net/veth0\x00ACTION=add\x00SUBSYSTEM=net\x00")
    assert event is not None and not concerns_lvm(event)


def test_the_fingerprint_names_each_device_its_size_and_mapper_name(tmp_path: Path) -> None:
    (tmp_path / "vda").mkdir()
    (tmp_path / "vda" / "size").write_text("2097152\n")
    (tmp_path / "dm-0" / "dm").mkdir(parents=True)
    (tmp_path / "dm-0" / "size").write_text("2048\n")
    (tmp_path / "dm-0" / "dm" / "name").write_text("vg1-lv1\n")
    before = fingerprint(tmp_path)
    assert before == {("vda", "2097152", ""), ("dm-0", "2048", "vg1-lv1")}
    (tmp_path / "dm-0" / "size").write_text("4096\n")  # lvextend
    assert fingerprint(tmp_path) != before
    (tmp_path / "dm-0" / "size").write_text("2048\n")
    (tmp_path / "dm-0" / "dm" / "name").write_text("vg1-lv2\n")  # lvrename, same minor
    assert fingerprint(tmp_path) != before
    assert fingerprint(tmp_path / "missing") == frozenset()


async def test_a_burst_of_kernel_events_makes_one_check() -> None:
    loop_dev = SYS_CLASS_BLOCK / "loop0" / "uevent"
    if not loop_dev.exists():
        pytest.fail(f"{loop_dev} missing: the host needs a loop device (modprobe loop)")
    calls: list[float] = []
    checked = asyncio.Event()

    async def changed() -> None:
        calls.append(asyncio.get_running_loop().time())
        checked.set()

    events = DeviceEvents(changed, quiet=0.3)
    assert events.open() is None
    closing = asyncio.Event()
    task = asyncio.create_task(events.run(closing))
    try:
        for _ in range(5):
            loop_dev.write_text("change")  # the kernel announces loop0 changed
            await asyncio.sleep(0.05)
        async with asyncio.timeout(10):
            await checked.wait()
        await asyncio.sleep(0.6)  # two quiet periods: no second check for the same burst
        assert events.events >= 5 and len(calls) == 1
    finally:
        closing.set()
        await task
    assert not events.listening  # the socket closed with the run

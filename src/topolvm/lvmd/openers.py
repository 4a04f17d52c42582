"""What holds a logical volume open (VolumeData's ``OpenState``): device-mapper's open count of
its device, the devices stacked on it (sysfs ``holders``), and the mount points of filesystems
on it.

The open count is the proof: a mounted filesystem, a process with the device open, a loop
device or another device-mapper device on it all count; mounts and holders only say who. The
count comes from ``dmsetup info`` and the mounts from ``/proc/self/mountinfo`` read by ``cat``,
both run the way LVM is (with nsenter, in the host's namespaces), so a containerised lvmd sees
the host's mounts, where the kubelet mounts volumes.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from topolvm.lvm.command import LvmRunner
from topolvm.lvm.errors import LvmError
from topolvm.lvmd.service import block_device
from topolvm.rpc import status

log = logging.getLogger(__name__)
SYS_BLOCK = Path("/sys/dev/block")


@dataclass(frozen=True)
class OpenState:
    active: bool
    open_count: int = 0
    holders: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)


def _unescape(text: str) -> str:
    r"""A mountinfo field: space, tab, newline and backslash are written as ``\ooo``."""
    out, i = [], 0
    while i < len(text):
        octal = text[i + 1 : i + 4]
        if text[i] == "\\" and len(octal) == 3 and all(c in "01234567" for c in octal):
            out.append(chr(int(octal, 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def mounts_of(mountinfo: str, major: int, minor: int) -> list[str]:
    """Mount points in ``mountinfo`` (``/proc/<pid>/mountinfo``) whose device is
    ``major:minor``, in the order listed; malformed lines are skipped."""
    wanted = f"{major}:{minor}"
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[2] == wanted:
            found.append(_unescape(fields[4]))
    return found


def open_count_of(output: str) -> int:
    """The open count ``dmsetup info -c --noheadings -o open`` printed."""
    text = output.strip()
    if not text.isdigit():
        raise status.Internal(f"dmsetup printed no open count: {output[:200]!r}")
    return int(text)


def holders_of(major: int, minor: int, sys_block: Path = SYS_BLOCK) -> list[str]:
    """Device-mapper names (else kernel names) of the devices stacked on ``major:minor``."""
    folder = sys_block / f"{major}:{minor}" / "holders"
    try:
        kernel_names = sorted(os.listdir(folder))
    except OSError:
        return []
    names = []
    for kernel in kernel_names:
        try:
            names.append((folder / kernel / "dm" / "name").read_text().strip() or kernel)
        except OSError:
            names.append(kernel)
    return names


async def open_state(runner: LvmRunner, path: str) -> OpenState:
    """Who holds the LV at ``path`` (``/dev/<vg>/<lv>``) open. An LV without a device node is
    inactive: nothing holds it."""
    dev = block_device(path)
    if dev is None:
        return OpenState(active=False)
    major, minor, _ = dev
    try:
        out = await runner.run_tool("dmsetup", "info", "-c", "--noheadings", "-o", "open",
                                    "-j", str(major), "-m", str(minor))  # fmt: skip
    except LvmError as e:
        if "not exist" in e.stderr or "No such device" in e.stderr:  # deactivated meanwhile
            return OpenState(active=False)
        raise status.Internal(f"dmsetup cannot tell the open count of {path}: {e}") from e
    count = open_count_of(out)
    if not count:
        return OpenState(active=True)
    mounts: list[str] = []
    try:
        mounts = mounts_of(await runner.run_tool("cat", "/proc/self/mountinfo"), major, minor)
    except LvmError as e:  # who holds it is for the message only; the count decides
        log.warning("cannot read the mount table", extra={"lv": path, "error": str(e)})
    return OpenState(True, count, holders_of(major, minor), mounts)

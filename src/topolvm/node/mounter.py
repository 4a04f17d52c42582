"""Filesystems and mounts for the CSI node service.

Every command runs without a shell, with ``LC_ALL=C``, a timeout, and its stderr kept in the
error. Mount state is read from ``/proc/self/mountinfo``, never guessed from the path.

Safety rules: a device is only formatted when ``blkid`` positively reports that it carries no
filesystem; an existing filesystem is never reformatted; growing a filesystem is always online
and in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from topolvm.constants import LEGACY_DEVICE_DIR
from topolvm.process import CommandTimedOut, run_captured

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 120.0
MKFS_TIMEOUT = 600.0
MOUNTINFO = "/proc/self/mountinfo"

SUPPORTED_FILESYSTEMS = ("ext4", "ext3", "xfs", "btrfs")
BLKID = "/sbin/blkid"


class MountError(Exception):
    """A filesystem or mount operation failed; the message says which and why."""


class CommandError(MountError):
    """A command exited non-zero (or timed out); ``stderr`` is what it printed."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str, note: str = ""):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        what = note or f"exit status {returncode}"
        detail = stderr.strip() or "(no output)"
        super().__init__(f"{' '.join(self.argv)}: {what}: {detail}")


class UnsupportedFilesystem(MountError):
    """The requested filesystem type is not one this driver formats, mounts and grows."""


def check_supported(fstype: str) -> None:
    if fstype not in SUPPORTED_FILESYSTEMS:
        raise UnsupportedFilesystem(
            f"unsupported filesystem type {fstype!r}; supported: {', '.join(SUPPORTED_FILESYSTEMS)}"
        )


_ENV = dict(os.environ, LC_ALL="C")


def _tool(path: str) -> str:
    """``path`` if it exists, else its bare name (found on PATH): distributions differ."""
    return path if os.path.exists(path) else os.path.basename(path)


async def run(*argv: str, timeout: float = DEFAULT_TIMEOUT) -> str:
    """Run ``argv`` (no shell); return stdout; raise :class:`CommandError` unless it exits 0."""
    return (await run_status(*argv, timeout=timeout))[1]


async def run_status(
    *argv: str, timeout: float = DEFAULT_TIMEOUT, ok: Sequence[int] = (0,)
) -> tuple[int, str, str]:
    """Run ``argv``; return (exit status, stdout, stderr) when the status is in ``ok``."""
    try:
        rc, out, err = await run_captured(argv, timeout, _ENV)
    except OSError as e:
        raise CommandError(argv, None, str(e), "cannot start") from e
    except CommandTimedOut as e:
        raise CommandError(
            argv,
            None,
            e.stderr.decode(errors="replace"),
            f"timed out after {timeout}s {e.reason}",
        ) from None
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    if rc not in ok:
        raise CommandError(argv, rc, stderr)
    log.debug("command ok", extra={"argv": list(argv), "rc": rc})
    return rc, stdout, stderr


# -- /proc/self/mountinfo ------------------------------------------------------------------


_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape(field: str) -> str:
    """Undo the kernel's octal escapes (``\\040`` for a space, ``\\134`` for a backslash...)."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class MountEntry:
    mount_id: int
    parent_id: int
    major: int
    minor: int
    root: str
    mount_point: str
    options: tuple[str, ...]
    fstype: str
    source: str
    super_options: tuple[str, ...]

    @property
    def readonly(self) -> bool:
        return "ro" in self.options


def parse_mountinfo(text: str) -> list[MountEntry]:
    entries = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
            major, minor = fields[2].split(":")
            entries.append(
                MountEntry(
                    mount_id=int(fields[0]),
                    parent_id=int(fields[1]),
                    major=int(major),
                    minor=int(minor),
                    root=unescape(fields[3]),
                    mount_point=unescape(fields[4]),
                    options=tuple(fields[5].split(",")),
                    fstype=unescape(fields[sep + 1]),
                    source=unescape(fields[sep + 2]),
                    super_options=tuple(fields[sep + 3].split(","))
                    if sep + 3 < len(fields)
                    else (),
                )
            )
        except (ValueError, IndexError):
            log.warning("unparsable mountinfo line", extra={"line": line})
    return entries


def read_mountinfo(path: str = MOUNTINFO) -> list[MountEntry]:
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return parse_mountinfo(f.read())


def _canonical(path: str) -> set[str]:
    """The spellings under which the kernel may list ``path`` as a mount point."""
    absolute = os.path.abspath(path)
    names = {absolute}
    with contextlib.suppress(OSError):
        names.add(os.path.realpath(absolute, strict=False))
    return names


def mounts_at(path: str, entries: list[MountEntry] | None = None) -> list[MountEntry]:
    """Mounts whose mount point is ``path``, bottom first (the last one is visible)."""
    names = _canonical(path)
    entries = read_mountinfo() if entries is None else entries
    return [e for e in entries if e.mount_point in names]


def is_mount_point(path: str) -> bool:
    return bool(mounts_at(path))


def device_number(device: str) -> int:
    """``st_rdev`` of a block device (following symlinks); :class:`MountError` otherwise."""
    try:
        st = os.stat(device)
    except OSError as e:
        raise MountError(f"cannot stat device {device}: {e.strerror}") from e
    if not stat.S_ISBLK(st.st_mode):
        raise MountError(f"{device} is not a block device")
    return st.st_rdev


def mount_uses_device(entry: MountEntry, device: str) -> bool:
    """Whether ``entry`` mounts the filesystem on (or a bind of) block device ``device``."""
    try:
        rdev = device_number(device)
    except MountError:
        return False
    if (entry.major, entry.minor) == (os.major(rdev), os.minor(rdev)):
        return True  # ext4, xfs: the mount's device number is the block device
    # btrfs uses an anonymous device number: compare the source device instead.
    source = entry.source
    if source.startswith("/"):
        with contextlib.suppress(OSError):
            st = os.stat(source)
            return stat.S_ISBLK(st.st_mode) and st.st_rdev == rdev
    return False


def bind_target_device(path: str) -> int | None:
    """``st_rdev`` of the block device visible at ``path`` (a bind-mounted device node)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_rdev if stat.S_ISBLK(st.st_mode) else None


# -- block devices ---------------------------------------------------------------------------


def device_size(device: str) -> int:
    """Size in bytes of a block device (seek to its end)."""
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def _fsync_device(device: str) -> None:
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def detect_filesystem(device: str) -> str | None:
    """The filesystem type on ``device``, or None when blkid finds no signature at all.

    Anything blkid recognises that is not a filesystem (a partition table, RAID member...)
    comes back as a descriptive non-empty string so callers never format over it.
    """
    device_number(device)  # blkid also answers "nothing found" for a missing device
    await asyncio.to_thread(_fsync_device, device)
    rc, out, _ = await run_status(
        _tool(BLKID), "-p", "-u", "filesystem", "-o", "export", device, ok=(0, 2)
    )
    if rc == 2:
        return None
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if values.get("TYPE"):
        return values["TYPE"]
    if values.get("PTTYPE"):
        return f"partition table ({values['PTTYPE']})"
    return "unknown data"


async def wipefs(device: str) -> None:
    await run("wipefs", "-a", device)


async def mkfs(device: str, fstype: str) -> None:
    """Create a filesystem. Callers must have checked that ``device`` holds none."""
    check_supported(fstype)
    args = ["-F", "-m0"] if fstype in ("ext4", "ext3") else []
    await run(f"mkfs.{fstype}", *args, device, timeout=MKFS_TIMEOUT)


# -- mounting --------------------------------------------------------------------------------


async def mount(source: str, target: str, fstype: str, options: Sequence[str]) -> None:
    argv = ["mount", "-t", fstype]
    if options:
        argv += ["-o", ",".join(options)]
    await run(*argv, source, target)


async def bind_mount(source: str, target: str, readonly: bool) -> None:
    await run("mount", "--bind", source, target)
    if readonly:
        try:
            await run("mount", "-o", "remount,bind,ro", target)
        except CommandError:
            with contextlib.suppress(CommandError):
                await run("umount", target)
            raise


async def umount(target: str) -> None:
    await run("umount", target)


# -- growing ---------------------------------------------------------------------------------


def _field(text: str, pattern: str) -> int:
    m = re.search(pattern, text, re.MULTILINE)
    if m is None:
        raise MountError(f"cannot find {pattern!r} in:\n{text[:500]}")
    return int(m.group(1))


async def filesystem_size(device: str, mount_point: str, fstype: str) -> tuple[int, int]:
    """(size in bytes, block size) of the filesystem on ``device`` mounted at ``mount_point``."""
    if fstype in ("ext4", "ext3", "ext2"):
        out = await run("dumpe2fs", "-h", device)
        block = _field(out, r"^Block size:\s+(\d+)")
        return _field(out, r"^Block count:\s+(\d+)") * block, block
    if fstype == "xfs":
        out = await run("xfs_io", "-c", "statfs", mount_point)
        block = _field(out, r"^geom\.bsize = (\d+)")
        return _field(out, r"^geom\.datablocks = (\d+)") * block, block
    if fstype == "btrfs":
        out = await run("btrfs", "inspect-internal", "dump-super", "-f", device)
        block = _field(out, r"^sectorsize\s+(\d+)")
        return _field(out, r"^dev_item\.total_bytes\s+(\d+)"), block
    raise UnsupportedFilesystem(f"cannot measure a {fstype} filesystem")


async def needs_resize(device: str, mount_point: str, fstype: str) -> bool:
    """Whether the device is larger than its filesystem by more than one block."""
    fs_size, block = await filesystem_size(device, mount_point, fstype)
    return await asyncio.to_thread(device_size, device) > fs_size + block


async def grow(device: str, mount_point: str, fstype: str) -> None:
    """Grow the mounted filesystem to fill its device (online)."""
    if fstype in ("ext4", "ext3", "ext2"):
        await run("resize2fs", device, timeout=MKFS_TIMEOUT)
    elif fstype == "xfs":
        await run("xfs_growfs", "-d", mount_point, timeout=MKFS_TIMEOUT)
    elif fstype == "btrfs":
        await run("btrfs", "filesystem", "resize", "max", mount_point, timeout=MKFS_TIMEOUT)
    else:
        raise UnsupportedFilesystem(f"cannot grow a {fstype} filesystem")


# -- stats -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FsStats:
    total_bytes: int
    used_bytes: int
    available_bytes: int
    total_inodes: int
    used_inodes: int
    free_inodes: int


def fs_stats(path: str) -> FsStats:
    st = os.statvfs(path)
    return FsStats(
        total_bytes=st.f_blocks * st.f_frsize,
        used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize,
        available_bytes=st.f_bavail * st.f_frsize,
        total_inodes=st.f_files,
        used_inodes=st.f_files - st.f_ffree,
        free_inodes=st.f_ffree,
    )


def create_file(path: str) -> None:
    """Create ``path`` as an empty regular file (kept if it exists), mode 0755."""
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o755)
    os.close(fd)
    os.chmod(path, 0o755)


def remove_target(path: str) -> None:
    """Remove an unmounted target: rmdir (never recursive: leftovers are kept) or unlink."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        os.rmdir(path)
    else:
        os.unlink(path)


def remove_legacy_device(volume_id: str) -> None:
    """Remove ``/dev/topolvm/<volume_id>`` left by old releases (a device node, never a dir)."""
    if "/" in volume_id or volume_id in (".", ".."):
        return
    path = os.path.join(LEGACY_DEVICE_DIR, volume_id)
    with contextlib.suppress(OSError):
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(path)

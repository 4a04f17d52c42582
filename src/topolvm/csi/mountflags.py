"""Which mount flags (a StorageClass's ``mountOptions``, passed by csi-provisioner to
CreateVolume and by the kubelet to NodePublishVolume) may reach ``mount -o``, and which paths may
be a target; pure. Anyone who may create a StorageClass chooses the flags, and topolvm-node runs
mount as root, so a flag may only ask the kernel for a filesystem option: nothing that makes
mount(8) itself act (run a helper, create or chown folders, set up a loop device) or turns the
mount into another operation (remount, bind, move, propagation changes)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from topolvm.rpc import status

# mount(8) options that are not filesystem options but change what the command does
_OPERATIONS = frozenset({
    "remount", "bind", "rbind", "move", "loop", "shared", "rshared", "slave", "rslave",
    "private", "rprivate", "unbindable", "runbindable",
})  # fmt: skip
_HELPER_PREFIXES = ("x-", "helper=", "loop=", "offset=", "sizelimit=", "encryption=")
_SAFE = re.compile(r'[A-Za-z0-9_.:=/+@%-]+|[A-Za-z0-9_.-]+="[^"\x00-\x1f]*"')


def split_options(flag: str) -> list[str]:
    """One flag as mount(8) reads it: several options when it holds commas outside quotes."""
    parts, current, quoted = [], "", False
    for ch in flag:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return parts


def check_mount_flags(flags: Iterable[str]) -> None:
    """INVALID_ARGUMENT naming the first flag that is not a plain filesystem option."""
    for flag in flags:
        for option in split_options(str(flag)):
            if not option:
                continue  # empty flags are dropped, as before
            if not _SAFE.fullmatch(option):
                raise status.InvalidArgument(
                    f"mount option {flag!r}: only letters, digits and _.:=/+@%- are allowed "
                    f"(a quoted value after = may hold more)"
                )
            lowered = option.lower()
            if lowered in _OPERATIONS or lowered.startswith(_HELPER_PREFIXES):
                raise status.InvalidArgument(
                    f"mount option {flag!r} is not a filesystem option: it would make mount "
                    f"do more than mount the volume, so it is refused"
                )


def check_path(path: str, what: str) -> None:
    """A target or volume path the kubelet would send: absolute, no '..' component (it would
    point outside the folder the CO made for the volume), no NUL (no system call takes it).
    Spaces, tabs and newlines are legal in a path; the mount table escapes them."""
    if not path.startswith("/"):
        raise status.InvalidArgument(f"{what} must be an absolute path: {path}")
    if "\x00" in path:
        raise status.InvalidArgument(f"{what} must not contain a NUL character: {path!r}")
    if ".." in path.split("/"):
        raise status.InvalidArgument(f"{what} must not contain '..': {path}")

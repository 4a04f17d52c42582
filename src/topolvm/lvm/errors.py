"""Errors raised by the LVM command layer."""

from __future__ import annotations

import re
from collections.abc import Sequence

# LVM exits with 5 (ECMD_FAILED) and says one of these when the object is missing.
_NOT_FOUND = re.compile(r'Volume group "(.*?)" not found|Failed to find logical volume "(.*?)"')
_NO_SPACE = re.compile(
    r"insufficient free space|Insufficient free space|not enough free space|"
    r"Insufficient suitable allocatable extents"
)
# A PV of the VG cannot be read; LVM refuses to change the VG until it is back. LVM also warns
# of a missing PV ("WARNING: Couldn't find device with uuid ...") when a command fails for
# another reason: only a line that is not a warning counts.
_MISSING_PV = re.compile(
    r"Couldn't find device with uuid|is missing PV|PVs are missing|"
    r"Refusing activation of partial LV"
)
MISSING_PV_HINT = (
    "a physical volume of the volume group is missing: bring its device back; if LVM still "
    "misses it afterwards, run `pvscan --cache` on the node (LVM's device hints were written "
    "while it was unreadable); a PV gone for good: `vgreduce --removemissing` (docs/lvmd.md)"
)
# A component of a thin pool (its _tmeta or _tdata) active on its own blocks the pool's
# activation; an LVM command killed while it held one leaves it so.
_ACTIVE_COMPONENT = re.compile(r"is prohibited while logical volume (\S+) is active")
_COMPONENT_ACTIVE = re.compile(
    r"is prohibited while logical volume \S+ is active|with active component"
)
# A thin pool whose kernel transaction id lags LVM's metadata: an LVM command that changed the
# pool was killed between the two (a container kill, a power cut). LVM then creates no thin LV in
# it ("Cannot create new thin volume") and each change of the pool fails.
_POOL_TRANSACTION = re.compile(
    r"Thin pool (\S+) has unexpected transaction id|"
    r"Thin pool (\S+)(?: \(\d+:\d+\))? transaction_id is \d+, while"
)
POOL_TRANSACTION_HINT = (
    "the thin pool's transaction id in the kernel differs from LVM's metadata: an LVM command "
    "that changed the pool was killed half-way; LVM changes nothing in the pool until the ids "
    "agree (docs/lvmd.md#troubleshooting: a thin pool's transaction id)"
)
_EXISTS = re.compile(r'Logical [Vv]olume "[^"]*" already exists in volume group')
_STDERR_LIMIT = 4000


class LvmError(Exception):
    """A command failed (non-zero exit, timeout, or unreadable output)."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str, reason: str = ""):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        if len(self.stderr) > _STDERR_LIMIT:
            # LVM's warnings come first and the reason it failed last: keep both ends
            half = _STDERR_LIMIT // 2
            self.stderr = f"{self.stderr[:half]}...(truncated)...{self.stderr[-half:]}"
        self.reason = reason or f"exit status {returncode}"
        # before LVM's words, which may be long: an event's message may be cut at its end
        found = ((MISSING_PV_HINT, self.missing_pv),
                 (POOL_TRANSACTION_HINT, self.pool_transaction_lags))  # fmt: skip
        hint = "".join(f" ({h})" for h, on in found if on)
        super().__init__(f"{' '.join(self.argv)}: {self.reason}{hint}: {self.stderr}")

    @property
    def not_found(self) -> bool:
        """True when LVM reported a missing VG or LV (exit code 5 and the known message)."""
        return self.returncode == 5 and _NOT_FOUND.search(self.stderr) is not None

    @property
    def missing_pv(self) -> bool:
        """True when LVM refused the command because a PV of the volume group is missing."""
        return any(
            _MISSING_PV.search(line) is not None
            for line in self.stderr.splitlines()
            if not line.lstrip().startswith("WARNING:")
        )

    @property
    def pool_transaction_lags(self) -> bool:
        """True when LVM refused to change a thin pool whose kernel transaction id is not the
        one its metadata expects (behind it, after a kill half-way)."""
        return _POOL_TRANSACTION.search(self.stderr) is not None

    @property
    def already_exists(self) -> bool:
        """True when LVM refused to create an LV whose name is taken in the VG."""
        return _EXISTS.search(self.stderr) is not None

    @property
    def component_active(self) -> bool:
        """True when a pool component active on its own blocked the command."""
        return _COMPONENT_ACTIVE.search(self.stderr) is not None

    @property
    def active_component(self) -> str | None:
        """``vg/lv`` of that component, when LVM names it."""
        m = _ACTIVE_COMPONENT.search(self.stderr)
        return m.group(1) if m else None

    @property
    def no_space(self) -> bool:
        """True when LVM refused an allocation for lack of free extents."""
        return _NO_SPACE.search(self.stderr) is not None


class LvmTimeout(LvmError):
    """A command did not finish within its timeout and was killed."""


class InvalidInput(ValueError):
    """A value that must not reach an LVM command line (name, tag, size)."""


class ReportError(ValueError):
    """LVM printed a report we cannot parse."""

"""How lvmd learns of LVM changes made outside it without polling LVM: the kernel's device events.

Every change to a logical volume's data path (create, remove, resize, activate, rename) and every
disk that comes or goes is a block device appearing, changing or leaving, and the kernel
announces each one as a *uevent* on the kobject netlink socket (what udevd listens to; no udevd is
needed). lvmd listens there, and after a burst of block events has gone quiet it compares the
node's block devices (a *fingerprint* read from sysfs: name, size and device-mapper name of
each) with the one taken at its last report or its own last change. Only a difference costs an
``lvm fullreport`` (:meth:`topolvm.lvmd.state.LvmState.check_devices`): lvmd's own changes leave
the fingerprint it recorded, so they never trigger one.

What no block device shows (metadata-only changes: ``vgextend`` with a disk already present,
``lvchange --addtag``) is seen at the periodic safety-net report (``--refresh-interval``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

NETLINK_KOBJECT_UEVENT = 15  # linux/netlink.h; Python's socket module does not name it
KERNEL_GROUP = 1  # the multicast group of the kernel's own events (udevd re-sends on group 2)
RECEIVE_BUFFER = 1 << 20
SYS_CLASS_BLOCK = Path("/sys/class/block")

# (kernel name, size in 512-byte sectors, device-mapper name or "") of each block device
Fingerprint = frozenset[tuple[str, str, str]]


@dataclass(frozen=True)
class Uevent:
    action: str
    devpath: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def subsystem(self) -> str:
        return self.env.get("SUBSYSTEM", "")


def parse_uevent(data: bytes) -> Uevent | None:
    """A kernel uevent: ``action@devpath`` then ``KEY=value`` fields, NUL-separated. None for
    anything else (udevd's own messages start with ``libudev``, and a truncated or foreign
    datagram has no ``@`` header)."""
    fields = data.split(b"\0")
    head = fields[0].decode(errors="replace")
    action, at, devpath = head.partition("@")
    if not at or not action or not devpath.startswith("/"):
        return None
    env: dict[str, str] = {}
    for raw in fields[1:]:
        key, eq, value = raw.decode(errors="replace").partition("=")
        if eq and key:
            env[key] = value
    return Uevent(env.get("ACTION", action), env.get("DEVPATH", devpath), env)


def concerns_lvm(event: Uevent) -> bool:
    """Block devices: LVs are device-mapper block devices, PVs are block devices."""
    return event.subsystem == "block"


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:  # gone between the listing and the read, or not a device-mapper device
        return ""


def fingerprint(root: Path = SYS_CLASS_BLOCK) -> Fingerprint:
    """The node's block devices as sysfs shows them: a few dozen small reads, no command."""
    try:
        names = [p.name for p in root.iterdir()]
    except OSError as e:
        log.warning("cannot list block devices", extra={"path": str(root), "error": str(e)})
        return frozenset()
    return frozenset((n, _read(root / n / "size"), _read(root / n / "dm" / "name")) for n in names)


class DeviceEvents:
    """The kernel's block-device events, coalesced: ``on_change`` runs once a burst has been quiet
    for ``quiet`` seconds (or after ``limit`` seconds of continuous events)."""

    def __init__(
        self,
        on_change: Callable[[], Awaitable[object]],
        quiet: float = 0.5,
        limit: float = 5.0,
        group: int = KERNEL_GROUP,
    ):
        self.on_change = on_change
        self.quiet = quiet
        self.limit = limit
        self.group = group
        self.events = 0  # block events received, for diagnostics and tests
        self._sock: socket.socket | None = None
        self._pending = asyncio.Event()

    def open(self) -> str | None:
        """Subscribe to the kernel's events; on failure, the reason (lvmd then relies on its
        periodic report alone)."""
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT)
        except (OSError, AttributeError) as e:
            return f"no kobject uevent socket: {e}"
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
            sock.bind((0, self.group))
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            return f"cannot subscribe to kernel uevents: {e}"
        self._sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)
        return None

    @property
    def listening(self) -> bool:
        return self._sock is not None

    def close(self) -> None:
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None

    def _readable(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(65536)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno == errno.ENOBUFS:  # events were dropped: assume one was ours
                    log.warning("kernel uevents overflowed the socket buffer; re-checking")
                    self._mark()
                    continue
                log.warning("reading kernel uevents failed", extra={"error": str(e)})
                return
            event = parse_uevent(data)
            if event is not None and concerns_lvm(event):
                self.events += 1
                self._mark()

    def _mark(self) -> None:
        self._pending.set()

    async def _quiet(self) -> None:
        """Until no event came for :attr:`quiet` seconds, or for :attr:`limit` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limit
        while (left := deadline - loop.time()) > 0:
            self._pending.clear()
            try:
                async with asyncio.timeout(min(self.quiet, left)):
                    await self._pending.wait()
            except TimeoutError:
                return

    async def run(self, closing: asyncio.Event) -> None:
        """Until ``closing``: wait for events, let the burst settle, call ``on_change``."""
        stop = asyncio.ensure_future(closing.wait())
        try:
            while not closing.is_set():
                wake = asyncio.ensure_future(self._pending.wait())
                await asyncio.wait({stop, wake}, return_when=asyncio.FIRST_COMPLETED)
                wake.cancel()
                if closing.is_set():
                    return
                await self._quiet()
                self._pending.clear()
                try:
                    await self.on_change()
                except Exception:
                    log.exception("re-reading LVM after a device event failed")
        finally:
            stop.cancel()
            self.close()

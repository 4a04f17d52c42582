"""Boot User-Mode Linux with the host filesystem as root and run one command against real LVM.

The kernel is the test bed's own (devtools.umlkernel: device-mapper, filesystems and networking
built in). The guest sees the host's files (hostfs), gets file-backed disks (``/dev/ubdb`` ...)
and uses an LVM config without udev. The command's output goes to the guest console, which is
this process's stdout (or a file); its exit status comes back through a file on the shared
filesystem. A guest whose kernel panics is reported at once, with the panic's lines.

    python -m devtools.uml kernel          # the kernel's path (built first if needed)
    python -m devtools.uml COMMAND [ARG...] # run a command inside a guest (for debugging)
"""

from __future__ import annotations

import contextlib
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from devtools import umlkernel
from devtools.buildcache import BuildError
from devtools.testbed.process import die_with_parent, stop_group
from devtools.umlnudge import TimerNudge

REPO = Path(__file__).resolve().parent.parent
DISK_LETTERS = "bcdefgh"  # ubda is left unused

LVM_CONF = """\
activation { udev_sync = 0 udev_rules = 0 monitoring = 0 }
devices {
  obtain_device_list_from_udev = 0
  use_devicesfile = 0
  filter = [ "a|^/dev/ubd|", "r|.*|" ]
}
backup { backup = 0 archive = 0 }
global { locking_dir = "/run/lock/lvm" }
log { verbose = 0 }
"""

INIT = """\
#!/bin/sh
# PID 1 inside User-Mode Linux.
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=0755 tmpfs /run
ip link set lo up
{network}mkdir -p /run/lock/lvm /run/lvm /run/tmp
chmod 1777 /run/tmp
mkdir -p /run/lvm-conf
cp {lvm_conf} /run/lvm-conf/lvm.conf
export LVM_SYSTEM_DIR=/run/lvm-conf
{env}
cd {cwd}
{command} {redirect}
echo $? > {rc_file}
sync
poweroff -f
"""


NET_SETUP = """\
ip link set vec0 name eth0
ip link set eth0 up
ip addr add {address} dev eth0
ip route add 10.199.0.0/16 via {gateway} dev eth0
"""
"""The guest's link; the route lets it reach the other guests' links through the host (a
node's topolvm-node copies volumes from another's transfer port)."""


FAST_PREFIX = "topolvm-uml-"  # disk images and memory file, in /dev/shm
DISK_DIR_ENV = "TOPOLVM_UML_DISK_DIR"  # where disk_folder puts disk images instead
RUN_PREFIX = "run-"  # init script and LVM config, in .uml/


def _sweep_stale(folder: Path, prefix: str) -> None:
    """Remove the folders a killed process left (its pid, in the folder's name, is gone): the
    cleanup that a SIGKILL never let run."""
    for entry in folder.glob(f"{prefix}*-*"):
        if owner_gone(entry.name, prefix):
            shutil.rmtree(entry, ignore_errors=True)


def owner_gone(name: str, prefix: str) -> bool:
    """Whether the process a UML folder's name carries (``<prefix><pid>-...``) has ended."""
    pid = name[len(prefix) :].split("-", 1)[0]
    return pid.isdigit() and not Path(f"/proc/{pid}").exists()


@contextlib.contextmanager
def disk_folder() -> Iterator[Path]:
    """A folder for disk images that outlive one boot (see :func:`running`), in memory when
    /dev/shm exists, or under $TOPOLVM_UML_DISK_DIR (``make demo``: its guests write more than
    memory holds); removed on exit, or by the next run if this process is killed."""
    fast = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
    if chosen := os.environ.get(DISK_DIR_ENV):
        fast = Path(chosen)
        fast.mkdir(parents=True, exist_ok=True)
        _sweep_stale(fast, FAST_PREFIX)
    with tempfile.TemporaryDirectory(prefix=f"{FAST_PREFIX}{os.getpid()}-", dir=fast) as tmp:
        yield Path(tmp)


class UmlError(RuntimeError):
    """UML could not be booted or did not report an exit status."""

    console: str = ""  # what the guest printed, when it got that far


class UmlStalled(UmlError):
    """The caller's ``stalled()`` said the guest stopped making progress; UML was killed."""


@dataclass
class UmlResult:
    returncode: int
    console: str  # kernel + command output when captured


def available() -> str | None:
    """None if UML can run here (its kernel built, or buildable now), else the reason."""
    try:
        umlkernel.kernel()
    except BuildError as exc:
        return str(exc)
    return None


# The line :func:`running` writes to the console file before each boot.
BOOT_MARKER = "--- devtools.uml: booting "
# What the kernel prints when it gives up: on the console even with loglevel=1 (KERN_EMERG).
PANIC_MARKERS = ("Kernel panic - not syncing", "Attempted to kill init", "Segfault with no mm")


def panic_lines(console: str) -> str | None:
    """The lines around the first panic in ``console``, or None if the kernel did not panic."""
    lines = console.splitlines()
    for i, line in enumerate(lines):
        if any(marker in line for marker in PANIC_MARKERS):
            return "\n".join(lines[max(0, i - 15) : i + 15])
    return None


def wait_ready(
    proc: subprocess.Popen[bytes], console: Path, ready: Callable[[], bool], timeout: float
) -> None:
    """Wait until ``ready()`` for a guest started by :func:`running`. A kernel panic (seen on
    ``console``) or an exited UML raises :class:`UmlError` at once, with the panic's lines;
    ``timeout`` seconds without ``ready()`` raise it too."""
    deadline = time.monotonic() + timeout
    while not ready():
        code = proc.poll()  # first: an exited UML has written all it will to the console
        try:  # this boot's lines only (the file may hold earlier boots')
            text = console.read_text(errors="replace").rsplit(BOOT_MARKER, 1)[-1]
        except OSError:
            text = ""
        if (panic := panic_lines(text)) is not None:
            raise UmlError(f"the guest's kernel panicked:\n{panic}")
        if code is not None:
            raise UmlError(f"UML exited ({code})")
        if time.monotonic() > deadline:
            raise UmlError(f"no answer in {timeout}s")
        time.sleep(0.3)


def _start_uml() -> None:
    """``preexec_fn`` of UML: it dies with this process, and a panic (UML then aborts) writes
    no core file of the guest's memory."""
    die_with_parent()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def disk_devices(count: int) -> list[str]:
    return [f"/dev/ubd{DISK_LETTERS[i]}" for i in range(count)]


Disk = int | Path
"""A guest's disk: the size of a fresh sparse file, or a file it boots on read-only through a
copy-on-write layer of its own (UML's ``ubdX=cow,backing``: what it writes stays in the layer,
so many guests share one backing file; the file must not change while any layer uses it)."""


@dataclass
class Network:
    """A TAP link: ``tap`` exists in the caller's network namespace; the guest's eth0 gets
    ``address`` (CIDR) and reaches the host at ``gateway``."""

    tap: str
    address: str
    gateway: str


@dataclass
class _Boot:
    args: list[str]
    base: Path
    log_file: Path
    rc_file: Path
    host_env: dict[str, str]
    kernel: Path


@contextlib.contextmanager
def _prepared(
    command: Sequence[str],
    *,
    disks: Sequence[Disk],
    mem_mb: int,
    env: Mapping[str, str] | None,
    cwd: str | os.PathLike[str] | None,
    capture: bool,
    workdir: str | os.PathLike[str] | None,
    network: Network | None = None,
    images: Path | None = None,
) -> Iterator[_Boot]:
    """Disk images, init script and kernel arguments; everything is removed on exit, but
    the disk images in ``images`` (made there if missing, else reused as they are)."""
    try:
        kernel = umlkernel.kernel()
    except BuildError as exc:
        raise UmlError(str(exc)) from exc
    if len(disks) > len(DISK_LETTERS):
        raise UmlError(f"at most {len(DISK_LETTERS)} disks")
    # Files the guest must see live on the host disk: the guest mounts its own /run and /dev.
    # (It leaves /tmp alone, since the repo may live there; TMPDIR points at /run/tmp.)
    shared_root = Path(workdir) if workdir else REPO / ".uml"
    shared_root.mkdir(parents=True, exist_ok=True)
    fast = "/dev/shm" if os.path.isdir("/dev/shm") else None  # memory + disk images (host side)
    _sweep_stale(Path(fast or tempfile.gettempdir()), FAST_PREFIX)
    _sweep_stale(shared_root, RUN_PREFIX)
    with (
        tempfile.TemporaryDirectory(prefix=f"{RUN_PREFIX}{os.getpid()}-", dir=shared_root) as tmp,
        tempfile.TemporaryDirectory(prefix=f"{FAST_PREFIX}{os.getpid()}-", dir=fast) as fast_tmp,
    ):
        base = Path(tmp)
        # In a PID namespace of its own, UML is its init: when it dies, however, the kernel
        # kills every process in it, the host processes that run the guest's programs too.
        # --kill-child makes it die with `unshare`, which dies with its parent (die_with_parent).
        args = [
            "unshare",
            "--pid",
            "--fork",
            "--kill-child=SIGKILL",
            str(kernel),
            f"mem={mem_mb}M",
            "root=/dev/root",
            "rootfstype=hostfs",
            "rw",
            "quiet",
            "loglevel=1",
        ]
        for i, disk in enumerate(disks):
            if isinstance(disk, Path):  # UML's copy-on-write layer (made if missing) over it
                cow = (images or Path(fast_tmp)) / f"disk{i}.cow"
                args.append(f"ubd{DISK_LETTERS[i]}={cow},{disk}")
                continue
            img = (images or Path(fast_tmp)) / f"disk{i}.img"
            if not img.exists():
                with img.open("wb") as f:
                    f.truncate(disk)
            args.append(f"ubd{DISK_LETTERS[i]}={img}")
        (base / "lvm.conf").write_text(LVM_CONF)
        guest_env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "TMPDIR": "/run/tmp",
            "TOPOLVM_IN_UML": "1",
            "TOPOLVM_UML_KERNEL": str(kernel),
            "TOPOLVM_UML_DISKS": " ".join(disk_devices(len(disks))),
            **(env or {}),
        }
        net = ""
        if network is not None:
            # the vector driver on the TAP, with offloads (TSO, checksums): 1.3 GiB/s of TCP
            # between two guests where the legacy tuntap driver (1500-byte packets, one host
            # system call each) gave 0.35 (docs/testing.md, "The guests' network")
            args.append(f"vec0:transport=tap,ifname={network.tap},depth=128,gro=1")
            net = NET_SETUP.format(address=network.address, gateway=network.gateway)
        log_file = base / "console.log"
        rc_file = base / "rc"
        init = base / "init.sh"
        init.write_text(
            INIT.format(
                lvm_conf=shlex.quote(str(base / "lvm.conf")),
                network=net,
                env="\n".join(f"export {k}={shlex.quote(v)}" for k, v in guest_env.items()),
                cwd=shlex.quote(str(Path(cwd or os.getcwd()).resolve())),
                command=" ".join(shlex.quote(c) for c in command),
                redirect=f"> {shlex.quote(str(log_file))} 2>&1" if capture else "",
                rc_file=shlex.quote(str(rc_file)),
            )
        )
        init.chmod(0o755)
        args += [f"init={init}", "con=null", "con0=fd:0,fd:1"]
        # UML maps its memory from a file in TMPDIR; keep that in the private temp dir.
        yield _Boot(args, base, log_file, rc_file, dict(os.environ, TMPDIR=fast_tmp), kernel)


def run(
    command: Sequence[str],
    *,
    disks: Sequence[Disk] = (16 << 30,) * 4,
    mem_mb: int = 2048,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float = 1800,
    capture: bool = False,
    workdir: str | os.PathLike[str] | None = None,
    network: Network | None = None,
    stalled: Callable[[], bool] | None = None,
    images: Path | None = None,
) -> UmlResult:
    """Boot UML, run ``command`` as root inside it, power off; return its exit status.
    ``stalled()`` is polled every second: when it says so, UML is killed (:class:`UmlStalled`).

    ``disks`` are sizes in bytes of fresh sparse files attached as /dev/ubdb, /dev/ubdc, ...
    (kept in ``images`` if given), or files to boot on read-only through a copy-on-write layer.
    The guest environment is ``env`` plus PATH, HOME, LANG, TOPOLVM_UML_DISKS.
    """
    with _prepared(
        command, disks=disks, mem_mb=mem_mb, env=env, cwd=cwd, capture=capture,
        workdir=workdir, network=network, images=images,
    ) as boot:  # fmt: skip
        proc = subprocess.Popen(
            boot.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.STDOUT if capture else None,
            env=boot.host_env,
            start_new_session=True,
            preexec_fn=_start_uml,  # noqa: PLW1509 (two system calls, no locks)
        )
        out = bytearray()
        reader = None
        if capture:
            assert proc.stdout is not None
            stream = proc.stdout

            def read() -> None:  # as it comes: a panic is seen while UML still runs
                for chunk in iter(lambda: os.read(stream.fileno(), 1 << 16), b""):
                    out.extend(chunk)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
        deadline = time.monotonic() + timeout
        failure: UmlError | None = None
        try:
            with TimerNudge(proc.pid):
                while proc.poll() is None:
                    # The kernel's console (the command's output, when captured, is in log_file)
                    if (panic := panic_lines(out.decode(errors="replace"))) is not None:
                        failure = UmlError(f"the guest's kernel panicked:\n{panic}")
                        break
                    if time.monotonic() > deadline:
                        failure = UmlError(f"UML did not finish within {timeout}s")
                        break
                    if stalled is not None and stalled():
                        failure = UmlStalled("the guest made no progress; UML was killed")
                        break
                    time.sleep(1)
        finally:
            stop_group(proc, grace=0)
            if reader is not None:
                reader.join(10)
            if proc.stdout is not None:
                proc.stdout.close()
        if failure is not None:
            output = boot.log_file.read_text(errors="replace") if boot.log_file.exists() else ""
            failure.console = bytes(out).decode(errors="replace") + output
            raise failure
        console = bytes(out).decode(errors="replace")
        if boot.log_file.exists():
            console += boot.log_file.read_text(errors="replace")
        if not boot.rc_file.exists():
            if (panic := panic_lines(console)) is not None:
                detail = f"the guest's kernel panicked:\n{panic}"
            else:
                detail = "console:\n" + console[-4000:]
            raise UmlError(f"UML exited ({proc.returncode}) without the command's status; {detail}")
        return UmlResult(int(boot.rc_file.read_text().strip() or 1), console)


@contextlib.contextmanager
def running(
    command: Sequence[str],
    *,
    console: Path,
    disks: Sequence[Disk] = (16 << 30,) * 2,
    mem_mb: int = 1024,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    network: Network | None = None,
    images: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Boot UML running ``command`` in the background (kernel and command output go to
    ``console``); on exit the guest is killed and its memory file is removed, and its disks
    unless they live in ``images`` (the caller's folder: a guest booted again on them finds
    what the last one left, as after a power loss)."""
    with _prepared(
        command, disks=disks, mem_mb=mem_mb, env=env, cwd=cwd, capture=False,
        workdir=None, network=network, images=images,
    ) as boot:  # fmt: skip
        with console.open("ab") as out:
            out.write(f"{BOOT_MARKER}{boot.kernel} ---\n".encode())
            out.flush()
            proc = subprocess.Popen(
                boot.args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=boot.host_env,
                start_new_session=True,
                preexec_fn=_start_uml,  # noqa: PLW1509 (two system calls, no locks)
            )
        try:
            with TimerNudge(proc.pid):
                yield proc
        finally:
            stop_group(proc, grace=5)  # and UML's helper processes, which share its group


def main() -> int:
    """``python -m devtools.uml kernel``: the kernel's path, built first if needed;
    ``python -m devtools.uml CMD...``: run a command inside UML (for debugging)."""
    if len(sys.argv) < 2:
        print("usage: python -m devtools.uml kernel | COMMAND [ARG...]", file=sys.stderr)
        return 2
    try:
        if sys.argv[1:] == ["kernel"]:
            print(umlkernel.kernel())
            return 0
        return run(sys.argv[1:]).returncode
    except UmlError as exc:
        print(f"uml: {exc}", file=sys.stderr)
        return 1
    except BuildError as exc:
        print(exc, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

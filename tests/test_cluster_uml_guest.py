"""The test bed's UML guests: they run the project's own kernel (devtools.umlkernel), TCP works
both ways over their TAP link, and a guest whose kernel panics is reported within seconds, with
the panic's lines, by both ways of booting one (uml.run and a UmlNode's start)."""

from __future__ import annotations

import shlex
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from devtools import uml, umlkernel
from devtools.testbed.controlplane import host_address
from tests.cluster_fixtures import UmlNodes

pytestmark = pytest.mark.cluster

# PID 1 of the guest segfaults: the guest's init script execs it as its last command.
SEGFAULTING_INIT = ["exec", sys.executable, "-c", "import ctypes; ctypes.string_at(0)"]
PANIC = "Kernel panic - not syncing: Attempted to kill init! exitcode=0x0000000b"


def test_guest_runs_the_projects_kernel(uml_nodes: UmlNodes) -> None:
    (node,) = uml_nodes(1, vg_gib=[1])
    kernel = umlkernel.kernel()
    assert node.exec("uname", "-r").stdout.strip() == umlkernel.built_release(kernel)
    version = node.exec("cat", "/proc/version").stdout
    assert "topolvm@testbed" in version, version
    # Device-mapper targets are built in: the guest loads no modules.
    targets = node.exec("dmsetup", "targets").stdout
    for target in ("thin-pool", "thin", "snapshot", "mirror", "raid", "crypt"):
        assert f"\n{target} " in f"\n{targets}", targets


def test_tcp_over_the_tap_link_both_ways(uml_nodes: UmlNodes) -> None:
    """Host to guest: the agent's HTTP calls. Guest to host: the guest connects to a listener
    on the host's end of the link, sends a line and reads the host's answer."""
    (node,) = uml_nodes(1, vg_gib=[1])
    received: list[bytes] = []
    with socket.create_server((host_address(node.index), 0)) as server:
        server.settimeout(60)
        port = server.getsockname()[1]

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                received.append(conn.recv(100))
                conn.sendall(b"host-to-guest " + b"x" * 100_000 + b"\n")

        t = threading.Thread(target=answer)
        t.start()
        client = (
            "import socket, sys\n"
            f"s = socket.create_connection(({host_address(node.index)!r}, {port}), timeout=30)\n"
            "s.sendall(b'guest-to-host')\n"
            "data = b''\n"
            "while not data.endswith(b'\\n'):\n"
            "    chunk = s.recv(65536)\n"
            "    if not chunk: break\n"
            "    data += chunk\n"
            "print(data.split()[0].decode(), len(data))\n"
        )
        res = node.exec(sys.executable, "-c", client, timeout=60)
        t.join(60)
    assert received == [b"guest-to-host"]
    assert res.stdout.split() == ["host-to-guest", str(len("host-to-guest ") + 100_001)]


def test_panicking_guest_is_reported_within_seconds_by_run() -> None:
    start = time.monotonic()
    with pytest.raises(uml.UmlError) as excinfo:
        uml.run(SEGFAULTING_INIT, disks=(1 << 30,), mem_mb=256, capture=True, timeout=120)
    assert time.monotonic() - start < 10
    assert PANIC in str(excinfo.value)


def test_panicking_guest_is_reported_within_seconds_at_node_start(tmp_path: Path) -> None:
    """The wait a UmlNode's start does (uml.wait_ready), on a guest whose init dies."""
    console = tmp_path / "console.log"
    with uml.running(SEGFAULTING_INIT, console=console, disks=(1 << 30,), mem_mb=256) as proc:
        start = time.monotonic()
        with pytest.raises(uml.UmlError) as excinfo:
            uml.wait_ready(proc, console, ready=lambda: False, timeout=120)
        assert time.monotonic() - start < 10
    assert PANIC in str(excinfo.value)
    assert PANIC in console.read_text()


# Threads that sleep 20 microseconds at a time (as Go's sysmon does) beside direct disk writes
# (I/O interrupts): a tick a second on the console, then DONE.
TIMER_STORM = """
import mmap, os, sys, threading, time
stop = False
def sleeper():
    while not stop:
        time.sleep(0.00002)
def writer():
    fd = os.open("/dev/ubdb", os.O_RDWR | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)
    i = 0
    while not stop:
        os.pwritev(fd, [buf], (i % 1000) * 4096)
        i += 1
for target in [sleeper] * 4 + [writer]:
    threading.Thread(target=target, daemon=True).start()
for n in range(int(sys.argv[1])):
    time.sleep(1)
    print("tick", n + 1, flush=True)
stop = True
print("DONE", flush=True)
"""


def test_guest_timers_survive_short_sleeps_beside_disk_io(tmp_path: Path) -> None:
    """A UML guest's timers sometimes stop for good (its host timer never programmed again):
    every sleep in it hangs, containerd with it, and pods stay in ContainerCreating. The host
    sends UML a timer signal every second (devtools.umlnudge), which revives them. Without it,
    this storm stopped the ticks for good in about 1 run of 4 (60 s each); with it, a tick is
    late by a second at most."""
    seconds = 60
    console = tmp_path / "console.log"
    command = ["sh", "-c", f"exec {sys.executable} -c {shlex.quote(TIMER_STORM)} {seconds}"]
    with uml.running(command, console=console, disks=(1 << 30,), mem_mb=512):
        deadline = time.monotonic() + seconds + 90
        while time.monotonic() < deadline and "DONE" not in console.read_text(errors="replace"):
            time.sleep(1)
    text = console.read_text(errors="replace")
    ticks = [line for line in text.splitlines() if line.startswith("tick ")]
    assert "DONE" in text, f"the guest's timers stopped after {ticks[-1:]}: {text[-1500:]}"

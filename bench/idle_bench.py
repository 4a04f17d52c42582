"""``make bench-idle``: what a node's TopoLVM costs while nothing happens.

One UML node (VG ``vg1`` with a thick class and a thin pool, 5 volumes: 3 thick, 2 thin) whose
Node object lives in the real API server of a private network namespace. Two set-ups, one after
the other: ``topolvm node`` with lvmd embedded, then ``topolvm lvmd`` and ``topolvm node`` as
two processes (socket mode). After a settling period, an idle window (default 300 s) measures
per set-up, in the guest:

- LVM commands per minute: lvmd's command prefix is a two-line shell wrapper that appends a line
  to a file and execs ``lvm``, so every command lvmd runs is counted (the wrapper's own cost,
  one fork of ``sh``, is in the CPU figure: an upper bound);
- CPU seconds per minute of the daemon(s) and their LVM children (``/proc/<pid>/stat``: utime,
  stime, cutime, cstime), and per thread name (``/proc/<pid>/task/*``: the asyncio thread apart
  from any other, such as the default executor's);
- RSS and private (anonymous) memory of each daemon at the end (``/proc/<pid>/smaps_rollup``);
- one outside change (an ``lvcreate`` by hand) after the window: the seconds until the Node's
  capacity annotation shows it (the kernel's device events, not a periodic report).

Results go to ``.cache/bench/idle.json``. Nothing is asserted; upstream TopoLVM v0.41.0's figures
from the same layout (issue 24) are printed beside ours.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from bench.outcome import run_kept, save
from devtools import gobuild, umlkernel
from devtools.testbed.bed import CLUSTER_BINARIES, THICK, VG, Testbed
from devtools.testbed.driver import csidriver
from devtools.testbed.process import HarnessError, enter_private_netns
from devtools.testbed.umlnode import LVM, UmlNode

WORKDIR = gobuild.ROOT / ".cache" / "bench" / "idle-run"
RESULTS = gobuild.ROOT / ".cache" / "bench" / "idle.json"
GiB = 1 << 30
THIN: dict[str, Any] = {"name": "thin", "volume-group": VG, "type": "thin",
        "thin-pool": {"name": "pool0", "overprovision-ratio": 5.0}}  # fmt: skip
CALLS = "/run/topolvm/lvm-calls"
TICKS = os.sysconf("SC_CLK_TCK")  # the guest's USER_HZ is the host's (both x86-64 Linux)
# issue 24: upstream TopoLVM v0.41.0, same layout, 5-minute idle windows, three runs
UPSTREAM = {
    "embedded": {"lvm_per_min": "0.1", "cpu_s_per_min": "0.015-0.031", "rss_mb": "48",
                 "private_mb": "10.6"},
    "split": {"lvm_per_min": "0.1", "cpu_s_per_min": "0.016-0.029", "rss_mb": "44 + 48",
              "private_mb": "8.8 + 10.3"},
}  # fmt: skip


def counted_lvm(node: UmlNode) -> Path:
    """The command prefix that counts: a wrapper in the node's folder (the guest sees it)."""
    wrapper = node.workdir / node.name / "lvm-counted"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(f'#!/bin/sh\necho >> {CALLS}\nexec {LVM} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def cpu_seconds(node: UmlNode, pid: int) -> float:
    """The process's CPU and that of its reaped children (its LVM commands)."""
    fields = node.exec("cat", f"/proc/{pid}/stat").stdout.rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return (utime + stime + cutime + cstime) / TICKS


def thread_cpu(node: UmlNode, pid: int) -> dict[str, float]:
    """CPU seconds per thread of the process, summed by thread name (grpc's pools share one)."""
    script = f'for t in /proc/{pid}/task/*; do echo "$(cat $t/comm)|$(cat $t/stat)"; done'
    out: dict[str, float] = {}
    for line in node.exec("sh", "-c", script).stdout.splitlines():
        name, _, stat = line.partition("|")
        if ")" not in stat:
            continue  # the thread ended between the two reads
        utime, stime = (int(f) for f in stat.rsplit(")", 1)[1].split()[11:13])
        out[name] = out.get(name, 0.0) + (utime + stime) / TICKS
    return out


def lvm_calls(node: UmlNode) -> int:
    out = node.exec("sh", "-c", f"test -f {CALLS} && wc -l < {CALLS} || echo 0").stdout
    return int(out.strip())


def annotation(bed: Testbed, node: str) -> int | None:
    path = "jsonpath={.metadata.annotations.capacity\\.topolvm\\.io/ssd}"
    out = bed.kube.kubectl("get", "node", node, "-o", path)
    return int(out) if out.strip() else None


def wait_for(what: str, check: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise HarnessError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return value


def measure(bed: Testbed, index: int, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    name = f"idle-{mode}"
    node = bed.start_node(name, index, args.vg_gib)
    node.lvm("lvcreate", "-T", f"{VG}/pool0", "-L", "2g")
    for n in range(3):
        node.lvm("lvcreate", "-n", f"thick{n}", "-L", "512m", "-W", "y", "-y", VG)
    for n in range(2):
        node.lvm("lvcreate", "-T", f"{VG}/pool0", "-n", f"thin{n}", "-V", "1g")
    node.lvmd_options = {"lvm-command-prefix": [str(counted_lvm(node))]}
    classes: list[dict[str, Any]] = [THICK, THIN]
    if mode == "embedded":
        node.start_topolvm_node(bed.kube, classes)
        daemons = ["topolvm-node"]
    else:
        socket = node.start_lvmd(classes)
        node.start_topolvm_node(bed.kube, [], lvmd_socket=socket)
        daemons = ["lvmd", "topolvm-node"]
    wait_for("the capacity annotation", lambda: annotation(bed, name) is not None)
    time.sleep(args.settle)
    pids = [node.pids[d] for d in daemons]
    threads0 = [thread_cpu(node, p) for p in pids]
    calls0, cpu0, t0 = lvm_calls(node), [cpu_seconds(node, p) for p in pids], time.monotonic()
    time.sleep(args.window)
    calls1, cpu1, t1 = lvm_calls(node), [cpu_seconds(node, p) for p in pids], time.monotonic()
    threads1 = [thread_cpu(node, p) for p in pids]
    minutes = (t1 - t0) / 60
    cpu = {d: round((b - a) / minutes, 4) for d, a, b in zip(daemons, cpu0, cpu1, strict=True)}
    by_thread = {
        d: {t: round((s - a.get(t, 0.0)) / minutes, 4) for t, s in b.items() if s > a.get(t, 0.0)}
        for d, a, b in zip(daemons, threads0, threads1, strict=True)
    }
    memory = {d: node.memory_mb(d) for d in daemons}
    # one change made by hand: until the Node's annotation shows it
    before = annotation(bed, name)
    assert before is not None
    start = time.monotonic()
    node.lvm("lvcreate", "-n", "outside", "-L", "1g", "-W", "y", "-y", VG)
    wait_for("the annotation after an outside lvcreate",
             lambda: annotation(bed, name) == before - GiB, timeout=700)  # fmt: skip
    seen = time.monotonic() - start
    for d in reversed(daemons):
        node.signal(d, "SIGTERM", wait=30)
    return {
        "window_s": round(t1 - t0, 1),
        "lvm_per_min": round((calls1 - calls0) / minutes, 2),
        "cpu_s_per_min": round(sum(cpu.values()), 4),
        "cpu_s_per_min_each": cpu,
        "cpu_s_per_min_by_thread": by_thread,
        "memory": memory,
        "outside_change_seen_s": round(seen, 2),
    }


def report(res: dict[str, Any]) -> None:
    print(f"\nidle node, {res['window_s']:.0f} s windows (ours | upstream v0.41.0, issue 24)")
    for mode in ("embedded", "split"):
        r, up = res[mode], UPSTREAM[mode]
        rss = " + ".join(f"{m['rss_mb']:.1f}" for m in r["memory"].values())
        private = " + ".join(f"{m['private_mb']:.1f}" for m in r["memory"].values())
        print(f"  {mode}:")
        print(f"    LVM commands/min  {r['lvm_per_min']:<10} | {up['lvm_per_min']}")
        print(f"    CPU s/min         {r['cpu_s_per_min']:<10} | {up['cpu_s_per_min']}")
        for daemon, threads in r["cpu_s_per_min_by_thread"].items():
            print(f"      {daemon} by thread: {threads}")
        print(f"    RSS MB            {rss:<10} | {up['rss_mb']}")
        print(f"    private MB        {private:<10} | {up['private_mb']}")
        print(f"    outside lvcreate seen in the Node's annotation after "
              f"{r['outside_change_seen_s']} s")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=300.0, help="idle seconds measured")
    parser.add_argument("--settle", type=float, default=30.0, help="seconds before the window")
    parser.add_argument("--vg-gib", type=float, default=10.0, help="the node's vg1")
    parser.add_argument("--json", type=Path, default=RESULTS, help="write the results there")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root (network namespace, TAP links, UML)", file=sys.stderr)
        return 1
    bins = gobuild.ensure(*CLUSTER_BINARIES)
    umlkernel.kernel()
    enter_private_netns()
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    shutil.rmtree(WORKDIR, ignore_errors=True)

    def run() -> dict[str, Any]:
        res: dict[str, Any] = {}
        with Testbed(WORKDIR, bins) as bed:
            bed.start_control_plane()
            bed.kube.apply(csidriver("topolvm.io"))
            for index, mode in enumerate(("embedded", "split"), start=1):
                res[mode] = measure(bed, index, mode, args)
        return res

    res, status = run_kept(WORKDIR, run)
    if res is None:
        return status
    res["window_s"] = args.window
    shutil.rmtree(WORKDIR, ignore_errors=True)
    report(res)
    save(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

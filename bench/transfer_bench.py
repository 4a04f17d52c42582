"""``make bench``: the node-to-node copy (docs/mobility.md), as ratios measured in one run.

Set-up, with the test bed of ``devtools/testbed/bed.py``: a private network namespace, the real
control plane, two UML nodes with ``vg1`` (a thick class ``ssd`` and a thin pool ``pool0``) and
``topolvm node`` each. Copies are made as the controller makes them: a LogicalVolume on node B
whose ``spec.copy.source`` is a volume on node A; the clock runs from its creation until its
``status.copy.phase`` is Done (the copy verified).

1. A thick LV of ``--gib`` GiB of random bytes, copied from A to B, against a local ``dd`` of
   the same LV into another LV on A (``bs=1M conv=fdatasync``, timed in the guest; page
   caches dropped before each). Target: copy throughput / dd throughput >= 0.7.
2. A thin LV of the same size, 10% written, copied from A to B, against the thick copy of
   step 1. Target: its time / the thick copy's <= 0.2; the bytes metric shows what travelled.
3. CPU seconds per GiB copied, of topolvm-node on the sender and on the receiver.
4. A move's downtime (docs/mobility.md, "Move"): a thin LV of the same size, written whole,
   pre-copied to B as a move does (``spec.copy.keepCut``); then 10% of it is written again (as
   an application goes on during the pre-copy) and the final copy (``spec.copy.round: 2``)
   sends what changed. Its time, against a full copy of the same volume (the peers' way: the
   workload stopped for the whole copy). Target: <= 0.2. The pod's stop and start, the same in
   both ways, are not in either time (the cluster test prints a move's whole downtime).

Results go to ``.cache/bench/transfer.json``. The bench prints whether the targets are met;
it never fails on them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import sys
import time
from typing import Any

from bench.outcome import memory_or_cache, run_kept, save
from devtools import gobuild, uml, umlkernel
from devtools.testbed.bed import CLUSTER_BINARIES, THICK, VG, Testbed
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.process import HarnessError, enter_private_netns
from devtools.testbed.umlnode import UmlNode

MiB = 1 << 20
GiB = 1 << 30
THIN = {"name": "thin", "volume-group": VG, "type": "thin", "spare-gb": 0,
        "thin-pool": {"name": "pool0", "overprovision-ratio": 5.0}}  # fmt: skip
WORKDIR = gobuild.ROOT / ".cache" / "bench" / "transfer-run"
RESULTS = gobuild.ROOT / ".cache" / "bench" / "transfer.json"
TARGETS = {"thick_vs_dd": 0.7, "thin10_vs_thick": 0.2, "move_final_vs_full": 0.2}


def guest_seconds(node: UmlNode, script: str) -> float:
    """``script`` in one bash in the guest, timed there with $EPOCHREALTIME."""
    timed = (
        "set -e\nsync; echo 3 > /proc/sys/vm/drop_caches\nt0=${EPOCHREALTIME/[.,]/}\n"
        f"{script}\nt1=${{EPOCHREALTIME/[.,]/}}\necho $((t1 - t0))\n"
    )
    out = node.exec("/bin/bash", "-c", timed, timeout=1800).stdout.split()
    return int(out[-1]) / 1e6


def cpu_seconds(node: UmlNode, name: str = "topolvm-node") -> float:
    fields = node.exec("cat", f"/proc/{node.pids[name]}/stat").stdout.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Copies:
    def __init__(self, cp: ControlPlane, a: UmlNode, b: UmlNode, prefix: str = "bench") -> None:
        self.cp, self.a, self.b = cp, a, b
        self.prefix = prefix  # LogicalVolume names: <prefix>-<n>
        self.n = 0

    def _lv(
        self, node: UmlNode, size: int, dc: str, copy_source: str = "", keep_cut: bool = False
    ) -> str:
        self.n += 1
        name = f"{self.prefix}-{self.n}"
        spec: dict[str, Any] = {"name": name, "nodeName": node.name, "size": str(size),
                                "deviceClass": dc}  # fmt: skip
        if copy_source:
            spec["copy"] = {"source": copy_source}
            if keep_cut:
                spec["copy"]["keepCut"] = True
        self.cp.apply({"apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
                       "metadata": {"name": name}, "spec": spec})  # fmt: skip
        return name

    def wait(self, name: str, done: bool) -> dict[str, Any]:
        """Until the LogicalVolume exists (``done``: and its copy is done), polled over one
        API connection (a kubectl process per poll would take a host core from the guests)."""
        status: dict[str, Any] = asyncio.run(self._wait(name, done))
        return status

    async def _wait(self, name: str, done: bool) -> dict[str, Any]:
        from topolvm.constants import NORMAL
        from topolvm.k8s import api

        client = api.make_client(str(self.cp.kubeconfig))
        resource = api.logicalvolume_resource(NORMAL)
        try:
            deadline = time.monotonic() + 1800
            while time.monotonic() < deadline:
                # a slow GET of a loaded bed's API server is waited out, as the daemons do
                obj = await api.retry_transient(lambda: api.get(client, resource, name),
                                                f"reading {name}") or {}  # fmt: skip
                status: dict[str, Any] = obj.get("status") or {}
                if status.get("code"):
                    raise HarnessError(f"{name} failed: {status.get('message')}")
                phase = (status.get("copy") or {}).get("phase")
                if status.get("volumeID") and (not done or phase == "Done"):
                    return status
                await asyncio.sleep(0.05)
            raise HarnessError(f"{name} not ready after 30 min")
        finally:
            await client.close()

    def volume(self, size: int, dc: str) -> tuple[str, str]:
        name = self._lv(self.a, size, dc)
        return name, str(self.wait(name, done=False)["volumeID"])

    def copy(
        self, source: str, size: int, dc: str, keep_cut: bool = False
    ) -> tuple[float, dict[str, Any], str]:
        """Seconds from the target's creation until its copy is done, its status, its name."""
        self._drop_caches()
        started = time.monotonic()
        name = self._lv(self.b, size, dc, copy_source=source, keep_cut=keep_cut)
        status = self.wait(name, done=True)
        return time.monotonic() - started, status, name

    def _drop_caches(self) -> None:
        self.a.exec("sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches")
        self.b.exec("sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches")

    def final_copy(self, name: str) -> tuple[float, dict[str, Any]]:
        """A move's round 2 of target ``name``: seconds until it is done, its status."""
        self._drop_caches()
        started = time.monotonic()
        self.cp.kubectl("patch", "logicalvolumes.topolvm.io", name, "--type=merge",
                        "-p", '{"spec":{"copy":{"round":2}}}')  # fmt: skip
        status = asyncio.run(self._wait_round(name))
        return time.monotonic() - started, status

    async def _wait_round(self, name: str) -> dict[str, Any]:
        from topolvm.constants import NORMAL
        from topolvm.k8s import api

        client = api.make_client(str(self.cp.kubeconfig))
        resource = api.logicalvolume_resource(NORMAL)
        try:
            while True:
                obj = await api.retry_transient(lambda: api.get(client, resource, name),
                                                f"reading {name}") or {}  # fmt: skip
                copy = (obj.get("status") or {}).get("copy") or {}
                if copy.get("round") == 2 and copy.get("phase") == "Done":
                    return dict(obj["status"])
                if copy.get("phase") == "Failed":
                    raise HarnessError(f"{name}'s final copy failed: {copy.get('message')}")
                await asyncio.sleep(0.05)
        finally:
            await client.close()

    def delete(self, name: str) -> None:
        self.cp.kubectl("delete", "logicalvolumes.topolvm.io", name, "--timeout=120s")


def measure(cp: ControlPlane, a: UmlNode, b: UmlNode, size: int, rounds: int) -> dict[str, Any]:
    copies = Copies(cp, a, b)
    thick, thick_id = copies.volume(size, "ssd")
    a.exec("dd", "if=/dev/urandom", f"of=/dev/{VG}/{thick_id}", "bs=1M",
           f"count={size // MiB}", "oflag=direct", timeout=1800)  # fmt: skip
    thin, thin_id = copies.volume(size, "thin")
    for i in range(size // 10 // MiB):  # 1 MiB of every 10, as a filesystem scatters its files
        a.exec("dd", "if=/dev/urandom", f"of=/dev/{VG}/{thin_id}", "bs=1M", f"seek={i * 10}",
               "count=1", "oflag=direct", "conv=notrunc")  # fmt: skip
    print(f"sources on {a.name}: {size // MiB} MiB of random bytes (thick), 10% of it (thin)",
          flush=True)  # fmt: skip
    dd: list[float] = []
    thick_s: list[float] = []
    thin_s: list[float] = []
    cpu = {"sender": 0.0, "receiver": 0.0}
    moved = {"thick": 0, "thin": 0}
    for r in range(rounds):  # each round: dd, the thick copy, the thin copy; medians reported
        a.lvm("lvcreate", "-n", "dd-target", "-L", f"{size}b", "-W", "y", "-y", VG)
        dd.append(guest_seconds(a, f"dd if=/dev/{VG}/{thick_id} of=/dev/{VG}/dd-target bs=1M "
                                   "conv=fdatasync 2>/dev/null"))  # fmt: skip
        a.lvm("lvremove", "-f", f"{VG}/dd-target")
        cpu_a, cpu_b = cpu_seconds(a), cpu_seconds(b)
        seconds, status, target = copies.copy(thick, size, "ssd")
        cpu["sender"] += cpu_seconds(a) - cpu_a
        cpu["receiver"] += cpu_seconds(b) - cpu_b
        thick_s.append(seconds)
        moved["thick"] = int(status["copy"].get("transferredBytes", 0))
        copies.delete(target)
        seconds, status, target = copies.copy(thin, size, "thin")
        thin_s.append(seconds)
        moved["thin"] = int(status["copy"].get("transferredBytes", 0))
        copies.delete(target)
        print(f"round {r + 1}: dd {dd[-1]:.2f} s, thick copy {thick_s[-1]:.2f} s, thin copy "
              f"{thin_s[-1]:.2f} s", flush=True)  # fmt: skip
    if os.environ.get("TOPOLVM_BENCH_LOGS"):  # where a copy's time goes, from both nodes' logs
        for node in (a, b):
            for line in node.node_log(lines=0).splitlines():
                if any(w in line for w in ("transfer", "copy", "LV", "cut", "thin")):
                    print(f"  {node.name}: {line[:200]}")
    med = statistics.median
    copied = size / GiB * rounds
    return {
        "size_bytes": size,
        "rounds": rounds,
        "dd_seconds": dd,
        "thick_copy_seconds": thick_s,
        "thin10_copy_seconds": thin_s,
        "thick_transferred_bytes": moved["thick"],
        "thin10_transferred_bytes": moved["thin"],
        "ratios": {
            "thick_vs_dd": med(dd) / med(thick_s),
            "thin10_vs_thick": med(thin_s) / med(thick_s),
        },
        "cpu_seconds_per_gib": {k: v / copied for k, v in cpu.items()},
    }


def measure_move(cp: ControlPlane, a: UmlNode, b: UmlNode, size: int) -> dict[str, Any]:
    copies = Copies(cp, a, b, prefix="move")
    source, source_id = copies.volume(size, "thin")
    a.exec("dd", "if=/dev/urandom", f"of=/dev/{VG}/{source_id}", "bs=1M",
           f"count={size // MiB}", "oflag=direct", timeout=1800)  # fmt: skip
    pre_s, pre, target = copies.copy(source, size, "thin", keep_cut=True)
    for i in range(size // 10 // MiB):  # the application goes on: 1 MiB of every 10 again
        a.exec("dd", "if=/dev/urandom", f"of=/dev/{VG}/{source_id}", "bs=1M", f"seek={i * 10}",
               "count=1", "oflag=direct", "conv=notrunc")  # fmt: skip
    final_s, final = copies.final_copy(target)
    copies.delete(target)
    full_s, full, other = copies.copy(source, size, "thin")
    copies.delete(other)
    print(f"move: pre-copy {pre_s:.2f} s, final copy {final_s:.2f} s; a full copy {full_s:.2f} s",
          flush=True)  # fmt: skip
    return {
        "precopy_seconds": pre_s, "final_copy_seconds": final_s, "full_copy_seconds": full_s,
        "precopy_transferred_bytes": int(pre["copy"].get("transferredBytes", 0)),
        "final_transferred_bytes": int(final["copy"].get("transferredBytes", 0)),
        "full_transferred_bytes": int(full["copy"].get("transferredBytes", 0)),
    }  # fmt: skip


def report(results: dict[str, Any]) -> None:
    r = results["ratios"]
    size = results["size_bytes"]
    med = statistics.median
    move = results["move"]
    move_line = (
        f"  move: final copy {move['final_copy_seconds']:.2f} s sent "
        f"{move['final_transferred_bytes'] / size:.1%} of the volume; a full copy "
        f"{move['full_copy_seconds']:.2f} s; move_final_vs_full "
        f"{r['move_final_vs_full']:.2f} (target <= {TARGETS['move_final_vs_full']})"
    )
    if "thick_copy_seconds" not in results:  # --move-only
        print(f"\n== a move of {size / GiB:g} GiB (docs/mobility.md) ==\n{move_line}")
        return
    thick = med(results["thick_copy_seconds"])
    print(
        f"\n== node-to-node copy of {size / GiB:g} GiB (docs/mobility.md), medians of "
        f"{results['rounds']} rounds =="
    )
    thin = med(results["thin10_copy_seconds"])
    print(f"local dd {med(results['dd_seconds']):.2f} s; thick copy {thick:.2f} s "
          f"({size / thick / MiB:.0f} MiB/s); thin 10% {thin:.2f} s")  # fmt: skip
    for key, target in TARGETS.items():
        if key not in r:
            continue
        met = r[key] >= target if key == "thick_vs_dd" else r[key] <= target
        sign = ">=" if key == "thick_vs_dd" else "<="
        print(f"  {key}: {r[key]:.2f} (target {sign} {target}) {'ok' if met else 'OVER'}")
    cpu = results["cpu_seconds_per_gib"]
    print(f"  CPU s/GiB: sender {cpu['sender']:.2f}, receiver {cpu['receiver']:.2f}")
    print(f"  thin 10%: {results['thin10_transferred_bytes'] / size:.1%} of the volume moved")
    print(move_line)


def disks_where(size: int) -> str:
    """Where the guests' disk images go. They are in memory (/dev/shm) by default, and the
    bench writes about 3 volumes' worth on each node (a source, a dd target, the move's volume;
    a removed LV's blocks stay in the image). More than memory holds with room to spare, and
    the host would swap its guests out: then they go under .cache (the host's page cache still
    holds what fits)."""
    if chosen := os.environ.get(uml.DISK_DIR_ENV):
        return chosen
    # both nodes' writes and their guests' memory
    folder = str(memory_or_cache(7 * size + 4 * GiB, "bench", "disks"))
    os.environ[uml.DISK_DIR_ENV] = folder
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=4.0, help="volume size (default 4 GiB)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (medians are reported)")
    parser.add_argument("--move-only", action="store_true",
                        help="only the move's final copy against a full copy (step 4)")  # fmt: skip
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root (network namespace, TAP links, UML)", file=sys.stderr)
        return 1
    size = int(args.gib * GiB) // (4 * MiB) * (4 * MiB)
    bins = gobuild.ensure(*CLUSTER_BINARIES)  # before the namespace: may need the module proxy
    umlkernel.kernel()
    enter_private_netns()
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    shutil.rmtree(WORKDIR, ignore_errors=True)
    print(f"the guests' disks: {disks_where(size)}", flush=True)
    vg = max(8.0, 4 * args.gib + 3)

    def run() -> dict[str, Any]:
        with Testbed(WORKDIR, bins) as bed:
            cp = bed.start_control_plane()
            nodes = []
            for i, name in enumerate(("bench-a", "bench-b"), start=1):
                node = bed.start_node(name, i, vg, disks=(int(vg + 2) * GiB,))
                node.lvm("lvcreate", "-T", f"{VG}/pool0", "-L", f"{int(args.gib * 2 + 1)}g")
                node.start_topolvm_node(cp, [THICK, THIN])
                nodes.append(node)
            print("control plane and two UML nodes up", flush=True)
            results: dict[str, Any] = {"size_bytes": size, "ratios": {}}
            if not args.move_only:
                results = measure(cp, nodes[0], nodes[1], size, args.rounds)
            move = measure_move(cp, nodes[0], nodes[1], size)
            results["move"] = move
            results["ratios"]["move_final_vs_full"] = (
                move["final_copy_seconds"] / move["full_copy_seconds"]
            )
            return results

    print("starting the control plane and two UML nodes ...", flush=True)
    results, status = run_kept(WORKDIR, run)
    if results is None:
        return status
    results["loadavg"] = list(os.getloadavg())
    report(results)
    save(RESULTS, results)
    shutil.rmtree(WORKDIR, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

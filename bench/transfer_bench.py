"""``make bench``: the node-to-node copy (docs/transfer.md), as ratios measured in one run.

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

Results go to ``.cache/bench/transfer.json``. The bench prints whether the targets are met;
it never fails on them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from typing import Any

from bench.outcome import run_kept, save
from devtools import gobuild, umlkernel
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
TARGETS = {"thick_vs_dd": 0.7, "thin10_vs_thick": 0.2}


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
    def __init__(self, cp: ControlPlane, a: UmlNode, b: UmlNode) -> None:
        self.cp, self.a, self.b = cp, a, b
        self.n = 0

    def _lv(self, node: UmlNode, size: int, dc: str, copy_source: str = "") -> str:
        self.n += 1
        name = f"bench-{self.n}"
        spec: dict[str, Any] = {"name": name, "nodeName": node.name, "size": str(size),
                                "deviceClass": dc}  # fmt: skip
        if copy_source:
            spec["copy"] = {"source": copy_source}
        self.cp.apply({"apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
                       "metadata": {"name": name}, "spec": spec})  # fmt: skip
        return name

    def _status(self, name: str) -> dict[str, Any]:
        out = self.cp.kubectl("get", "logicalvolumes.topolvm.io", name, "-o", "json")
        status: dict[str, Any] = json.loads(out).get("status") or {}
        return status

    def wait(self, name: str, done: bool) -> dict[str, Any]:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            status = self._status(name)
            if status.get("code"):
                raise HarnessError(f"{name} failed: {status.get('message')}")
            if status.get("volumeID") and (not done or status.get("copy", {}).get("phase")
                                           == "Done"):  # fmt: skip
                return status
            time.sleep(0.1)
        raise HarnessError(f"{name} not ready after 30 min: {self._status(name)}")

    def volume(self, size: int, dc: str) -> tuple[str, str]:
        name = self._lv(self.a, size, dc)
        return name, str(self.wait(name, done=False)["volumeID"])

    def copy(self, source: str, size: int, dc: str) -> tuple[float, dict[str, Any]]:
        self.a.exec("sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches")
        self.b.exec("sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches")
        started = time.monotonic()
        name = self._lv(self.b, size, dc, copy_source=source)
        status = self.wait(name, done=True)
        return time.monotonic() - started, status


def measure(cp: ControlPlane, a: UmlNode, b: UmlNode, size: int) -> dict[str, Any]:
    copies = Copies(cp, a, b)
    thick, thick_id = copies.volume(size, "ssd")
    a.exec("dd", "if=/dev/urandom", f"of=/dev/{VG}/{thick_id}", "bs=1M",
           f"count={size // MiB}", "oflag=direct", timeout=1800)  # fmt: skip
    print(f"source: {size // MiB} MiB of random bytes written on {a.name}", flush=True)
    a.lvm("lvcreate", "-n", "dd-target", "-L", f"{size}b", "-W", "y", "-y", VG)
    dd = guest_seconds(a, f"dd if=/dev/{VG}/{thick_id} of=/dev/{VG}/dd-target bs=1M "
                          "conv=fdatasync 2>/dev/null")  # fmt: skip
    a.lvm("lvremove", "-f", f"{VG}/dd-target")
    print(f"local dd: {dd:.2f} s ({size / dd / MiB:.0f} MiB/s)", flush=True)

    cpu_a, cpu_b = cpu_seconds(a), cpu_seconds(b)
    thick_s, thick_status = copies.copy(thick, size, "ssd")
    cpu_a, cpu_b = cpu_seconds(a) - cpu_a, cpu_seconds(b) - cpu_b
    print(f"thick copy A->B: {thick_s:.2f} s ({size / thick_s / MiB:.0f} MiB/s)", flush=True)

    thin, thin_id = copies.volume(size, "thin")
    tenth = size // 10 // MiB
    for i in range(tenth):  # 1 MiB of every 10, as a filesystem scatters its files
        a.exec("dd", "if=/dev/urandom", f"of=/dev/{VG}/{thin_id}", "bs=1M", f"seek={i * 10}",
               "count=1", "oflag=direct", "conv=notrunc")  # fmt: skip
    thin_s, thin_status = copies.copy(thin, size, "thin")
    sent = int(thin_status["copy"].get("transferredBytes", 0))
    print(f"thin copy A->B (10% written): {thin_s:.2f} s, {sent // MiB} MiB of data moved",
          flush=True)  # fmt: skip
    gib = size / GiB
    return {
        "size_bytes": size,
        "dd_seconds": dd,
        "thick_copy_seconds": thick_s,
        "thick_transferred_bytes": int(thick_status["copy"].get("transferredBytes", 0)),
        "thin10_copy_seconds": thin_s,
        "thin10_transferred_bytes": sent,
        "ratios": {"thick_vs_dd": dd / thick_s, "thin10_vs_thick": thin_s / thick_s},
        "cpu_seconds_per_gib": {"sender": cpu_a / gib, "receiver": cpu_b / gib},
    }


def report(results: dict[str, Any]) -> None:
    r = results["ratios"]
    size = results["size_bytes"]
    print("\n== node-to-node copy (docs/transfer.md) ==")
    print(f"local dd {results['dd_seconds']:.2f} s; thick copy {results['thick_copy_seconds']:.2f}"
          f" s ({size / results['thick_copy_seconds'] / MiB:.0f} MiB/s); thin 10% "
          f"{results['thin10_copy_seconds']:.2f} s")  # fmt: skip
    for key, target in TARGETS.items():
        met = r[key] >= target if key == "thick_vs_dd" else r[key] <= target
        sign = ">=" if key == "thick_vs_dd" else "<="
        print(f"  {key}: {r[key]:.2f} (target {sign} {target}) {'ok' if met else 'OVER'}")
    cpu = results["cpu_seconds_per_gib"]
    print(f"  CPU s/GiB: sender {cpu['sender']:.2f}, receiver {cpu['receiver']:.2f}")
    print(f"  thin 10%: {results['thin10_transferred_bytes'] / size:.1%} of the volume moved")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="volume size (default 1 GiB)")
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
            return measure(cp, nodes[0], nodes[1], size)

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

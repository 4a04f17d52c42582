"""``make bench``: lvmd RPC latency as a ratio to the bare LVM command, measured in one UML run.

Pairs are interleaved (bare, lvmd, bare, lvmd, ...) so that drift in the machine's speed hits
both sides alike; each ratio is median(lvmd) / median(bare). The bare command is run with the
same argv lvmd uses, from the same process, the same way (fork+exec, wait).
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devtools import uml

GiB = 1 << 30
MiB = 1 << 20
LVM = "/sbin/lvm"
VG = "benchvg"
ROUNDS = 25
LIST_LVS = 500
LIST_ROUNDS = 20
TARGETS = {"CreateLV / lvcreate": 1.05, "RemoveLV / lvremove": 1.05, "GetLVList@500 / lvs": 1.2}


def bare(*args: str) -> float:
    started = time.perf_counter()
    subprocess.run([LVM, *args], check=True, capture_output=True)
    return time.perf_counter() - started


async def timed(coro: object) -> float:
    started = time.perf_counter()
    await coro  # type: ignore[misc]
    return time.perf_counter() - started


async def measure() -> dict[str, tuple[float, float, float]]:
    from tests.lvm_fixtures import start_lvmd
    from topolvm.lvm.report import LV_FIELDS
    from topolvm.proto import lvmd_pb2 as pb

    sock = Path(tempfile.mkdtemp()) / "lvmd.sock"
    client = await start_lvmd(
        {
            "socket-name": str(sock),
            "lvm-command-prefix": [LVM],
            "device-classes": [{"name": "ssd", "volume-group": VG, "default": True}],
        },
        refresh_interval=3600,
    )
    size = 8 * MiB
    results: dict[str, tuple[float, float, float]] = {}
    try:
        await client.lv.CreateLV(pb.CreateLVRequest(name="warmup", size_bytes=size))
        bare("lvcreate", "-n", "warmup2", "-L", f"{size}b", "-W", "y", "-y", VG)
        ours, base = [], []
        for i in range(ROUNDS):
            base.append(bare("lvcreate", "-n", f"b{i}", "-L", f"{size}b", "-W", "y", "-y", VG))
            req = pb.CreateLVRequest(name=f"o{i}", size_bytes=size)
            ours.append(await timed(client.lv.CreateLV(req)))
        results["CreateLV / lvcreate"] = summarize(ours, base)
        ours, base = [], []
        for i in range(ROUNDS):
            base.append(bare("lvremove", "-f", f"{VG}/b{i}"))
            ours.append(await timed(client.lv.RemoveLV(pb.RemoveLVRequest(name=f"o{i}"))))
        results["RemoveLV / lvremove"] = summarize(ours, base)

        for i in range(LIST_LVS - 2):
            await client.lv.CreateLV(pb.CreateLVRequest(name=f"l{i:03d}", size_bytes=4 * MiB))
        cold = await timed(client.vg.GetLVList(pb.GetLVListRequest()))  # refreshes once
        resp = await client.vg.GetLVList(pb.GetLVListRequest())
        assert len(resp.volumes) == LIST_LVS, len(resp.volumes)
        lvs_args = (
            "lvs",
            VG,
            "-o",
            LV_FIELDS,
            "--units",
            "b",
            "--nosuffix",
            "--reportformat",
            "json",
        )
        ours, base = [], []
        for _ in range(LIST_ROUNDS):
            base.append(bare(*lvs_args))
            ours.append(await timed(client.vg.GetLVList(pb.GetLVListRequest())))
        results["GetLVList@500 / lvs"] = summarize(ours, base)
        results["GetLVList@500 first call after changes / lvs"] = summarize([cold], base)
    finally:
        await client.channel.close(None)
        await client.server.stop()
    return results


def summarize(ours: list[float], base: list[float]) -> tuple[float, float, float]:
    o, b = statistics.median(ours), statistics.median(base)
    return o / b, o, b


def inside() -> int:
    disk = uml.disk_devices(1)[0]
    subprocess.run([LVM, "pvcreate", "-q", disk], check=True, capture_output=True)
    subprocess.run([LVM, "vgcreate", "-q", VG, disk], check=True, capture_output=True)
    results = asyncio.run(measure())
    print(f"\nlvmd vs bare LVM inside User-Mode Linux ({ROUNDS} interleaved rounds; medians)")
    print(f"{'measure':<46}{'ratio':>8}{'lvmd ms':>10}{'bare ms':>10}{'target':>9}")
    for name, (ratio, ours, base) in results.items():
        target = TARGETS.get(name)
        mark = "" if target is None else (" ok" if ratio <= target else " OVER")
        t = f"<= {target}" if target else "(info)"
        print(f"{name:<46}{ratio:>8.3f}{ours * 1e3:>10.1f}{base * 1e3:>10.1f}{t:>9}{mark}")
    sys.stdout.flush()
    return 0  # a report, as the other benchmarks: a ratio over its target is marked OVER


def main() -> int:
    if "--inside" in sys.argv:
        return inside()
    print("booting User-Mode Linux for the lvmd benchmark...", flush=True)
    res = uml.run([sys.executable, "-m", "bench.lvmd_bench", "--inside"], disks=(16 * GiB,))
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())

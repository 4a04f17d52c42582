"""``make demo``: lvmd on a real, file-backed volume group inside User-Mode Linux.

On the host this boots UML and runs itself inside with ``--inside``. Inside it creates a VG on
/dev/ubdb (thick class) with a thin pool (thin class), starts the real ``topolvm lvmd`` daemon,
and drives it over its UNIX socket: Watch, CreateLV, GetLVList, ResizeLV, a thin snapshot,
GetFreeBytes, RemoveLV, then SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import yaml

from devtools import uml

GiB = 1 << 30
MiB = 1 << 20
LVM = "/sbin/lvm"


def say(msg: str) -> None:
    print(msg, flush=True)


def sh(*args: str) -> str:
    say("  $ " + " ".join(args))
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def size(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


async def drive(sock: str) -> None:
    from topolvm.proto import lvmd_pb2 as pb
    from topolvm.proto import lvmd_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(f"unix:{sock}") as ch:
        lv, vg = pb_grpc.LVServiceStub(ch), pb_grpc.VGServiceStub(ch)
        watch = vg.Watch(pb.Empty())
        received: list[pb.WatchResponse] = []

        async def follow() -> None:  # cancelling a read() would end the stream: read in a task
            async for message in watch:
                received.append(message)

        follower = asyncio.create_task(follow())

        async def watched(label: str) -> None:
            seen = len(received)
            for _ in range(100):  # wait for a new message, then for the burst to settle
                await asyncio.sleep(0.1)
                if len(received) > seen or (seen == 0 and received):
                    break
            await asyncio.sleep(0.3)
            msg = received[-1]
            parts = [
                f"{i.device_class}: thin-pool free {size(i.thin_pool.overprovision_bytes)}"
                if i.HasField("thin_pool")
                else f"{i.device_class}: free {size(i.free_bytes)}"
                for i in msg.items
            ]
            say(f"  Watch ({label}): default free {size(msg.free_bytes)}; " + "; ".join(parts))

        await watched("initial")
        say("\n2. CreateLV pvc-demo (1000 MiB on the default thick class)")
        r = await lv.CreateLV(pb.CreateLVRequest(name="pvc-demo", size_bytes=1000 * MiB))
        say(
            f"  -> size {size(r.volume.size_bytes)} (extent-rounded), dev {r.volume.dev_major}:"
            f"{r.volume.dev_minor}"
        )
        await watched("after CreateLV")
        say("  again, same size -> idempotent:")
        r = await lv.CreateLV(pb.CreateLVRequest(name="pvc-demo", size_bytes=1000 * MiB))
        say(f"  -> ok, size {size(r.volume.size_bytes)}")
        say("\n3. CreateLV thin-demo (4 GiB virtual on the thin class, pool is 2 GiB x ratio 5)")
        await lv.CreateLV(
            pb.CreateLVRequest(name="thin-demo", device_class="thin", size_bytes=4 * GiB)
        )
        await watched("after thin CreateLV")
        say("\n4. GetLVList")
        for dc in ("", "thin"):
            resp = await vg.GetLVList(pb.GetLVListRequest(device_class=dc))
            for v in resp.volumes:
                say(
                    f"  [{dc or 'default'}] {v.name:<10} {size(v.size_bytes):>10}"
                    f"  attr {v.attr}  {v.path}"
                )
        say("\n5. ResizeLV pvc-demo -> 2 GiB, then a no-op request for 1 GiB")
        r2 = await lv.ResizeLV(pb.ResizeLVRequest(name="pvc-demo", size_bytes=2 * GiB))
        say(f"  -> {size(r2.size_bytes)}")
        r2 = await lv.ResizeLV(pb.ResizeLVRequest(name="pvc-demo", size_bytes=GiB))
        say(f"  -> {size(r2.size_bytes)} (never shrinks)")
        say("\n6. CreateLVSnapshot snap-demo of thin-demo (read-only)")
        s = await lv.CreateLVSnapshot(
            pb.CreateLVSnapshotRequest(
                name="snap-demo", device_class="thin", source_volume="thin-demo", access_type="ro"
            )
        )
        say(f"  -> {s.snapshot.name} {size(s.snapshot.size_bytes)}")
        say("\n7. Errors come back as gRPC status codes")
        errors: list[tuple[str, Awaitable[Any]]] = [
            ("too big", lv.CreateLV(pb.CreateLVRequest(name="huge", size_bytes=100 * GiB))),
            ("hostile name", lv.CreateLV(pb.CreateLVRequest(name="--force", size_bytes=GiB))),
            ("unknown class", lv.CreateLV(
                pb.CreateLVRequest(name="x", device_class="nvme", size_bytes=GiB))),
            ("thick snapshot", lv.CreateLVSnapshot(pb.CreateLVSnapshotRequest(
                name="s2", source_volume="pvc-demo", access_type="ro"))),
        ]  # fmt: skip
        for label, call in errors:
            try:
                await call
            except grpc.aio.AioRpcError as e:
                say(f"  {label:<15} -> {e.code().name}: {e.details()}")
        free = await vg.GetFreeBytes(pb.GetFreeBytesRequest())
        say(f"\n8. GetFreeBytes (default class, minus 1 GiB spare): {size(free.free_bytes)}")
        say("\n9. RemoveLV snap-demo, thin-demo, pvc-demo")
        for name, dc in (("snap-demo", "thin"), ("thin-demo", "thin"), ("pvc-demo", "")):
            await lv.RemoveLV(pb.RemoveLVRequest(name=name, device_class=dc))
        await watched("after RemoveLV")
        watch.cancel()
        follower.cancel()


def inside() -> int:
    disk = uml.disk_devices(1)[0]
    say("1. A volume group on a file-backed disk inside User-Mode Linux")
    sh(LVM, "pvcreate", "-q", "--setphysicalvolumesize", "10g", disk)
    sh(LVM, "vgcreate", "-q", "demovg", disk)
    sh(LVM, "lvcreate", "-q", "-T", "demovg/pool0", "-L", "2g")
    work = Path(tempfile.mkdtemp())
    sock = str(work / "lvmd.sock")
    config = {
        "socket-name": sock,
        "lvm-command-prefix": [LVM],
        "device-classes": [
            {"name": "ssd", "volume-group": "demovg", "default": True, "spare-gb": 1},
            {"name": "thin", "volume-group": "demovg", "type": "thin",
             "thin-pool": {"name": "pool0", "overprovision-ratio": 5.0}},
        ],
    }  # fmt: skip
    cfg = work / "lvmd.yaml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False))
    say(
        f"  lvmd config {cfg}:\n"
        + "".join(f"    {line}\n" for line in cfg.read_text().splitlines())
    )
    log = (work / "lvmd.log").open("w+")
    cmd = [sys.executable, "-m", "topolvm", "--log-format", "text", "lvmd", "--config", str(cfg),
           "--metrics-bind-address", "0"]  # fmt: skip
    say("  $ topolvm lvmd --config " + str(cfg))
    daemon = subprocess.Popen(cmd, stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while not Path(sock).exists():
        if daemon.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            say("lvmd did not start:\n" + log.read())
            return 1
        time.sleep(0.05)
    try:
        asyncio.run(drive(sock))
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    say(f"\n10. SIGTERM -> lvmd exited {daemon.returncode}; LVs left in demovg:")
    say("  " + (sh(LVM, "lvs", "--noheadings", "-o", "lv_name,lv_size", "demovg").strip() or "-"))
    log.seek(0)
    lines = log.read().splitlines()
    say(f"\nlvmd log ({len(lines)} lines), last 5:")
    for line in lines[-5:]:
        say("  " + line[:160])
    return 0 if daemon.returncode == 0 else 1


def main() -> int:
    if "--inside" in sys.argv:
        return inside()
    say("booting User-Mode Linux (real kernel, real LVM, file-backed disk)...")
    res = uml.run(
        [sys.executable, "-m", "devtools.demo", "--inside"], disks=(12 * GiB,), timeout=600
    )
    say(f"\ndemo finished: exit {res.returncode}")
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())

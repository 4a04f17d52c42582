"""``make demo-lvmd``: lvmd on a real, file-backed volume group inside User-Mode Linux.

On the host this boots UML and runs itself inside with ``--inside``. Inside it creates a VG on
/dev/ubdb (thick class) with a thin pool (thin class), starts the real ``topolvm lvmd`` daemon,
and drives it over its UNIX socket: Watch, CreateLV, GetLVList, ResizeLV, a thin snapshot,
GetFreeBytes, RemoveLV, then SIGTERM.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import yaml

from devtools import buildcache, uml

GiB = 1 << 30
MiB = 1 << 20
LVM = "/sbin/lvm"


say = functools.partial(buildcache.say, stream=sys.stdout)  # the demo's story: on stdout


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
    if daemon.returncode != 0:
        return 1
    return asyncio.run(node_demo(work, cfg))


async def node_demo(work: Path, cfg: Path) -> int:
    """Part 2: topolvm-node (embedded lvmd) against the Kubernetes API emulator."""
    from tests.helpers import eventually
    from tests.kube_emulator import KubeEmulator
    from tests.kube_fixtures import write_kubeconfig
    from topolvm.constants import NORMAL
    from topolvm.k8s import api
    from topolvm.proto import csi_pb2 as csi
    from topolvm.proto import csi_pb2_grpc as csi_grpc

    say("\n== Part 2: topolvm-node, with lvmd embedded, against a Kubernetes API emulator ==")
    emu = KubeEmulator()
    await emu.start()
    node_name = "demo-node"
    emu.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name}})
    emu.create({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                "metadata": {"name": "topolvm.io"}, "spec": {"attachRequired": False}})  # fmt: skip
    kc = write_kubeconfig(work / "kubeconfig", emu.url)
    csi_sock = str(work / "csi.sock")
    node_log = (work / "node.log").open("w+")
    cmd = [sys.executable, "-m", "topolvm", "--log-format", "text", "node", "--embed-lvmd",
           "--config", str(cfg), "--nodename", node_name, "--kubeconfig", str(kc),
           "--csi-socket", csi_sock, "--metrics-bind-address", "127.0.0.1:18080"]  # fmt: skip
    say(f"11. API emulator at {emu.url} with Node {node_name} and CSIDriver topolvm.io")
    say(f"  $ topolvm node --embed-lvmd --config {cfg} --nodename {node_name} ...")
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=node_log, stderr=node_log)

    def log_text() -> str:
        node_log.seek(0)
        return f"node log:\n{node_log.read()}"

    async def until(what: str, check: Any, timeout: float = 60) -> Any:
        return await eventually(
            what, check, timeout, gave_up=lambda: proc.returncode is not None, details=log_text
        )

    def lv_obj(name: str) -> dict[str, Any]:
        return emu.get("logicalvolumes", name, group="topolvm.io") or {}

    kube = api.make_client(server=emu.url)  # plays kubectl and topolvm-controller
    lv_res = api.logicalvolume_resource(NORMAL)
    code = 1
    try:
        await until("the CSI socket", lambda: Path(csi_sock).exists())

        def capacity() -> dict[str, str]:
            meta = (emu.get("nodes", node_name) or {}).get("metadata", {})
            return {k: v for k, v in (meta.get("annotations") or {}).items() if "capacity" in k}

        annos = await until("capacity annotations", capacity)
        node_meta = (emu.get("nodes", node_name) or {})["metadata"]
        say("\n12. Node annotations published from lvmd's Watch stream:")
        for key, value in sorted(annos.items()):
            say(f"  {key} = {value} ({size(int(value))})")
        say(f"  finalizers: {node_meta.get('finalizers')}")

        say("\n13. kubectl create: LogicalVolume pvc-0001 (1Gi, default device class)")
        await kube.create(lv_res.from_dict({
            "apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
            "metadata": {"name": "pvc-0001"},
            "spec": {"name": "pvc-0001", "nodeName": node_name, "size": "1Gi"}}))  # fmt: skip
        status = await until("status.volumeID", lambda: lv_obj("pvc-0001").get("status"))
        uid = status["volumeID"]
        say(f"  status: {status}")
        say(f"  finalizers: {lv_obj('pvc-0001')['metadata'].get('finalizers')}")
        say(
            "  " + sh(LVM, "lvs", "--noheadings", "-o", "lv_name,lv_size,lv_path", "demovg").strip()
        )

        target = str(work / "pods" / "demo-pod" / "mount")
        cap = csi.VolumeCapability(
            mount=csi.VolumeCapability.MountVolume(fs_type="ext4"),
            access_mode=csi.VolumeCapability.AccessMode(
                mode=csi.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
            ),
        )
        async with grpc.aio.insecure_channel(f"unix:{csi_sock}") as ch:
            ident, node = csi_grpc.IdentityStub(ch), csi_grpc.NodeStub(ch)
            info = await ident.GetPluginInfo(csi.GetPluginInfoRequest())
            probe = await ident.Probe(csi.ProbeRequest())
            ninfo = await node.NodeGetInfo(csi.NodeGetInfoRequest())
            say(f"\n14. CSI over {csi_sock}: plugin {info.name} {info.vendor_version}, "
                f"probe ready={probe.ready.value}, node_id={ninfo.node_id}, "
                f"topology={dict(ninfo.accessible_topology.segments)}")  # fmt: skip
            say(f"  NodePublishVolume {uid} ext4 -> {target}")
            await node.NodePublishVolume(csi.NodePublishVolumeRequest(
                volume_id=uid, target_path=target, volume_capability=cap))  # fmt: skip
            say("  " + sh("findmnt", "-n", "-o", "SOURCE,FSTYPE,OPTIONS", target).strip())
            Path(target, "hello.txt").write_text("written before the resize\n")
            say("  wrote hello.txt; df: " + sh("df", "-h", "--output=size,used", target)
                .splitlines()[1].strip())  # fmt: skip

            say("\n15. Resize: spec.size 1Gi -> 2Gi (what ControllerExpandVolume does)")
            await api.patch_merge(kube, lv_res, "pvc-0001", {"spec": {"size": "2Gi"}})
            await until(
                "currentSize 2Gi",
                lambda: lv_obj("pvc-0001").get("status", {}).get("currentSize") == "2Gi",
            )
            say(f"  status: {lv_obj('pvc-0001')['status']}")
            await node.NodeExpandVolume(csi.NodeExpandVolumeRequest(
                volume_id=uid, volume_path=target,
                capacity_range=csi.CapacityRange(required_bytes=2 * GiB)))  # fmt: skip
            say("  NodeExpandVolume online; df: " + sh("df", "-h", "--output=size,used", target)
                .splitlines()[1].strip())  # fmt: skip
            say("  hello.txt still reads: " + Path(target, "hello.txt").read_text().strip())
            stats = await node.NodeGetVolumeStats(csi.NodeGetVolumeStatsRequest(
                volume_id=uid, volume_path=target))  # fmt: skip
            for u in stats.usage:
                unit = csi.VolumeUsage.Unit.Name(u.unit)
                say(f"  NodeGetVolumeStats {unit}: total {u.total} used {u.used}")
            say(f"  condition: abnormal={stats.volume_condition.abnormal} "
                f"'{stats.volume_condition.message}'")  # fmt: skip

            say("\n16. NodeUnpublishVolume, then kubectl delete logicalvolume pvc-0001")
            await node.NodeUnpublishVolume(csi.NodeUnpublishVolumeRequest(
                volume_id=uid, target_path=target))  # fmt: skip
            say(f"  target removed: {not Path(target).exists()}")
        await kube.delete(lv_res, "pvc-0001")
        await until("the object to go", lambda: not lv_obj("pvc-0001"))
        left = sh(LVM, "lvs", "--noheadings", "-o", "lv_name", "demovg").split()
        say(f"  LV removed by the node, then the finalizer: LVs left = {left}")
        async with (
            aiohttp.ClientSession() as http,
            http.get("http://127.0.0.1:18080/metrics") as r,
        ):
            text = await r.text()
        metrics = [ln for ln in text.splitlines() if ln.startswith("topolvm_volumegroup_avail")]
        say("\n17. /metrics: " + "; ".join(metrics))
        code = 0
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)
        say(f"\n18. SIGTERM -> topolvm-node exited {proc.returncode}")
        await kube.close()
        await emu.stop()
    return code if proc.returncode == 0 else 1


def main() -> int:
    if "--inside" in sys.argv:
        return inside()
    say("booting User-Mode Linux (real kernel, real LVM, file-backed disk)...")
    res = uml.run(
        [sys.executable, "-m", "devtools.demo_lvmd", "--inside"], disks=(12 * GiB,), timeout=600
    )
    say(f"\ndemo finished: exit {res.returncode}")
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())

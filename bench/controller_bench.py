"""``make bench``: topolvm-controller's CreateVolume against bare ``lvcreate`` in the same guest.

Set-up, with the test bed of ``devtools/testbed/bed.py``: a private network namespace, the real
control plane (etcd, kube-apiserver, ...), one UML node with ``vg1`` and ``topolvm node``
(embedded lvmd, thick device class ``ssd``), and ``topolvm controller`` on the host. No CSI
sidecar runs: the bench calls the controller's CSI socket itself, as csi-provisioner would
(preferred topology = the node, an ext4 mount capability, 64 MiB).

1. Latency at concurrency 1: CreateVolume until it returns (the LV exists and the node has
   written the LogicalVolume's status), then DeleteVolume, against ``lvcreate``/``lvremove``
   with the argv lvmd uses. Blocks of volumes alternate between the two sides (ABBA order) so
   that drift in the machine's speed hits both alike.
2. Throughput at concurrency 16: CreateVolume for many volumes with 16 in flight, in volumes/s,
   against the same number of ``lvcreate`` run one after another.

The baseline runs as ONE bash loop inside the guest per block, each command timed with
``$EPOCHREALTIME`` (a shell variable: no fork), so the guest agent's HTTP round trip and the
host/guest link are not in the baseline; the node runs its ``lvcreate`` as a local subprocess
in the guest the same way. A breakdown of where a CreateVolume's time goes comes from a watch
of the LogicalVolumes and from topolvm-node's "created LV" log lines (the UML guest shares the
host's clock). Results go to ``.cache/bench/controller.json``. The bench prints whether the
targets are met; it never fails on them.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.controller_report import report, summary
from devtools import gobuild, umlkernel
from devtools.testbed.bed import CLUSTER_BINARIES, THICK, VG, Testbed
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.process import HarnessError, enter_private_netns
from devtools.testbed.umlnode import LVM, UmlNode

MiB = 1 << 20
GiB = 1 << 30
SIZE = 64 * MiB  # >= the ext4 minimum allocation (32 MiB), so no rounding up
NODE = "bench-n1"
SETTLE = 2.0  # seconds between phases: lvmd's report and the capacity export after changes
WORKDIR = gobuild.ROOT / ".cache" / "bench" / "controller-run"
RESULTS = gobuild.ROOT / ".cache" / "bench" / "controller.json"
NODE_LOG_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \S+\s+\S+: created LV lv='([^']+)'"
)


# --- the baseline: one bash loop in the guest -------------------------------------------


def guest_loop(node: UmlNode, verb: str, names: list[str]) -> tuple[list[float], float]:
    """Run ``lvm lvcreate`` (argv as lvmd's), ``lvm lvremove`` or (once per name) lvmd's
    ``lvm fullreport`` for each name in ONE bash process in the guest; returns each command's
    seconds and the whole loop's seconds, both measured in the guest with $EPOCHREALTIME."""
    from topolvm.lvm.report import FULLREPORT_ARGS

    if verb == "create":
        cmd = f'LC_ALL=C {LVM} lvcreate -n "$n" -L {SIZE}b -W y -y {VG} >/dev/null'
    elif verb == "remove":
        cmd = f'LC_ALL=C {LVM} lvremove -f "{VG}/$n" >/dev/null'
    else:
        cmd = f"LC_ALL=C {shlex.join([LVM, *FULLREPORT_ARGS])} >/dev/null"
    script = (
        "set -e\n"
        "t0=${EPOCHREALTIME/[.,]/}\n"
        f"for n in {' '.join(shlex.quote(n) for n in names)}; do\n"
        "  s=${EPOCHREALTIME/[.,]/}\n"
        f"  {cmd}\n"
        "  e=${EPOCHREALTIME/[.,]/}\n"
        '  echo "one $((e - s))"\n'
        "done\n"
        "t1=${EPOCHREALTIME/[.,]/}\n"
        'echo "all $((t1 - t0))"\n'
    )
    out = node.exec("/bin/bash", "-c", script, timeout=600).stdout.split("\n")
    each = [int(line.split()[1]) / 1e6 for line in out if line.startswith("one ")]
    total = next(int(line.split()[1]) / 1e6 for line in out if line.startswith("all "))
    if len(each) != len(names):
        raise HarnessError(f"guest loop: {len(each)} timings for {len(names)} names: {out}")
    return each, total


# --- the controller side ----------------------------------------------------------------


@dataclass
class Bench:
    node: UmlNode
    socket: Path
    kubeconfig: Path
    live: dict[str, str] = field(default_factory=dict)  # CSI name -> volume id, not yet deleted
    seen: dict[str, float] = field(default_factory=dict)  # object name -> wall time first seen
    ready: dict[str, float] = field(default_factory=dict)  # -> wall time status.volumeID seen
    starts: dict[str, float] = field(default_factory=dict)  # -> wall time the RPC was sent
    ends: dict[str, float] = field(default_factory=dict)  # -> wall time the RPC returned

    async def run(self, args: argparse.Namespace) -> dict[str, Any]:
        import grpc

        from topolvm.constants import NORMAL
        from topolvm.k8s import api
        from topolvm.k8s.runtime import Informer
        from topolvm.proto import csi_pb2 as csi
        from topolvm.proto import csi_pb2_grpc as csi_grpc

        self.csi = csi
        self.names = NORMAL
        client = api.make_client(str(self.kubeconfig))
        informer = Informer(client, api.logicalvolume_resource(NORMAL))
        informer.add_handler(self._on_lv_event)
        watch = asyncio.create_task(informer.run())
        channel = grpc.aio.insecure_channel(f"unix:{self.socket}")
        self.stub = csi_grpc.ControllerStub(channel)
        try:
            await self._wait_capacity(client)
            return await self._measure(args)
        finally:
            await self._delete_live()
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            await channel.close(None)
            await client.close()

    def _on_lv_event(self, event: str, obj: dict[str, Any]) -> None:
        now = time.time()
        name = str(obj["metadata"]["name"])
        self.seen.setdefault(name, now)
        if event != "DELETED" and (obj.get("status") or {}).get("volumeID"):
            self.ready.setdefault(name, now)

    async def _wait_capacity(self, client: Any) -> None:
        """Until the node annotates its capacity and the controller's GetCapacity shows it."""
        from lightkube.resources.core_v1 import Node

        from topolvm.k8s import api

        key = self.names.capacity_annotation("")
        topo = self.csi.Topology(segments={self.names.topology_key: NODE})
        deadline = time.monotonic() + 120
        while True:
            obj = await api.get(client, Node, NODE) or {}
            annotated = key in ((obj.get("metadata") or {}).get("annotations") or {})
            if annotated:
                req = self.csi.GetCapacityRequest(accessible_topology=topo)
                if (await self.stub.GetCapacity(req, timeout=10)).available_capacity >= 4 * GiB:
                    return
            if time.monotonic() > deadline:
                raise HarnessError(
                    f"no capacity from {NODE} after 120 s (annotated: {annotated}); "
                    f"topolvm-node log:\n{self.node.node_log()}"
                )
            await asyncio.sleep(0.2)

    def _create_request(self, name: str) -> Any:
        csi = self.csi
        return csi.CreateVolumeRequest(
            name=name,
            capacity_range=csi.CapacityRange(required_bytes=SIZE),
            volume_capabilities=[
                csi.VolumeCapability(
                    mount=csi.VolumeCapability.MountVolume(fs_type="ext4"),
                    access_mode=csi.VolumeCapability.AccessMode(
                        mode=csi.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
                    ),
                )
            ],
            accessibility_requirements=csi.TopologyRequirement(
                preferred=[csi.Topology(segments={self.names.topology_key: NODE})]
            ),
        )

    async def create(self, name: str) -> float:
        started = time.perf_counter()
        self.starts[name] = time.time()
        resp = await self.stub.CreateVolume(self._create_request(name), timeout=300)
        self.ends[name] = time.time()
        elapsed = time.perf_counter() - started
        self.live[name] = resp.volume.volume_id
        if resp.volume.capacity_bytes != SIZE:
            raise HarnessError(f"{name}: {resp.volume.capacity_bytes} bytes, not {SIZE}")
        return elapsed

    async def delete(self, name: str) -> float:
        started = time.perf_counter()
        req = self.csi.DeleteVolumeRequest(volume_id=self.live[name])
        await self.stub.DeleteVolume(req, timeout=300)
        elapsed = time.perf_counter() - started
        del self.live[name]
        return elapsed

    async def _delete_live(self) -> None:
        """Best effort, also after a failure or Ctrl-C: what the bench created and still has."""
        for name in list(self.live):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.delete(name), 120)

    async def _guest(self, verb: str, names: list[str]) -> tuple[list[float], float]:
        return await asyncio.to_thread(guest_loop, self.node, verb, names)

    async def _measure(self, args: argparse.Namespace) -> dict[str, Any]:
        count, block, tput, conc = args.count, args.block, args.tput_count, args.concurrency
        # Warm-up: the first of each costs imports, connections, caches.
        await self.create("warmup-0")
        await self.delete("warmup-0")
        await self._guest("create", ["warmup-b0"])
        await self._guest("remove", ["warmup-b0"])
        fullreport, _ = await self._guest("fullreport", [f"r{i}" for i in range(5)])
        await asyncio.sleep(SETTLE)

        ctl_create: list[float] = []
        ctl_delete: list[float] = []
        bare_create: list[float] = []
        bare_remove: list[float] = []
        latency_names: list[str] = []
        blocks = [list(range(i, min(i + block, count))) for i in range(0, count, block)]
        for b, idx in enumerate(blocks):
            order = ("bare", "ctl") if b % 4 in (0, 3) else ("ctl", "bare")
            for side in order:
                if side == "bare":
                    names = [f"bench-b-{i}" for i in idx]
                    each, _ = await self._guest("create", names)
                    bare_create += each
                    each, _ = await self._guest("remove", names)
                    bare_remove += each
                else:
                    names = [f"bench-l-{i}" for i in idx]
                    latency_names += names
                    for n in names:
                        ctl_create.append(await self.create(n))
                    for n in names:
                        ctl_delete.append(await self.delete(n))
                await asyncio.sleep(SETTLE)
        print(f"latency: {count} volumes per side done", flush=True)

        sem = asyncio.Semaphore(conc)

        async def limited(fn: Callable[[str], Awaitable[float]], name: str) -> float:
            async with sem:
                return await fn(name)

        tput_rounds: list[dict[str, Any]] = []
        tput_names: list[str] = []
        for r in range(args.tput_rounds):
            for side in ("bare", "ctl") if r % 2 == 0 else ("ctl", "bare"):
                if side == "bare":
                    names = [f"bench-tb{r}-{i}" for i in range(tput)]
                    _, create_s = await self._guest("create", names)
                    _, remove_s = await self._guest("remove", names)
                else:
                    names = [f"bench-t{r}-{i}" for i in range(tput)]
                    tput_names += names
                    started = time.perf_counter()
                    await asyncio.gather(*(limited(self.create, n) for n in names))
                    create_s = time.perf_counter() - started
                    started = time.perf_counter()
                    await asyncio.gather(*(limited(self.delete, n) for n in names))
                    remove_s = time.perf_counter() - started
                tput_rounds.append(
                    {"side": side, "round": r, "create_s": create_s, "delete_s": remove_s}
                )
                await asyncio.sleep(SETTLE)
        print(f"throughput: {args.tput_rounds} x {tput} volumes per side done", flush=True)

        return {
            "latency": {
                "CreateVolume": summary(ctl_create),
                "lvcreate": summary(bare_create),
                "DeleteVolume": summary(ctl_delete),
                "lvremove": summary(bare_remove),
            },
            "throughput_rounds": tput_rounds,
            "breakdown": {"c1": self._breakdown(latency_names),
                          f"c{conc}": self._breakdown(tput_names)},
            "fullreport_ms": statistics.median(fullreport) * 1e3,
        }  # fmt: skip

    def _breakdown(self, names: list[str]) -> dict[str, dict[str, float]]:
        """Median and maximum (ms) of each stage of these CreateVolumes."""
        created: dict[str, float] = {}
        with contextlib.suppress(HarnessError, OSError, ValueError):
            for line in self.node.node_log(lines=0).splitlines():
                m = NODE_LOG_LINE.match(line)
                if m:
                    ts = time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
                    created[m.group(3)] = calendar.timegm(ts) + int(m.group(2)) / 1e3
        stages: dict[str, list[float]] = {"rpc_to_object_seen": [], "object_seen_to_lv_created": [],
                                          "lv_created_to_status_seen": [],
                                          "status_seen_to_rpc_return": []}  # fmt: skip
        for n in names:
            if n not in self.seen or n not in self.ready or n not in self.ends:
                continue
            stages["rpc_to_object_seen"].append(self.seen[n] - self.starts[n])
            stages["status_seen_to_rpc_return"].append(self.ends[n] - self.ready[n])
            if n in created:
                stages["object_seen_to_lv_created"].append(created[n] - self.seen[n])
                stages["lv_created_to_status_seen"].append(self.ready[n] - created[n])
        return {
            k: {"median_ms": statistics.median(v) * 1e3, "max_ms": max(v) * 1e3}
            for k, v in stages.items()
            if v
        }


# --- set-up, report, clean-up -----------------------------------------------------------


def cleanup_cluster(cp: ControlPlane) -> None:
    """Every LogicalVolume left (a Ctrl-C between create and delete): delete, let the node
    remove its LV for a while, then drop the finalizers of what is left."""
    with contextlib.suppress(Exception):
        _cleanup_cluster(cp)


def _cleanup_cluster(cp: ControlPlane) -> None:
    group = "logicalvolumes.topolvm.io"
    if not cp.kubectl("get", group, "-o", "name", check=False).strip():
        return
    cp.kubectl("delete", group, "--all", "--wait=false", check=False)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not cp.kubectl("get", group, "-o", "name", check=False).strip():
            return
        time.sleep(0.5)
    for name in cp.kubectl("get", group, "-o", "name", check=False).split():
        cp.kubectl("patch", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                   check=False)  # fmt: skip


def remove_lvs(node: UmlNode) -> None:
    """Whatever a Ctrl-C left in the guest, baseline LVs included (topolvm-node is stopped)."""
    with contextlib.suppress(Exception):
        node.lvm("lvremove", "-f", "-y", VG, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20, help="volumes for latency, per side")
    parser.add_argument("--block", type=int, default=5, help="latency volumes per block")
    parser.add_argument("--tput-count", type=int, default=48, help="volumes for throughput")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tput-rounds", type=int, default=2, help="throughput rounds per side")
    parser.add_argument("--vg-gib", type=float, default=10.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root (network namespace, TAP link, UML)", file=sys.stderr)
        return 1
    if args.tput_count * SIZE > (args.vg_gib - 2) * GiB:
        print("--tput-count volumes do not fit in --vg-gib", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    bins = gobuild.ensure(*CLUSTER_BINARIES)  # before the namespace: may need the module proxy
    umlkernel.kernel()  # the node's kernel, likewise (Debian's archive)
    enter_private_netns()  # still one thread; gone with this process
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # clean up as on Ctrl-C
    shutil.rmtree(WORKDIR, ignore_errors=True)
    print("starting the control plane, a UML node and topolvm-controller ...", flush=True)
    ok = False
    try:
        with Testbed(WORKDIR, bins, before_node_stop=remove_lvs) as bed:
            cp = bed.start_control_plane()
            node = bed.start_node(NODE, 1, args.vg_gib, disks=(16 * GiB,), device_classes=[THICK])
            bed.defer("LogicalVolumes", lambda: cleanup_cluster(cp))  # after the driver stops
            driver = bed.start_driver(sidecars=False)
            t1 = time.monotonic()
            bench = Bench(node, driver.socket, cp.kubeconfig)
            results = asyncio.run(bench.run(args))
            t2 = time.monotonic()
        timing = {"setup_s": t1 - t0, "measure_s": t2 - t1, "total_s": time.monotonic() - t0}
        results["timing"] = timing
        results["parameters"] = {**vars(args), "size_bytes": SIZE, "node": NODE}
        results["loadavg"] = list(os.getloadavg())
        report(results, args, timing, size=SIZE, saved_to=RESULTS)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        ok = True
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; cleaned up", file=sys.stderr)
        return 130
    finally:
        if ok:
            shutil.rmtree(WORKDIR, ignore_errors=True)
        else:
            print(f"logs kept in {WORKDIR}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``make bench-kubelet``: PVC + pod until running on real Kubernetes nodes with the chart,
against the kubelet stand-in, in ONE run on one real control plane (private network namespace).

Two phases one after the other, so that only one ``topolvm.io`` controller is ever active:

1. Stand-in: a UML node without a kubelet (a simulated Node), ``topolvm node`` as a process in
   the guest, the host-process driver (devtools/testbed/driver.py: ``topolvm controller``,
   csi-provisioner), and :class:`KubeletStandIn` publishing the volume of the pod kube-scheduler
   bound there (root /run/kubelet). Measured: created until published and status Running.
2. Real kubelet: UML nodes with containerd, the kubelet and kube-proxy (measured per node: its
   start until the Node is Ready), ``helm install`` of charts/topolvm with devtools/cluster.py's
   values, each guest's memory idle (``free -m``, ``ps``), then PVC + a busybox pod until its
   container runs (the mount is checked in the guest afterwards).

WaitForFirstConsumer, xfs, the default device class in both; claim and pod are created through
the API and their stages seen by watches (time.monotonic() at each event). Nothing is asserted
on timings; ``--json PATH`` writes the results.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import os
import re
import shutil
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim, Pod
from lightkube.resources.storage_v1 import CSIStorageCapacity

from bench.kubelet_report import report, summary
from bench.outcome import run_kept, save
from devtools import gobuild, nodeimages, umlkernel
from devtools.cluster import RELEASE, RELEASE_NS, VALUES
from devtools.demo_bed import tools
from devtools.testbed import chart, systemdisk
from devtools.testbed.bed import THICK, Testbed
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.kubelet import KubeletStandIn, mount_target
from devtools.testbed.kubenode import KUBELET_DIR
from devtools.testbed.process import HarnessError, enter_private_netns
from devtools.testbed.umlnode import UmlNode
from topolvm.constants import NORMAL
from topolvm.k8s import api
from topolvm.k8s.runtime import Informer

NS = "default"
APP = {"app": "kubelet-bench"}  # the bench's claims and pods
KUBE_LABEL = "topolvm.bench/kubelet"  # the real nodes: the chart's pods and the bench's go there
STANDIN = "bench-standin"
SC_STANDIN = "bench-standin"
SC_REAL = "topolvm-provisioner"  # the chart's (xfs, WaitForFirstConsumer)
STANDIN_ROOT = "/run/kubelet"  # the guest's tmpfs, as the cluster tier's stand-in had it
HOSTNAME = "kubernetes.io/hostname"
WORKDIR = gobuild.ROOT / ".cache" / "bench" / "kubelet-run"
LV = api.logicalvolume_resource(NORMAL)
STAMP = re.compile(r"(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)[.,](\d{3})")  # JSON or text log
Obj = dict[str, Any]


def claim(name: str, sc: str, size: str) -> Obj:
    meta = {"name": name, "namespace": NS, "labels": APP}
    return {"metadata": meta, "spec": {
        "accessModes": ["ReadWriteOnce"], "storageClassName": sc,
        "resources": {"requests": {"storage": size}}}}  # fmt: skip


def pod(name: str, selector: dict[str, str]) -> Obj:
    """A busybox pod with claim ``name`` mounted at /data."""
    app = {"name": "app", "image": nodeimages.busybox().name, "command": ["sleep", "1000000"],
           "volumeMounts": [{"name": "data", "mountPath": "/data"}]}  # fmt: skip
    volume = {"name": "data", "persistentVolumeClaim": {"claimName": name}}
    return {"metadata": {"name": name, "namespace": NS, "labels": APP}, "spec": {
        "nodeSelector": selector, "terminationGracePeriodSeconds": 1, "containers": [app],
        "volumes": [volume]}}  # fmt: skip


STORAGE_CLASS = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                 "metadata": {"name": SC_STANDIN}, "provisioner": NORMAL.plugin,
                 "volumeBindingMode": "WaitForFirstConsumer", "allowVolumeExpansion": True,
                 "parameters": {"csi.storage.k8s.io/fstype": "xfs"}}  # fmt: skip
"""The same as the chart's ``topolvm-provisioner``."""


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise HarnessError(f"no {what} within {timeout:.0f}s")
        await asyncio.sleep(0.2)


@dataclass
class Flow:
    """Claims and pods of one phase; ``at[(stage, name)]`` is when a watch first showed it:
    ``bound`` (the claim), ``scheduled``, ``running`` (every container), ``phase`` (status
    Running), ``gone`` (the pod)."""

    client: AsyncClient
    size: str
    at: dict[tuple[str, str], float] = field(default_factory=dict)
    _seen: defaultdict[tuple[str, str], asyncio.Event] = field(
        default_factory=lambda: defaultdict(asyncio.Event))  # fmt: skip
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def _mark(self, stage: str, name: str) -> None:
        if (stage, name) not in self.at:
            self.at[(stage, name)] = time.monotonic()
            self._seen[(stage, name)].set()

    def _on_claim(self, event: str, obj: Obj) -> None:
        if event != "DELETED" and (obj.get("status") or {}).get("phase") == "Bound":
            self._mark("bound", obj["metadata"]["name"])

    def _on_pod(self, event: str, obj: Obj) -> None:
        name, status = obj["metadata"]["name"], obj.get("status") or {}
        if event == "DELETED":
            self._mark("gone", name)
            return
        if obj["spec"].get("nodeName"):
            self._mark("scheduled", name)
        if status.get("phase") == "Running":
            self._mark("phase", name)
        statuses = status.get("containerStatuses") or []
        if statuses and all("running" in (s.get("state") or {}) for s in statuses):
            self._mark("running", name)

    async def start(self) -> None:
        for res, handler in ((PersistentVolumeClaim, self._on_claim), (Pod, self._on_pod)):
            informer = Informer(self.client, res, labels=APP)
            informer.add_handler(handler)
            self._tasks.append(asyncio.create_task(informer.run()))
            await asyncio.wait_for(informer.synced.wait(), 30)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def wait(self, stage: str, name: str, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._seen[(stage, name)].wait(), timeout)
        except TimeoutError:
            raise HarnessError(f"{name}: not {stage} within {timeout:.0f}s") from None

    async def create(self, name: str, sc: str, selector: dict[str, str]) -> tuple[float, float]:
        """Claim and pod; when it started, by time.monotonic() and by the wall clock."""
        t0, wall = time.monotonic(), time.time()
        await api.create(self.client, PersistentVolumeClaim.from_dict(claim(name, sc, self.size)))
        await api.create(self.client, Pod.from_dict(pod(name, selector)))
        return t0, wall

    async def mounted(self, name: str, nodes: dict[str, UmlNode], root: str) -> tuple[UmlNode, str]:
        """The pod's node and uid, once the claim is seen mounted (xfs) at its target there."""
        obj = await api.get(self.client, Pod, name, namespace=NS)
        pvc = await api.get(self.client, PersistentVolumeClaim, name, namespace=NS)
        assert obj is not None and pvc is not None
        node = nodes[obj["spec"]["nodeName"]]
        target = mount_target(obj["metadata"]["uid"], pvc["spec"]["volumeName"], root)
        found = (await asyncio.to_thread(node.mounts)).get(target, {})
        if found.get("fstype") != "xfs":
            raise HarnessError(f"{name}: no xfs mount at {target} in {node.name}: {found}")
        return node, obj["metadata"]["uid"]

    async def remove(self, name: str, force: bool) -> None:
        """The pod (``force``: at once, no kubelet confirms), then the claim, until its PV and
        LogicalVolume are gone (the LV removed in the guest)."""
        pvc = await api.get(self.client, PersistentVolumeClaim, name, namespace=NS) or {}
        pv = pvc.get("spec", {}).get("volumeName", "")
        await api.delete(self.client, Pod, name, namespace=NS, grace_period=0 if force else None)
        await self.wait("gone", name, 180)
        await api.delete(self.client, PersistentVolumeClaim, name, namespace=NS)

        async def gone() -> bool:
            return not pv or (await api.get(self.client, PersistentVolume, pv) is None
                              and await api.get(self.client, LV, pv) is None)  # fmt: skip

        await until(f"PV {pv} and its LogicalVolume deleted", gone, 180)


async def capacity(client: AsyncClient, sc: str, nodes: list[str], timeout: float = 180) -> None:
    """Until csi-provisioner published a non-zero CSIStorageCapacity of ``sc`` for each node."""

    async def published() -> bool:
        items, _ = await api.list_all(client, CSIStorageCapacity, namespace=RELEASE_NS)
        have = {(i.get("nodeTopology") or {}).get("matchLabels", {}).get(NORMAL.topology_key)
                for i in items if i.get("storageClassName") == sc
                and i.get("capacity") not in (None, "", "0")}  # fmt: skip
        return set(nodes) <= have

    await until(f"CSIStorageCapacity of {sc} for {', '.join(nodes)}", published, timeout)


def node_log(node: UmlNode, standin: bool) -> str:
    """topolvm-node's log: the guest's process, or the chart's container (its CRI log file)."""
    if standin:
        return node.node_log(lines=0)
    logs = "/var/log/pods/*_topolvm-node-*/topolvm-node/*.log"
    return node.exec("sh", "-c", f"cat {logs}", check=False).stdout


def published_at(log: str, uid: str) -> float | None:
    """When NodePublishVolume for pod ``uid`` returned, by its "rpc ok" record (wall clock;
    the guest shares the host's). Its own time, not the CRI log line's, is the last one."""
    for line in log.splitlines():
        if "rpc ok" in line and "NodePublishVolume" in line and uid in line:
            ymd, hms, ms = STAMP.findall(line)[-1]
            when = time.strptime(f"{ymd} {hms}", "%Y-%m-%d %H:%M:%S")
            return calendar.timegm(when) + int(ms) / 1e3
    return None


# --- the two phases -----------------------------------------------------------------------


async def measure(cp: ControlPlane, nodes: list[UmlNode], args: argparse.Namespace,
                  standin: bool) -> list[Obj]:  # fmt: skip
    """``args.runs`` times: PVC + pod created until running, then both deleted; on the real
    kubelets, or on ``nodes[0]`` with the stand-in publishing and writing the pod's status."""
    client = api.make_client(str(cp.kubeconfig))
    flow, by_name = Flow(client, args.size), {n.name: n for n in nodes}

    async def mkdir(node: str, path: str) -> None:
        await by_name[node].aexec("mkdir", "-p", path)

    kubelet = None
    if standin:
        targets = {n.name: n.csi_target for n in nodes}
        kubelet = KubeletStandIn(client, targets, mkdir, root=STANDIN_ROOT)
        sc, root, end, selector = SC_STANDIN, STANDIN_ROOT, "phase", {HOSTNAME: nodes[0].name}
    else:
        sc, root, end, selector = SC_REAL, KUBELET_DIR, "running", {KUBE_LABEL: "true"}
    runs = []
    try:
        await flow.start()
        await capacity(client, sc, list(by_name))
        for i in range(args.runs):
            name = f"{'standin' if standin else 'kubelet'}-{i}"
            t0, wall = await flow.create(name, sc, selector)
            if kubelet is not None:
                await flow.wait("scheduled", name, args.timeout)
                await kubelet.start_pod(name, NS)
            await flow.wait(end, name, args.timeout)
            node, uid = await flow.mounted(name, by_name, root)
            published = published_at(await asyncio.to_thread(node_log, node, standin), uid)
            run: Obj = {f"{k}_s": flow.at[(k if k != "total" else end, name)] - t0
                        for k in ("total", "bound", "scheduled")}  # fmt: skip
            run |= {"node": node.name, "published_s": published - wall if published else None}
            runs.append(run)
            print(f"  run {i + 1}: {run['total_s']:.2f}s on {node.name}", flush=True)
            if kubelet is not None:
                await kubelet.stop_pod(name, NS)
            await flow.remove(name, force=standin)
            await asyncio.sleep(args.settle)
    finally:
        if kubelet is not None:
            await kubelet.close()
        await flow.stop()
        await client.close()
    return runs


def standin_phase(bed: Testbed, args: argparse.Namespace) -> list[Obj]:
    """Phase 1 on a bed of its own sharing the control plane; everything of it stopped after."""
    cp = bed.kube

    def forget(node: UmlNode) -> None:  # the host driver is stopped by now
        for what in (("delete", "node", node.name, "--wait=false"),
                     ("patch", "node", node.name, "--type=merge", "-p",
                      '{"metadata":{"finalizers":null}}'),
                     ("delete", "csinode", node.name, "--wait=false"),
                     ("delete", "csistoragecapacities", "-n", RELEASE_NS, "--all"),
                     ("delete", "storageclass", SC_STANDIN, "--ignore-not-found")):  # fmt: skip
            cp.kubectl(*what, check=False)

    with Testbed(bed.workdir / "standin", bed.bins, cp=cp, before_node_stop=forget) as sub:
        node = sub.start_node(STANDIN, 1, args.vg_gib, device_classes=[THICK])
        sub.start_driver(sidecars=True)
        cp.apply(STORAGE_CLASS)
        print(f"stand-in phase: {node.name} (no kubelet, topolvm node in the guest), "
              "host topolvm controller + CSI sidecars", flush=True)  # fmt: skip
        return asyncio.run(measure(cp, [node], args, standin=True))


def kubelet_nodes(bed: Testbed, count: int, vg_gib: float) -> list[Obj]:
    """Phase 2's nodes, one after the other: UML boot and vg1, then containerd, the kubelet and
    kube-proxy until the Node is Ready."""
    started = []
    for i in range(1, count + 1):
        # start_node checks the images again: a tree changed meanwhile is built here, untimed
        systemdisk.template(nodeimages.all_images())
        name, t0 = f"bench-k{i}", time.monotonic()
        bed.start_node(name, 1 + i, vg_gib, labels={KUBE_LABEL: "true"}, kubelet=True,
                       driver_images=True)  # fmt: skip
        total, kube = time.monotonic() - t0, bed.kubes[name].started_in
        started.append({"node": name, "start_to_ready_s": total, "daemons_to_ready_s": kube})
        print(f"  {name}: Ready {total:.1f}s after its start ({kube:.1f}s after containerd, "
              "the kubelet and kube-proxy started)", flush=True)  # fmt: skip
    return started


def install_chart(bed: Testbed, count: int) -> float:
    t0 = time.monotonic()
    release = chart.Release(bed.kube, RELEASE, RELEASE_NS)
    # the host driver's CSIDriver and the control plane's CRDs become the release's
    release.install(chart.merged(VALUES, chart.testbed_values({KUBE_LABEL: "true"})),
                    "--take-ownership")  # fmt: skip
    release.wait_running(count + 1, timeout=600)  # topolvm-node on each node, the controller
    return time.monotonic() - t0


def group_of(comm: str, args: str) -> str:
    """A guest process's group: the node's daemons, the chart's containers, the test bed's."""
    if comm in ("kubelet", "containerd", "kube-proxy", "pause"):
        return comm
    for group, found in (("containerd-shim", comm.startswith("containerd-shim")),
                         ("topolvm-node", "topolvm node" in args),
                         ("controller-pod", "topolvm controller" in args or comm[:4] == "csi-"),
                         ("agent", "devtools.testbed.agent" in args)):  # fmt: skip
        if found:
            return group
    return "other"


def memory(node: UmlNode) -> Obj:
    """The guest's memory (``free -m``) and the RSS of its processes by group (``ps``), MiB."""
    mem = node.exec("free", "-m").stdout.splitlines()[1].split()
    rss: dict[str, float] = {}
    for line in node.exec("ps", "-eo", "rss=,comm=,args=").stdout.splitlines():
        kib, comm, args = [*line.split(None, 2), "", ""][:3]
        group = group_of(comm, args)
        rss[group] = rss.get(group, 0.0) + int(kib) / 1024
    return {"node": node.name, "total_mib": int(mem[1]), "used_mib": int(mem[2]),
            "available_mib": int(mem[6]), "rss_mib": rss}  # fmt: skip


def run(args: argparse.Namespace, bins: dict[str, Path], t0: float) -> Obj:
    res: Obj = {"runs": args.runs, "parameters": {k: str(v) for k, v in vars(args).items()}}
    with Testbed(WORKDIR, bins) as bed:
        cp = bed.start_control_plane()  # with the CRDs: topolvm node in phase 1 needs them
        print(f"control plane up in {cp.started_in:.1f}s", flush=True)
        t1 = time.monotonic()
        standin = standin_phase(bed, args)
        t2 = time.monotonic()
        print(f"kubelet phase: {args.kube_nodes} Kubernetes node(s) in UML", flush=True)
        res["nodes"] = kubelet_nodes(bed, args.kube_nodes, args.vg_gib)
        res["chart_install_s"] = install_chart(bed, args.kube_nodes)
        print(f"  chart installed, its pods Running in {res['chart_install_s']:.1f}s; "
              f"idle {args.idle:.0f}s, then memory", flush=True)  # fmt: skip
        time.sleep(args.idle)
        res["memory"] = [memory(n) for n in bed.nodes]
        real = asyncio.run(measure(cp, list(bed.nodes), args, standin=False))
        t3 = time.monotonic()
    res["real"], res["standin"] = summary(real), summary(standin)
    res["ratio_real_to_standin"] = res["real"]["median_s"] / res["standin"]["median_s"]
    res["timing"] = {"total_s": time.monotonic() - t0, "standin_s": t2 - t1, "kubelet_s": t3 - t2}
    res["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="PVC + pod runs per phase")
    parser.add_argument("--kube-nodes", type=int, default=2, choices=range(1, 9), metavar="N",
                        help="real-kubelet UML nodes (1 to 8)")  # fmt: skip
    parser.add_argument("--vg-gib", type=float, default=10.0, help="each node's vg1")
    parser.add_argument("--size", default="1Gi", help="each claim's size")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds between runs")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds before memory")
    parser.add_argument("--timeout", type=float, default=300.0, help="per pod, seconds")
    parser.add_argument("--json", type=Path, help="write the results there")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root (network namespace, TAP links, UML)", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    # Go binaries, helm, the nodes' images and system disk, the UML kernel: before leaving the
    # machine's network namespace (Go's module proxy, Debian's archive, PyPI)
    bins = tools()
    umlkernel.kernel()
    enter_private_netns()  # still one thread; gone with this process
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # clean up as on Ctrl-C
    shutil.rmtree(WORKDIR, ignore_errors=True)
    res, status = run_kept(WORKDIR, lambda: run(args, bins, t0))  # failed: logs in WORKDIR
    if res is None:
        return status
    shutil.rmtree(WORKDIR, ignore_errors=True)
    report(res)
    if args.json:
        save(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

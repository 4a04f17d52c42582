"""``make bench-kubelet``: what a user waits for on a real Kubernetes node, and what the kubelet
stand-in of the cluster tier's past showed instead, in ONE run on one real control plane.

The test bed (devtools/testbed/bed.py, as ``python -m devtools.cluster up`` assembles it) runs in
a private network namespace. Two phases follow one another, so that only one ``topolvm.io``
controller is ever active:

1. Stand-in: a UML node without a kubelet (a simulated Node), ``topolvm node`` as a process in
   the guest, the host-process driver (``topolvm controller`` with csi-provisioner:
   devtools/testbed/driver.py) and :class:`KubeletStandIn` publishing the volume of the pod
   kube-scheduler bound there (its root /run/kubelet, the guest's tmpfs). Measured: PVC + pod
   created until the stand-in published the volume and the pod's status is Running. Then the
   node, the driver and their objects go.
2. Real kubelet: UML nodes with containerd, the kubelet and kube-proxy (measured: the node's
   start until its Node is Ready), ``helm install`` of charts/topolvm with devtools/cluster.py's
   values (topolvm-node and the controller run in containerd), the guests' memory idle
   (``free -m`` and ``ps`` inside), then PVC + a busybox pod mounting it until the container
   runs (the kubelet mounted the volume first; the mount is checked in the guest afterwards).

Both flows use a WaitForFirstConsumer StorageClass (xfs, the default device class) and create
the claim and the pod through the API; the end points are seen by watches (time.monotonic() when
the event arrives). Nothing is asserted on timings. ``--json PATH`` writes the results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim, Pod
from lightkube.resources.storage_v1 import CSIStorageCapacity

from devtools import gobuild, nodeimages, umlkernel
from devtools.cluster import RELEASE, RELEASE_NS, VALUES
from devtools.demo_bed import tools
from devtools.testbed import chart
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
Obj = dict[str, Any]


def claim(name: str, sc: str, size: str) -> Obj:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": NS, "labels": APP},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": sc,
                     "resources": {"requests": {"storage": size}}}}  # fmt: skip


def pod(name: str, selector: dict[str, str]) -> Obj:
    """A busybox pod with claim ``name`` mounted at /data."""
    app = {"name": "app", "image": nodeimages.busybox().name, "command": ["sleep", "1000000"],
           "volumeMounts": [{"name": "data", "mountPath": "/data"}]}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": APP},
            "spec": {"nodeSelector": selector, "terminationGracePeriodSeconds": 1,
                     "containers": [app],
                     "volumes": [{"name": "data",
                                  "persistentVolumeClaim": {"claimName": name}}]}}  # fmt: skip


def storage_class(name: str) -> Obj:
    """The same class as the chart's ``topolvm-provisioner``."""
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": NORMAL.plugin, "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": True,
            "parameters": {"csi.storage.k8s.io/fstype": "xfs"}}  # fmt: skip


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
    _events: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def _mark(self, stage: str, name: str) -> None:
        if (stage, name) not in self.at:
            self.at[(stage, name)] = time.monotonic()
            self._event(stage, name).set()

    def _event(self, stage: str, name: str) -> asyncio.Event:
        return self._events.setdefault((stage, name), asyncio.Event())

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

    async def wait(self, stage: str, name: str, timeout: float) -> float:
        try:
            await asyncio.wait_for(self._event(stage, name).wait(), timeout)
        except TimeoutError:
            raise HarnessError(f"{name}: not {stage} within {timeout:.0f}s") from None
        return self.at[(stage, name)]

    async def create(self, name: str, sc: str, selector: dict[str, str]) -> float:
        t0 = time.monotonic()
        await api.create(self.client, PersistentVolumeClaim.from_dict(claim(name, sc, self.size)))
        await api.create(self.client, Pod.from_dict(pod(name, selector)))
        return t0

    def stages(self, name: str, t0: float, end: str) -> dict[str, float]:
        return {"total_s": self.at[(end, name)] - t0, "bound_s": self.at[("bound", name)] - t0,
                "scheduled_s": self.at[("scheduled", name)] - t0}  # fmt: skip

    async def mounted(self, name: str, nodes: dict[str, UmlNode], root: str) -> str:
        """The pod's node, after checking that the claim is mounted (xfs) there, where its
        kubelet (or the stand-in) publishes it."""
        obj = await api.get(self.client, Pod, name, namespace=NS)
        pvc = await api.get(self.client, PersistentVolumeClaim, name, namespace=NS)
        assert obj is not None and pvc is not None
        node = nodes[obj["spec"]["nodeName"]]
        target = mount_target(obj["metadata"]["uid"], pvc["spec"]["volumeName"], root)
        found = (await asyncio.to_thread(node.mounts)).get(target, {})
        if found.get("fstype") != "xfs":
            raise HarnessError(f"{name}: no xfs mount at {target} in {node.name}: {found}")
        return node.name

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
            t0 = await flow.create(name, sc, selector)
            extra = {}
            if kubelet is not None:
                await flow.wait("scheduled", name, args.timeout)
                await kubelet.start_pod(name, NS)
                extra["published_s"] = time.monotonic() - t0
            await flow.wait(end, name, args.timeout)
            run = {**flow.stages(name, t0, end), **extra,
                   "node": await flow.mounted(name, by_name, root)}  # fmt: skip
            runs.append(run)
            print(f"  run {i + 1}: {run['total_s']:.2f}s on {run['node']}", flush=True)
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
        cp.apply(storage_class(SC_STANDIN))
        print(f"stand-in phase: {node.name} (no kubelet, topolvm node in the guest), "
              "host topolvm controller + CSI sidecars", flush=True)  # fmt: skip
        return asyncio.run(measure(cp, [node], args, standin=True))


def kubelet_nodes(bed: Testbed, count: int, vg_gib: float) -> list[Obj]:
    """Phase 2's nodes, one after the other: UML boot and vg1, then containerd, the kubelet and
    kube-proxy until the Node is Ready."""
    started = []
    for i in range(1, count + 1):
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
    if comm in ("kubelet", "containerd", "kube-proxy"):
        return comm
    if comm.startswith("containerd-shim"):
        return "containerd-shim"
    if "topolvm node" in args:
        return "topolvm-node"
    if "topolvm controller" in args or comm.startswith("csi-"):
        return "controller-pod"
    if comm == "pause":
        return "pause"
    return "agent" if "devtools.testbed.agent" in args else "other"


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


# --- report -------------------------------------------------------------------------------


def summary(runs: list[Obj], key: str = "total_s") -> Obj:
    values = [r[key] for r in runs]
    return {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values),
            "runs_s": values}  # fmt: skip


def report(res: Obj) -> None:
    print("\n=== kubelet bench ===")
    print("node start -> Node Ready (UML boot, vg1, containerd + kubelet + kube-proxy):")
    for n in res["nodes"]:
        print(f"  {n['node']:<10} {n['start_to_ready_s']:6.1f}s   (daemons started -> Ready "
              f"{n['daemons_to_ready_s']:.1f}s)")  # fmt: skip
    print(f"helm install -> chart's pods Running: {res['chart_install_s']:.1f}s")
    print(f"\nPVC + pod created -> running, {res['runs']} runs, seconds:")
    print(f"  {'':<40}{'median':>8}{'min':>8}{'max':>8}{'bound':>8}{'sched.':>8}")
    for label, key in (("real kubelet (container running)", "real"),
                       ("stand-in (published, status Running)", "standin")):  # fmt: skip
        s, runs = res[key]["total"], res[key]["runs"]
        bound = statistics.median(r["bound_s"] for r in runs)
        sched = statistics.median(r["scheduled_s"] for r in runs)
        print(f"  {label:<40}{s['median_s']:8.2f}{s['min_s']:8.2f}{s['max_s']:8.2f}"
              f"{bound:8.2f}{sched:8.2f}")  # fmt: skip
        print(f"  {'':<40}each: {', '.join(f'{v:.2f}' for v in s['runs_s'])}")
    print(f"  ratio real / stand-in (medians): {res['ratio_real_to_standin']:.2f}")
    print("\nmemory per real-kubelet node, idle with the chart's pods running (MiB):")
    cols = ("kubelet", "containerd", "kube-proxy", "topolvm-node")
    extra = ("containerd-shim", "pause", "controller-pod", "agent", "other")
    print(f"  {'node':<10}{'used/total':>12}" + "".join(f"{c:>14}" for c in cols)
          + "   (other RSS: " + ", ".join(extra) + ")")  # fmt: skip
    for m in res["memory"]:
        rss = m["rss_mib"]
        print(f"  {m['node']:<10}{m['used_mib']:>6}/{m['total_mib']:<5}"
              + "".join(f"{rss.get(c, 0):14.0f}" for c in cols)
              + "   (" + ", ".join(f"{rss.get(c, 0):.0f}" for c in extra) + ")")  # fmt: skip
    t = res["timing"]
    print(f"\nwall time {t['total_s']:.0f}s (stand-in phase {t['standin_s']:.0f}s, kubelet phase "
          f"{t['kubelet_s']:.0f}s); load average at the end {res['loadavg']}")  # fmt: skip


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
    res["real"] = {"total": summary(real), "runs": real}
    res["standin"] = {"total": summary(standin), "runs": standin}
    medians = res["real"]["total"]["median_s"], res["standin"]["total"]["median_s"]
    res["ratio_real_to_standin"] = medians[0] / max(medians[1], 1e-9)
    res["timing"] = {"total_s": time.monotonic() - t0, "standin_s": t2 - t1, "kubelet_s": t3 - t2}
    res["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="PVC + pod runs per phase")
    parser.add_argument("--kube-nodes", type=int, default=2, help="real-kubelet UML nodes")
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
    if not 1 <= args.kube_nodes <= 8:
        print("--kube-nodes: 1 to 8", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    # Go binaries, helm, the nodes' images and system disk, the UML kernel: before leaving the
    # machine's network namespace (Go's module proxy, Debian's archive, PyPI)
    bins = tools()
    umlkernel.kernel()
    enter_private_netns()  # still one thread; gone with this process
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # clean up as on Ctrl-C
    shutil.rmtree(WORKDIR, ignore_errors=True)
    ok = False
    try:
        res = run(args, bins, t0)
        report(res)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(res, indent=2) + "\n")
            print(f"results: {args.json}")
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

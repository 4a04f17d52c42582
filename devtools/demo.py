"""``make demo``: TopoLVM as a user runs it, on a real control plane with UML nodes.

1. builds (first run) or checks the pinned Kubernetes components and helm, then, in a private
   network namespace, starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the
   snapshot CRDs and snapshot-controller, and 3 User-Mode Linux nodes with real LVM VGs;
2. ``helm install`` of charts/topolvm; the chart's controller containers run on the host and its
   topolvm-node container in each guest, exactly with the chart's flags and each with its
   ServiceAccount's token (devtools/testbed/chartpods.py);
3. a Vault StatefulSet (3 replicas, 10Gi data + 5Gi audit each) that kube-scheduler places by
   the CSIStorageCapacity objects csi-provisioner publishes;
4.-6. the kubelet stand-in mounts the volumes in the guests; files are written, a volume is
   resized online, a thin volume is snapshotted and restored;
7.-8. the cluster's view, then everything is removed and stopped.

Nothing outlives the process: its network namespace (and the TAP links in it) ends with it, and
every child process and UML guest is killed with it. Logs stay in .cache/demo/ until the next run.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass, field

from devtools import gobuild, uml
from devtools.demo_steps import (
    CAPACITY_COLUMNS,
    CLAIMS,
    LV_CRDS,
    NODE_VG_GIB,
    NS,
    PODS,
    RELEASE,
    RELEASE_NS,
    SC_THIN,
    VALUES,
    WORK,
    DemoBed,
    DemoError,
    Steps,
    capacities,
    capacity_annotations,
    claim,
    claim_state,
    gib,
    indent,
    items,
    kubectl,
    nothing_left,
    placed,
    pod,
    resize_pending,
    say,
    show_yaml,
    snapshot_objects,
    snapshot_ready,
    tools,
    until,
    vault_statefulset,
)
from devtools.testbed.chartpods import ControllerPod, Release, start_node_pod
from devtools.testbed.kubelet import KubeletStandIn
from devtools.testbed.process import become_subreaper, enter_private_netns, reap_leftovers
from devtools.testbed.umlnode import GiB
from topolvm.k8s.api import make_client

CHART = gobuild.ROOT / "charts" / "topolvm"
LVS = ("lvs", "-o", "lv_name,lv_size,lv_attr,pool_lv,origin,data_percent", "vg1")


@dataclass
class Demo(DemoBed):
    """Steps 2 to 8, on the test bed that step 1 started."""

    steps: Steps = field(default_factory=Steps)
    release: Release | None = None
    placement: dict[str, str] = field(default_factory=dict)  # pod -> node
    mounts: dict[tuple[str, str], str] = field(default_factory=dict)  # (pod, claim) -> path

    # --- 2 ------------------------------------------------------------------------------

    async def install(self) -> None:
        cp = self.kube
        self.release = rel = Release(cp, CHART, RELEASE, RELEASE_NS)
        say("  values.yaml:")
        show_yaml(VALUES)
        say(f"  $ helm install {RELEASE} charts/topolvm -n {RELEASE_NS} --create-namespace "
            "-f values.yaml --wait=false")  # fmt: skip
        say(indent(rel.install(VALUES)))
        cp.kubectl("wait", "--for=condition=established", "--timeout=60s",
                   *(f"crd/{c}" for c in LV_CRDS))  # fmt: skip
        [cm] = [d for d in rel.manifest() if d["kind"] == "ConfigMap"
                and "lvmd.yaml" in d.get("data", {})]  # fmt: skip
        for node in self.nodes:
            start_node_pod(rel, node, cm["data"]["lvmd.yaml"])
        self.node_pods = True
        say("  no kubelet here: the DaemonSet's topolvm-node container (lvmd embedded) runs in "
            "each UML guest, with its flags and its ServiceAccount's token")  # fmt: skip
        await until("the capacity annotations of every node",
                    lambda: all(capacity_annotations(cp).get(n.name, {}).get("ssd")
                                for n in self.nodes), 120, self.logs)  # fmt: skip
        selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=controller"

        def controller_pod() -> str | None:
            found = items(cp, "pods", "-n", RELEASE_NS, "-l", selector)
            return str(found[0]["metadata"]["name"]) if found else None

        name: str = await until("a Pod of the controller Deployment", controller_pod, 60)
        self.controller = ControllerPod(rel, self.bins, WORK / "controller", name).start()
        say(f"  the Deployment's pod {name}: its containers topolvm-controller, "
            "csi-provisioner, csi-resizer and csi-snapshotter run on the host, with their "
            "flags and the controller ServiceAccount's token")  # fmt: skip
        await until("CSIStorageCapacity objects for 3 nodes x 2 StorageClasses",
                    lambda: len(caps := capacities(cp)) >= 6
                    and all(v not in ("", "0") for v in caps.values()),
                    120, self.logs)  # fmt: skip

    # --- 3 ------------------------------------------------------------------------------

    async def place_vault(self) -> None:
        cp = self.kube
        kubectl(cp, "get", "csistoragecapacities", "-n", RELEASE_NS, "-o", CAPACITY_COLUMNS)
        free = {n: int(c["ssd"]) for n, c in capacity_annotations(cp).items()}
        say("  vault.yaml:")
        show_yaml(vault_statefulset())
        say("  $ kubectl apply -f vault.yaml")
        cp.apply(vault_statefulset())
        self.placement = await until(
            "the 3 vault pods scheduled and their 6 claims Bound",
            lambda: placed(cp, PODS, CLAIMS), 300, lambda: claim_state(cp) + "\n" + self.logs(),
        )  # fmt: skip
        kubectl(cp, "get", "events", "-n", NS, "--field-selector=reason=Scheduled",
                "-o", "custom-columns=KUBE-SCHEDULER:.message")  # fmt: skip
        say("  why: kube-scheduler keeps a node only if each claim fits its CSIStorageCapacity "
            "for the claim's StorageClass,\n  and prefers the node whose capacity the pod "
            "uses least (VolumeBinding, StorageCapacityScoring):")  # fmt: skip
        for node in self.nodes:
            room = free[node.name] // (15 * GiB)
            why = f"room for {room} replica{'s' if room > 1 else ''} of 10Gi + 5Gi"
            if free[node.name] < 10 * GiB:
                why = "a 10Gi claim does not fit"
            pods = [p for p, n in self.placement.items() if n == node.name] or ["none"]
            say(f"    {node.name}: VG {NODE_VG_GIB[node.name]} GiB, ssd free "
                f"{gib(free[node.name]):>9}: {why:<37} -> {', '.join(pods)}")  # fmt: skip
        say("  the nodes' capacity annotations now (csi-provisioner refreshes CSIStorageCapacity "
            "from them every minute):")  # fmt: skip
        kubectl(cp, "get", "nodes", "-o", "custom-columns=NODE:.metadata.name,"
                "SSD:.metadata.annotations.capacity\\.topolvm\\.io/ssd,"
                "THIN:.metadata.annotations.capacity\\.topolvm\\.io/thin")  # fmt: skip

    # --- 4 ------------------------------------------------------------------------------

    def df(self, pod_name: str, claim_name: str) -> str:
        node = self.node(self.placement[pod_name])
        out = node.exec("df", "-h", "--output=source,fstype,size,used,avail",
                        self.mounts[pod_name, claim_name]).stdout  # fmt: skip
        return " ".join(out.splitlines()[-1].split())

    async def mount(self, kubelet: KubeletStandIn) -> None:
        cp = self.kube
        for p in PODS:
            node = self.node(self.placement[p])
            for v in await kubelet.start_pod(p):
                self.mounts[p, v.pvc] = v.target
                path = f"{v.target}/hello.txt"
                node.exec("sh", "-c", f"echo '{v.pvc}: written by {p} on {node.name}' > {path}"
                          " && sync")  # fmt: skip
                text = node.exec("cat", path).stdout.strip()
                say(f"  {p} {v.pvc:<13} {node.name}  [{self.df(p, v.pvc)}]  hello.txt: {text}")
        say(f"  (where the kubelet mounts them: {self.mounts['vault-0', 'data-vault-0']})")
        columns = "custom-columns=POD:.metadata.name,NODE:.spec.nodeName,PHASE:.status.phase"
        kubectl(cp, "get", "pods", "-l", "app=vault", "-o", columns)
        for node in self.nodes:
            say(f"  $ lvm {' '.join(LVS)}    # on {node.name}")
            say(indent(node.lvm(*LVS)))

    # --- 5 ------------------------------------------------------------------------------

    async def resize(self, kubelet: KubeletStandIn) -> None:
        cp, pvc = self.kube, "data-vault-0"
        say(f"  before: {self.df('vault-0', pvc)}")
        patch = json.dumps({"spec": {"resources": {"requests": {"storage": "12Gi"}}}})
        say(f"  $ kubectl patch pvc {pvc} -p '{patch}'")
        cp.kubectl("patch", "pvc", pvc, "-n", NS, "--type=merge", "-p", patch)
        await until("csi-resizer's ControllerExpandVolume (condition FileSystemResizePending)",
                    lambda: resize_pending(cp, pvc), 180, self.logs)  # fmt: skip
        pv = cp.kubectl("get", "pvc", pvc, "-n", NS, "-o", "jsonpath={.spec.volumeName}")
        say("  csi-resizer -> ControllerExpandVolume -> LogicalVolume spec.size -> lvextend:")
        kubectl(cp, "get", "logicalvolumes.topolvm.io", pv)
        await kubelet.expand_pvc("vault-0", pvc)
        say("  kubelet stand-in: NodeExpandVolume on the mounted volume (xfs_growfs), then the "
            "PVC's status")  # fmt: skip
        say(f"  after:  {self.df('vault-0', pvc)}")
        node = self.node(self.placement["vault-0"])
        text = node.exec("cat", f"{self.mounts['vault-0', pvc]}/hello.txt").stdout.strip()
        say(f"  hello.txt still reads: {text}")
        kubectl(cp, "get", "pvc", pvc)

    # --- 6 ------------------------------------------------------------------------------

    async def snapshot(self, kubelet: KubeletStandIn) -> None:
        cp = self.kube
        say(f"  LVM snapshots need a thin pool: a 1Gi claim 'notes' on {SC_THIN} and a pod")
        cp.apply(claim("notes", "1Gi"), pod("notes-writer", "notes"))
        where = await until("notes-writer scheduled and notes Bound",
                            lambda: placed(cp, ["notes-writer"], ["notes"]), 180,
                            lambda: claim_state(cp) + "\n" + self.logs())  # fmt: skip
        node = self.node(where["notes-writer"])
        [src] = await kubelet.start_pod("notes-writer")
        node.exec("sh", "-c", f"echo 'written before the snapshot' > {src.target}/notes.txt"
                  " && sync")  # fmt: skip
        objs = snapshot_objects("topolvm-snapshots", "notes-snap", "notes")
        say("  $ kubectl apply -f snapshot.yaml")
        for i, obj in enumerate(objs):
            if i:
                say("    ---")
            show_yaml(obj)
        cp.apply(*objs)
        await until("VolumeSnapshot notes-snap readyToUse",
                    lambda: snapshot_ready(cp, "notes-snap"), 180, self.logs)  # fmt: skip
        kubectl(cp, "get", "volumesnapshot", "notes-snap")
        node.exec("sh", "-c", f"echo 'written after the snapshot' >> {src.target}/notes.txt"
                  " && sync")  # fmt: skip
        say(f"  restore: claim 'notes-restored' with dataSource notes-snap, read by a pod on "
            f"{node.name} (a thin snapshot stays in its origin's pool)")  # fmt: skip
        cp.apply(claim("notes-restored", "1Gi", source="notes-snap"),
                 pod("notes-reader", "notes-restored", node.name))  # fmt: skip
        await until("notes-reader scheduled and notes-restored Bound",
                    lambda: placed(cp, ["notes-reader"], ["notes-restored"]), 180,
                    lambda: claim_state(cp) + "\n" + self.logs())  # fmt: skip
        [restored] = await kubelet.start_pod("notes-reader")
        for label, vol in (("notes (origin)", src), ("notes-restored", restored)):
            text = node.exec("cat", f"{vol.target}/notes.txt").stdout.strip()
            say(f"  {label:<15} notes.txt: {text!r}")
        say(f"  $ lvm {' '.join(LVS)}    # on {node.name}")
        say(indent(node.lvm(*LVS)))

    # --- 8 ------------------------------------------------------------------------------

    async def remove(self, kubelet: KubeletStandIn) -> None:
        cp = self.kube

        async def delete_pods(*names: str) -> None:
            for name in names:  # the kubelet unmounts, then the pod object goes
                await kubelet.stop_pod(name)
                cp.kubectl("delete", "pod", name, "-n", NS, "--grace-period=0", "--force")

        await delete_pods("notes-reader")
        kubectl(cp, "delete", "pvc", "notes-restored", "--wait=false")
        kubectl(cp, "delete", "volumesnapshot", "notes-snap", "--wait=false")
        await delete_pods("notes-writer")
        kubectl(cp, "delete", "pvc", "notes", "--wait=false")
        kubectl(cp, "delete", "statefulset", "vault", "--cascade=orphan")
        await delete_pods(*PODS)
        say(f"  pods {', '.join(PODS)}, notes-writer, notes-reader: volumes unmounted, deleted")
        kubectl(cp, "delete", "pvc", *CLAIMS, "--wait=false")
        await until("every PV, LogicalVolume and VolumeSnapshotContent deleted",
                    lambda: nothing_left(cp), 180, self.logs)  # fmt: skip
        for node in self.nodes:
            left = [n for n, lv in node.lvs("vg1").items() if not lv["lv_attr"].startswith("t")]
            if left:
                raise DemoError(f"LVs left on {node.name}: {left}")
            say(f"  {node.name}: no LV left in vg1 but the thin pool pool0")
        kubectl(cp, "delete", "volumesnapshotclass", "topolvm-snapshots")
        say(f"  $ helm uninstall {RELEASE} -n {RELEASE_NS} --wait")
        assert self.release is not None
        say(indent(self.release.helm("uninstall", RELEASE, "-n", RELEASE_NS, "--wait")))
        self.stop_chart()
        say("  the chart's processes stopped (as the kubelet stops a deleted pod's containers)")
        cp.kubectl("delete", "pods", "--all", "-n", RELEASE_NS, "--grace-period=0", "--force")
        kubectl(cp, "delete", "namespace", RELEASE_NS, "--timeout=90s")
        kubectl(cp, "get", "pvc,pv,logicalvolumes.topolvm.io,volumesnapshots,"
                "csistoragecapacities,statefulsets,pods", "-A")  # fmt: skip

    # --- the whole run ------------------------------------------------------------------

    async def run(self) -> None:
        step = self.steps.step
        client = make_client(str(self.kube.kubeconfig))
        by_name = {n.name: n for n in self.nodes}

        async def mkdir(node: str, path: str) -> None:
            await by_name[node].aexec("mkdir", "-p", path)

        # The kubelet's root (/var/lib/kubelet) is /run/kubelet: the guests' own tmpfs.
        kubelet = KubeletStandIn(client, {n.name: n.csi_target for n in self.nodes}, mkdir,
                                 root="/run/kubelet")  # fmt: skip
        try:
            with step("helm install topolvm charts/topolvm (lvmd embedded; ssd and thin)"):
                await self.install()
            with step("StatefulSet vault: 3 x (10Gi data + 5Gi audit), placed by capacity"):
                await self.place_vault()
            with step("Mount the volumes (kubelet stand-in), write and read a file in each"):
                await self.mount(kubelet)
            with step("Resize data-vault-0 from 10Gi to 12Gi while mounted"):
                await self.resize(kubelet)
            with step("Snapshot a thin volume, restore it into a new claim"):
                await self.snapshot(kubelet)
            with step("kubectl get pvc,pv,logicalvolumes,csistoragecapacities -A"):
                kubectl(self.kube, "get",
                        "pvc,pv,logicalvolumes.topolvm.io,csistoragecapacities", "-A")  # fmt: skip
                kubectl(self.kube, "get", "volumesnapshots,volumesnapshotcontents", "-A")
                say("  the capacities (csi-provisioner refreshes them every minute):")
                kubectl(self.kube, "get", "csistoragecapacities", "-n", RELEASE_NS,
                        "-o", CAPACITY_COLUMNS)  # fmt: skip
            with step("Remove everything, stop everything"):
                await self.remove(kubelet)
                self.stop_all(verbose=True)
        finally:
            await kubelet.close()
            await client.close()


def main() -> int:
    if os.geteuid() != 0:
        say("make demo needs root (UML guests, TAP links, a network namespace, LVM)")
        return 1
    if reason := uml.available():
        say(f"make demo: {reason}")
        return 1
    say("TopoLVM demo: a real control plane, helm install of charts/topolvm, a Vault "
        "StatefulSet on 3 UML nodes with real LVM")  # fmt: skip
    become_subreaper()
    steps = Steps()
    demo: Demo | None = None
    code = 1
    try:
        with steps.step("Tools, control plane, 3 UML nodes with real LVM"):
            bins = tools()
            enter_private_netns()
            say("  in a private network namespace: the API server's ports and the guests' TAP "
                "links exist only there")  # fmt: skip
            demo = Demo(WORK, bins, steps=steps)
            demo.start_cluster()
        asyncio.run(demo.run())
        code = 0
    except (Exception, KeyboardInterrupt) as exc:
        why = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, KeyboardInterrupt):
            why = "interrupted"
        say(f"\nDEMO FAILED in step {steps.current or '?'}:\n{why}")
        say(f"logs: {WORK}/ (controlplane/logs, controller/logs, nodes/)")
    finally:
        if demo is not None:
            demo.stop_all()
        if left := reap_leftovers():
            say(f"  WARNING: killed processes left running: {', '.join(left)}")
    say("\nsteps:\n" + steps.summary())
    say("demo finished" if code == 0 else "demo failed; everything it started is stopped")
    return code


if __name__ == "__main__":
    sys.exit(main())

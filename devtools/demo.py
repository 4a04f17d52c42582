"""``make demo``: TopoLVM as a user runs it, on a real control plane with 3 real Kubernetes nodes.

1. builds (first run) or checks the pinned Kubernetes components, helm and the nodes' images,
   then, in a private network namespace, starts etcd, kube-apiserver, kube-controller-manager,
   kube-scheduler, the snapshot CRDs and snapshot-controller on the host, and 3 User-Mode Linux
   guests with real LVM VGs, each a Kubernetes node: containerd, runc, the kubelet, kube-proxy
   (devtools/demo_bed.py);
2. ``helm install`` of charts/topolvm: the kubelets run its pods in containerd (the controller
   Deployment's 4 containers, the topolvm-node DaemonSet with lvmd embedded);
3. a Vault StatefulSet (3 replicas, 10Gi data + 5Gi audit each) that kube-scheduler places by
   the CSIStorageCapacity objects csi-provisioner publishes;
4.-6. its busybox containers write into their volumes, read back with ``kubectl exec``; a pod
   replaced by the StatefulSet finds its data; a volume is resized online (``df`` in the
   container); a replica's audit claim gets an IO limit from a VolumeAttributesClass while it
   runs, its write rate measured before and after (devtools/demo_qos.py);
7.-9. a thin volume's snapshot is restored for a pod on another node, copied there by
   topolvm-node; vault-2's thick audit volume is snapshotted onto another node, deleted, and
   restored from there for a new vault-2; a fourth node joins and ``topolvm move`` moves the
   replica alone on its node there, both claims, while it runs (devtools/demo_data.py);
10.-11. the cluster's view, then everything is removed and stopped.

Nothing outlives the process: its network namespace (and the TAP links in it) ends with it, and
every child process and UML guest is killed with it. Logs stay in .cache/demo/ until the next run.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

from devtools import demo_qos, uml
from devtools.demo_bed import WORK, tools
from devtools.demo_data import VolumeSteps, claim_sizes, free_ssd
from devtools.demo_plan import (
    NODE_VG_GIB,
    PLACEMENT_ENV,
    PODS,
    RESIZED,
    RESIZED_TO,
    check_placement,
    check_resize,
    parse_placement,
    replica_claims,
)
from devtools.demo_steps import (
    CAPACITY_COLUMNS,
    CLAIMS,
    NODE_SELECTOR,
    NS,
    RELEASE,
    RELEASE_NS,
    VALUES,
    DemoError,
    Steps,
    capacities,
    capacity_annotations,
    claim_state,
    expanded,
    get_json,
    gib,
    in_pod,
    indent,
    kubectl,
    nothing_left,
    placed,
    placed_claims,
    restarts,
    say,
    show_yaml,
    until,
    vault_statefulset,
    webhook_trusted,
)
from devtools.testbed import chart
from devtools.testbed.process import become_subreaper, enter_private_netns, reap_leftovers
from devtools.testbed.umlnode import GiB
from topolvm.constants import NORMAL

LV_CRDS = ("logicalvolumes.topolvm.io", "logicalvolumes.topolvm.cybozu.com")
SECRET = "cat /vault/data/secret.txt"


@dataclass
class Demo(VolumeSteps):
    """Steps 2 to 11, on the test bed that step 1 started (6 in devtools/demo_qos.py, 7 to 9 in
    devtools/demo_data.py)."""

    steps: Steps = field(default_factory=Steps)

    # --- 2 ------------------------------------------------------------------------------

    def install(self) -> None:
        cp = self.kube
        self.release = rel = chart.Release(cp, RELEASE, RELEASE_NS)
        bed_values = chart.testbed_values(NODE_SELECTOR)
        say("  values.yaml:")
        show_yaml(VALUES)
        say("  testbed.yaml (devtools/testbed/chart.py): the images the nodes' containerd holds, "
            "never pulled; topolvm-node\n  registers with the kubelet and serves its liveness "
            "probe itself (csi-node-driver-registrar and\n  livenessprobe cannot be built here: "
            "not on the Go module proxy)")  # fmt: skip
        show_yaml(bed_values)
        say(f"  $ helm install {RELEASE} charts/topolvm -n {RELEASE_NS} --create-namespace "
            "-f values.yaml -f testbed.yaml")  # fmt: skip
        say(indent(rel.install(chart.merged(VALUES, bed_values))))
        self.installed = True
        cp.kubectl("wait", "--for=condition=established", "--timeout=60s",
                   *(f"crd/{c}" for c in LV_CRDS))  # fmt: skip
        rel.wait_running(1 + len(self.nodes), timeout=300)
        say("  the kubelets run the release's pods in containerd: the controller Deployment's "
            "4 containers, topolvm-node on every node")  # fmt: skip
        kubectl(cp, "get", "pods", "-n", RELEASE_NS, "-o", "wide")
        until("the capacity annotations of every node",
              lambda: all(capacity_annotations(cp).get(n.name, {}).get("ssd")
                          for n in self.nodes), 120, self.logs)  # fmt: skip
        until("CSIStorageCapacity objects for 3 nodes x 2 StorageClasses",
              lambda: len(caps := capacities(cp)) >= 6
              and all(v not in ("", "0") for v in caps.values()), 120, self.logs)  # fmt: skip
        until("the pod webhook trusted (topolvm-controller wrote its caBundle)",
              lambda: webhook_trusted(cp), 120, self.logs)  # fmt: skip

    # --- 3 ------------------------------------------------------------------------------

    def place_vault(self) -> None:
        cp = self.kube
        kubectl(cp, "get", "csistoragecapacities", "-n", RELEASE_NS, "-o", CAPACITY_COLUMNS)
        free = free_ssd(cp)
        forced = os.environ.get(PLACEMENT_ENV, "").strip()
        if forced:
            want = parse_placement(forced, free)
            check_placement(want, {p: replica_claims(p) for p in PODS}, free)
            say(f"  {PLACEMENT_ENV}={forced}: the replicas' claims are made first, each with "
                "its node in volume.kubernetes.io/selected-node (as kube-scheduler writes "
                "it); csi-provisioner creates them there and the replicas follow their "
                "claims")  # fmt: skip
            cp.apply(*placed_claims(want))
        say("  vault.yaml:")
        show_yaml(vault_statefulset())
        say("  $ kubectl apply -f vault.yaml")
        cp.apply(vault_statefulset())
        self.placement = until("the 3 vault pods scheduled and their 6 claims Bound",
                               lambda: placed(cp, PODS, CLAIMS), 300,
                               lambda: claim_state(cp) + "\n" + self.logs())  # fmt: skip
        if forced and self.placement != want:
            raise DemoError(f"{PLACEMENT_ENV} asked for {want}; the replicas run {self.placement}")
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

    def write(self) -> None:
        cp = self.kube
        for p in PODS:
            self.wait_ready(p)
        say("  each container wrote a secret into its data volume and a line into its audit "
            "volume at start")  # fmt: skip
        kubectl(cp, "get", "pods", "-l", "app=vault", "-o", "wide")
        for p in PODS:
            in_pod(cp, p, f"{SECRET}; df -h /vault/data /vault/audit")
        node = self.node(self.placement["vault-0"])
        mounts = [f"{m['target']}  {m['source']}  {m['fstype']}" for m in node.mounts().values()
                  if "kubernetes.io~csi" in m["target"]]  # fmt: skip
        say(f"  in {node.name}, topolvm-node mounted the LVs where the kubelet asked "
            "(NodePublishVolume):")  # fmt: skip
        say(indent("\n".join(mounts)))
        for n in self.nodes:
            self.lvs(n.name)
        # a pod replaced: same name (StatefulSet), same claims, so the same node and data
        old = get_json(cp, "pod", "vault-1", "-n", NS)
        kubectl(cp, "delete", "pod", "vault-1")
        say("  the kubelet stopped the container and topolvm-node unmounted its volumes; the "
            "StatefulSet makes vault-1 again:")  # fmt: skip
        new = self.wait_ready("vault-1", not_uid=old["metadata"]["uid"])
        kubectl(cp, "get", "pod", "vault-1", "-o", "wide")
        out = in_pod(cp, "vault-1", f"{SECRET}; cat /vault/audit/audit.log")
        if not out.startswith(f"secret of vault-1, first written on {old['spec']['nodeName']}"):
            raise DemoError(f"vault-1's replacement does not find its secret: {out!r}")
        if new["spec"]["nodeName"] != old["spec"]["nodeName"] or out.count("started on") != 2:
            raise DemoError(f"vault-1's replacement: {new['spec']['nodeName']}, {out!r}")
        say("  same node (the claims' volumes live there), the secret as first written, and "
            "the audit log with both starts")  # fmt: skip

    # --- 5 ------------------------------------------------------------------------------

    def resize(self) -> None:
        cp, pvc, pod = self.kube, RESIZED, RESIZED.removeprefix("data-")
        check_resize(self.placement, claim_sizes(cp), free_ssd(cp))
        before = in_pod(cp, pod, "df -h /vault/data").split()[-5]  # size
        size = f"{RESIZED_TO // GiB}Gi"
        patch = json.dumps({"spec": {"resources": {"requests": {"storage": size}}}})
        kubectl(cp, "patch", "pvc", pvc, "--type=merge", "-p", patch)
        until(f"{pvc} expanded (ControllerExpandVolume, then the kubelet's NodeExpandVolume)",
              lambda: expanded(cp, pvc), 180,
              lambda: claim_state(cp) + "\n" + self.logs())  # fmt: skip
        pv = cp.kubectl("get", "pvc", pvc, "-n", NS, "-o", "jsonpath={.spec.volumeName}")
        say("  csi-resizer -> ControllerExpandVolume -> LogicalVolume spec.size -> lvextend; "
            "then the kubelet -> NodeExpandVolume -> xfs_growfs:")  # fmt: skip
        kubectl(cp, "get", "logicalvolumes.topolvm.io", pv)
        kubectl(cp, "get", "events", "-n", NS, f"--field-selector=involvedObject.name={pvc}",
                "--sort-by=.lastTimestamp",
                "-o", "custom-columns=REASON:.reason,FROM:.source.component,"
                "MESSAGE:.message")  # fmt: skip
        after = in_pod(cp, pod, "df -h /vault/data").split()[-5]
        if after == before:
            raise DemoError(f"df in {pod} did not grow: {before} before, {after} after")
        in_pod(cp, pod, SECRET)
        say("  the same container, still running, sees the larger filesystem; the secret is "
            "still there")  # fmt: skip
        kubectl(cp, "get", "pvc", pvc)

    # --- 6 ------------------------------------------------------------------------------

    def io_limits(self) -> None:
        pod = "vault-0"
        demo_qos.limit_audit(self.kube, pod, self.node(self.placement[pod]), NORMAL.plugin)

    # --- 10 -----------------------------------------------------------------------------

    def view(self) -> None:
        cp = self.kube
        kubectl(cp, "get", "pvc,pv,logicalvolumes.topolvm.io,csistoragecapacities", "-A")
        kubectl(cp, "get", "volumesnapshots,volumesnapshotcontents", "-A")
        say("  the capacities (csi-provisioner refreshes them every minute):")
        kubectl(cp, "get", "csistoragecapacities", "-n", RELEASE_NS, "-o", CAPACITY_COLUMNS)
        kubectl(cp, "get", "pods", "-A", "-o", "wide")
        if restarted := restarts(cp, RELEASE_NS):
            raise DemoError(f"containers of the chart restarted: {', '.join(restarted)}\n"
                            f"{self.logs()}")  # fmt: skip
        say("  every container of the chart still in its first run (RESTARTS 0)")

    # --- 11 -----------------------------------------------------------------------------

    def remove(self) -> None:
        cp = self.kube
        kubectl(cp, "delete", "pod", "notes-reader", "notes-writer")
        kubectl(cp, "delete", "pvc", "notes-restored", "--wait=false")
        kubectl(cp, "delete", "volumesnapshot", "notes-snap", "audit-snap", "--wait=false")
        kubectl(cp, "delete", "pvc", "notes", "--wait=false")
        kubectl(cp, "delete", "volumemoves", "--all", "-n", NS)
        kubectl(cp, "delete", "statefulset", "vault", "--cascade=foreground")
        say("  the kubelets stopped the pods' containers, topolvm-node unmounted their volumes")
        kubectl(cp, "delete", "pvc", *CLAIMS, "--wait=false")
        until("every PV, LogicalVolume and VolumeSnapshotContent deleted",
              lambda: nothing_left(cp), 180,
              lambda: claim_state(cp) + "\n" + self.logs())  # fmt: skip
        for node in self.nodes:
            left = [n for n, lv in node.lvs("vg1").items() if not lv["lv_attr"].startswith("t")]
            if left:
                raise DemoError(f"LVs left on {node.name}: {left}")
            say(f"  {node.name}: no LV left in vg1 but the thin pool pool0")
        kubectl(cp, "delete", "volumesnapshotclass", "topolvm-snapshots", "topolvm-offnode")
        kubectl(cp, "delete", "volumeattributesclass", demo_qos.CLASS)
        self.uninstall()
        kubectl(cp, "delete", "namespace", RELEASE_NS, "--timeout=120s")
        say("  the kubelets stopped the chart's containers (the namespace is gone once its pods "
            "are)")  # fmt: skip
        kubectl(cp, "get", "pvc,pv,logicalvolumes.topolvm.io,volumesnapshots,"
                "csistoragecapacities,statefulsets,pods", "-A")  # fmt: skip
        left = get_json(cp, "csidrivers").get("items", [])
        if left:
            raise DemoError(f"CSIDrivers left: {[d['metadata']['name'] for d in left]}")

    # --- the whole run ------------------------------------------------------------------

    def run(self) -> None:
        step = self.steps.step
        with step("helm install topolvm charts/topolvm (lvmd embedded; ssd and thin)"):
            self.install()
        with step("StatefulSet vault: 3 x (10Gi data + 5Gi audit), placed by capacity"):
            self.place_vault()
        with step("The pods write into their volumes; a replaced pod finds its data"):
            self.write()
        with step("Resize data-vault-0 from 10Gi to 12Gi under the running container"):
            self.resize()
        with step("An IO limit for vault-0's audit claim: a VolumeAttributesClass, live"):
            self.io_limits()
        with step("Snapshot a thin volume, restore it on another node"):
            self.snapshot()
        with step("vault-2's audit volume: a snapshot kept on another node, restored from there"):
            self.seed()
        with step("A new node joins; topolvm move moves a Vault replica there, data and all"):
            self.move()
        with step("kubectl get pvc,pv,logicalvolumes,csistoragecapacities,pods -A"):
            self.view()
        with step("Remove everything, stop everything"):
            self.remove()
            self.stop_all(verbose=True)


def main() -> int:
    if os.geteuid() != 0:
        say("make demo needs root (UML guests, TAP links, a network namespace, LVM)")
        return 1
    if reason := uml.available():
        say(f"make demo: {reason}")
        return 1
    say("TopoLVM demo: a real control plane, helm install of charts/topolvm, a Vault "
        "StatefulSet on 3 Kubernetes nodes in UML with real LVM")  # fmt: skip
    become_subreaper()
    # the guests' disks on the host's disk, not in memory: the thick copies of steps 7 and 8
    # write zeros over GiBs of their targets, more than this machine's memory would hold
    os.environ.setdefault(uml.DISK_DIR_ENV, str(WORK.parent / "demo-disks"))
    steps = Steps()
    demo: Demo | None = None
    code = 1
    try:
        with steps.step("Tools, control plane, 3 Kubernetes nodes in UML with real LVM"):
            bins = tools()
            enter_private_netns()
            say("  in a private network namespace: the API server's ports, the guests' TAP "
                "links and the pods' addresses exist only there")  # fmt: skip
            demo = Demo(WORK, bins, steps=steps)
            demo.start_cluster()
        demo.run()
        code = 0
    except (Exception, KeyboardInterrupt) as exc:
        why = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, KeyboardInterrupt):
            why = "interrupted"
        say(f"\nDEMO FAILED in step {steps.current or '?'}:\n{why}")
        say(f"logs: {WORK}/ (controlplane/logs, chart/ (the pods' containers), nodes/ "
            "(consoles, kubelet, containerd))")  # fmt: skip
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

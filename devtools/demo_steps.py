"""What ``make demo`` (devtools/demo.py) prints, waits for and applies: step headers with their
times, ``kubectl`` output as a user would see it, polling with a clear timeout message, and the
objects a user writes (the chart's values, the Vault StatefulSet, the snapshot objects)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devtools import buildcache, gobuild, helm
from devtools.testbed.bed import CLUSTER_BINARIES, Testbed
from devtools.testbed.chartpods import ControllerPod
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import SIDECAR_BINARIES
from devtools.testbed.umlnode import UmlNode

GiB = 1 << 30
NS = "default"
RELEASE, RELEASE_NS = "topolvm", "topolvm-system"
# VG sizes: uml-1 is too small for a 10Gi claim (kube-scheduler must skip it), uml-2 has room for
# one replica (15 GiB), uml-3 for two; after its replicas neither node has room for another
# claim, so a replica can never get one claim on a node and miss the other.
NODE_VG_GIB = {"uml-1": 12, "uml-2": 22, "uml-3": 36}
THIN_POOL_GIB = 2
SSD = {"name": "ssd", "volume-group": "vg1", "default": True, "spare-gb": 1}
THIN = {"name": "thin", "volume-group": "vg1", "type": "thin", "spare-gb": 0,
        "thin-pool": {"name": "pool0", "overprovision-ratio": 5.0}}  # fmt: skip
SC, SC_THIN = "topolvm-provisioner", "topolvm-thin"
VALUES: dict[str, Any] = {
    "lvmd": {"managed": False, "deviceClasses": [SSD, THIN]},
    "node": {"lvmdEmbedded": True},
    "controller": {"replicaCount": 1},
    "snapshot": {"enabled": True},
    "storageClasses": [
        {"name": SC, "storageClass": {
            "fsType": "xfs", "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": True,
            "additionalParameters": {"topolvm.io/device-class": "ssd"}}},
        {"name": SC_THIN, "storageClass": {
            "fsType": "ext4", "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": True,
            "additionalParameters": {"topolvm.io/device-class": "thin"}}},
    ],
}  # fmt: skip
REPLICAS = 3
PODS = [f"vault-{i}" for i in range(REPLICAS)]
CLAIMS = [f"{t}-{p}" for p in PODS for t in ("data", "audit")]
CAPACITY_COLUMNS = (
    "custom-columns=NODE:.nodeTopology.matchLabels.topology\\.topolvm\\.io/node,"
    "STORAGECLASS:.storageClassName,CAPACITY:.capacity"
)


class DemoError(RuntimeError):
    """A step did not reach its goal; the message says what was awaited and what was seen."""


say = functools.partial(buildcache.say, stream=sys.stdout)  # the demo's story: on stdout


def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.rstrip().splitlines())


def gib(value: str | int | float) -> str:
    return f"{int(value) / GiB:.2f} GiB"


@dataclass
class Steps:
    """Numbered steps with their elapsed times; ``current`` names the step that is running."""

    started: float = field(default_factory=time.monotonic)
    done: list[tuple[str, float]] = field(default_factory=list)
    current: str = ""

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[None]:
        self.current = f"{len(self.done) + 1}. {title}"
        say(f"\n=== {self.current} ===")
        t0 = time.monotonic()
        yield
        self.done.append((self.current, time.monotonic() - t0))
        say(f"--- step {len(self.done)} done in {self.done[-1][1]:.1f}s")
        self.current = ""

    def summary(self) -> str:
        lines = [f"  {title:<72} {secs:6.1f}s" for title, secs in self.done]
        lines.append(f"  {'total':<72} {time.monotonic() - self.started:6.1f}s")
        return "\n".join(lines)


def kubectl(cp: ControlPlane, *args: str) -> None:
    """Run kubectl as the cluster admin; show the command and what it printed (stderr too, as
    in a terminal: "No resources found")."""
    say(f"  $ kubectl {shlex.join(args)}")
    res = subprocess.run([str(cp.bins["kubectl"]), f"--kubeconfig={cp.kubeconfig}", *args],
                         capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
    say(indent((res.stdout + res.stderr).strip() or "(no output)"))


def get_json(cp: ControlPlane, *args: str) -> Any:
    out = cp.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(out) if out.strip() else {}


def items(cp: ControlPlane, *args: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = get_json(cp, *args).get("items", [])
    return found


async def until(
    what: str,
    check: Callable[[], Any],
    timeout: float = 120,
    details: Callable[[], str] = lambda: "",
) -> Any:
    """Poll ``check()`` (a blocking call, e.g. kubectl) every second until it returns something
    truthy; raise :class:`DemoError` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = details()
            raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}"
                            + (f"\n{extra}" if extra else ""))  # fmt: skip
        await asyncio.sleep(1)


# --- objects as a user writes them ---------------------------------------------------------


def claim_template(name: str, size: str) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": SC,
                     "resources": {"requests": {"storage": size}}}}  # fmt: skip


def vault_statefulset() -> dict[str, Any]:
    """The seed's Vault: 3 replicas, each with a 10Gi data and a 5Gi audit volume. There is no
    container runtime here: the image is never pulled, the kubelet stand-in mounts volumes."""
    container = {"name": "vault", "image": "hashicorp/vault:1.18",
                 "volumeMounts": [{"name": "data", "mountPath": "/vault/data"},
                                  {"name": "audit", "mountPath": "/vault/audit"}]}  # fmt: skip
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "vault", "namespace": NS},
        "spec": {
            "serviceName": "vault", "replicas": REPLICAS, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "vault"}},
            "template": {"metadata": {"labels": {"app": "vault"}},
                         "spec": {"containers": [container]}},
            "volumeClaimTemplates": [claim_template("data", "10Gi"),
                                     claim_template("audit", "5Gi")],
        },
    }  # fmt: skip


def claim(name: str, size: str, source: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "storageClassName": SC_THIN,
                            "resources": {"requests": {"storage": size}}}  # fmt: skip
    if source:
        spec["dataSource"] = {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                              "name": source}  # fmt: skip
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}  # fmt: skip


def pod(name: str, claim_name: str, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "app", "image": "busybox:1.37",
                        "volumeMounts": [{"name": "vol", "mountPath": "/data"}]}],
        "volumes": [{"name": "vol", "persistentVolumeClaim": {"claimName": claim_name}}],
    }  # fmt: skip
    if node:  # a restored thin snapshot lives in its origin's pool, on the origin's node
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}  # fmt: skip


def snapshot_objects(snap_class: str, snap: str, source: str) -> list[dict[str, Any]]:
    group = "snapshot.storage.k8s.io/v1"
    return [{"apiVersion": group, "kind": "VolumeSnapshotClass", "metadata": {"name": snap_class},
             "driver": "topolvm.io", "deletionPolicy": "Delete"},
            {"apiVersion": group, "kind": "VolumeSnapshot",
             "metadata": {"name": snap, "namespace": NS},
             "spec": {"volumeSnapshotClassName": snap_class,
                      "source": {"persistentVolumeClaimName": source}}}]  # fmt: skip


def show_yaml(obj: dict[str, Any]) -> None:
    say(indent(yaml.safe_dump(obj, sort_keys=False, width=100)))


# --- what the cluster says -------------------------------------------------------------------


def capacity_annotations(cp: ControlPlane) -> dict[str, dict[str, str]]:
    """node -> {device class -> free bytes} from the Node annotations topolvm-node writes."""
    out = {}
    for node in items(cp, "nodes"):
        ann = node["metadata"].get("annotations") or {}
        out[node["metadata"]["name"]] = {
            k.removeprefix("capacity.topolvm.io/"): v
            for k, v in ann.items()
            if k.startswith("capacity.topolvm.io/") and k != "capacity.topolvm.io/00default"
        }
    return out


def capacities(cp: ControlPlane) -> dict[tuple[str, str], str]:
    """(node, StorageClass) -> capacity, from the CSIStorageCapacity objects."""
    found = {}
    for c in items(cp, "csistoragecapacities", "-n", RELEASE_NS):
        labels = (c.get("nodeTopology") or {}).get("matchLabels") or {}
        node = labels.get("topology.topolvm.io/node", "?")
        found[(node, c["storageClassName"])] = str(c.get("capacity", ""))
    return found


def placed(cp: ControlPlane, pods: list[str], claims: list[str]) -> dict[str, str] | None:
    """pod -> node once every pod of ``pods`` is scheduled and every claim is Bound."""
    nodes = {p["metadata"]["name"]: p["spec"].get("nodeName")
             for p in items(cp, "pods", "-n", NS)}  # fmt: skip
    phases = {c["metadata"]["name"]: c.get("status", {}).get("phase")
              for c in items(cp, "pvc", "-n", NS)}  # fmt: skip
    if all(nodes.get(p) for p in pods) and all(phases.get(c) == "Bound" for c in claims):
        return {p: str(nodes[p]) for p in pods}
    return None


def claim_state(cp: ControlPlane) -> str:
    """For a timeout message: the claims' phases and chosen nodes, and the latest events."""
    lines = []
    for c in items(cp, "pvc", "-n", NS):
        selected = c["metadata"].get("annotations", {}).get("volume.kubernetes.io/selected-node")
        lines.append(f"{c['metadata']['name']}: {c.get('status', {}).get('phase')}, "
                     f"selected node {selected or '-'}")  # fmt: skip
    events = cp.kubectl("get", "events", "-n", NS, "--sort-by=.lastTimestamp", check=False)
    return "claims:\n" + indent("\n".join(lines)) + "\nevents:\n" + indent(events[-3000:])


def snapshot_ready(cp: ControlPlane, name: str) -> bool:
    snap = get_json(cp, "volumesnapshot", name, "-n", NS)
    return bool(snap.get("status", {}).get("readyToUse"))


def resize_pending(cp: ControlPlane, claim_name: str) -> bool:
    obj = get_json(cp, "pvc", claim_name, "-n", NS)
    conds = obj.get("status", {}).get("conditions") or []
    return any(c["type"] == "FileSystemResizePending" for c in conds)


def nothing_left(cp: ControlPlane) -> bool:
    return not any(items(cp, kind) for kind in
                   ("pv", "logicalvolumes.topolvm.io", "volumesnapshotcontents"))  # fmt: skip


# --- the test bed ----------------------------------------------------------------------------

NEEDED = (*CLUSTER_BINARIES, *SIDECAR_BINARIES)
WORK = gobuild.ROOT / ".cache" / "demo"
LV_CRDS = ("logicalvolumes.topolvm.io", "logicalvolumes.topolvm.cybozu.com")


def tools() -> dict[str, Path]:
    """The pinned Kubernetes components (built on the first run) and helm, fetched before the
    process leaves the machine's network namespace."""
    wanted = set(NEEDED)
    cold = [g for g in gobuild.GROUPS if (set(g.binaries) | set(g.files)) & wanted
            and not (gobuild.cache_dir(g) / ".complete").exists()]  # fmt: skip
    if cold:
        say("  first run: building Kubernetes components from Go modules, this takes a few "
            f"minutes (up to {sum(g.cold_minutes for g in cold)} on 2 cores with empty Go "
            f"caches; kept in {gobuild.CACHE})")  # fmt: skip
    bins = gobuild.ensure(*NEEDED)
    pins = gobuild.versions()
    built = [f"{name} {pins.get(pkg, '?')}" for g in gobuild.GROUPS
             for name, pkg in g.binaries.items()
             if name in wanted and name != "kubectl"]  # fmt: skip
    say(f"  built from pinned Go modules: {', '.join(built)}")
    helm_bin = helm.helm()
    version = subprocess.run([str(helm_bin), "version", "--short"], capture_output=True,
                             text=True, check=False).stdout.strip()  # fmt: skip
    say(f"  helm {version} ({helm_bin})")
    return bins


def keep_node_log(node: UmlNode) -> None:
    """topolvm-node's whole log beside the guest's console, for a failed run."""
    with contextlib.suppress(Exception):
        (node.workdir / f"{node.name}.topolvm-node.log").write_text(node.node_log(lines=0))


@dataclass
class DemoBed(Testbed):
    """The test bed (devtools/testbed/bed.py) as step 1 starts it, and once the chart is
    installed its processes; :meth:`stop_all` stops them all."""

    before_node_stop: Callable[[UmlNode], None] | None = keep_node_log
    controller: ControllerPod | None = None
    node_pods: bool = False

    def logs(self) -> str:
        """Tails of the driver's logs, for a timeout message."""
        logs = self.controller.logs() if self.controller else {}
        parts = [f"{name}:\n{indent(text[-1500:])}" for name, text in logs.items()]
        for n in self.nodes if self.node_pods else []:
            with contextlib.suppress(Exception):
                parts.append(f"topolvm-node on {n.name}:\n{indent(n.node_log(lines=15))}")
        return "\n".join(parts)

    def start_cluster(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
        # A fresh cluster has no LogicalVolume CRDs: the chart installs them. (Deleting the test
        # bed's right after it applied them could hang in the API server's CRD finalizer.)
        cp = self.start_control_plane(crds=False)
        say(f"  control plane up in {cp.started_in:.1f}s: etcd, kube-apiserver, "
            f"kube-controller-manager, kube-scheduler (logs in {cp.workdir / 'logs'})")  # fmt: skip
        self.start_snapshot_controller()
        say("  cluster add-ons, as on any cluster with snapshots: VolumeSnapshot CRDs, "
            "snapshot-controller")  # fmt: skip
        for index, (name, size) in enumerate(NODE_VG_GIB.items(), start=1):
            node = self.start_node(name, index, size, disks=(size * GiB,))
            node.lvm("lvcreate", "-T", "vg1/pool0", "-L", f"{THIN_POOL_GIB}g")
            say(f"  {name}: UML guest at {node.address}, VG vg1 of {size} GiB on "
                f"{node.disk_devices[0]} with thin pool pool0 ({THIN_POOL_GIB} GiB); "
                "Node and CSINode registered")  # fmt: skip
        self.defer("the chart's processes", self.stop_chart)  # step 2 starts them

    def stop_chart(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None
        if self.node_pods:
            self.node_pods = False
            for n in self.nodes:
                with contextlib.suppress(Exception):
                    n.stop_topolvm_node()

    def stop_all(self, verbose: bool = False) -> None:
        """Stop whatever runs; safe to call twice. Each part is stopped whatever the others do."""
        self.teardown(warn=lambda line: say(f"  {line}"))
        if verbose:
            say("  stopped: UML nodes (their disks were in /dev/shm, gone), snapshot-controller, "
                "control plane; the network namespace ends with this process")  # fmt: skip

"""What ``make demo`` (devtools/demo.py) prints, waits for and applies: step headers with their
times, ``kubectl`` output as a user would see it, polling with a clear timeout message, the
objects a user writes (the chart's values, the Vault StatefulSet, the snapshot objects, busybox
pods) and what the demo reads back from the cluster. The test bed it runs on is in
devtools/demo_bed.py."""

from __future__ import annotations

import contextlib
import functools
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from devtools import buildcache, nodeimages
from devtools.demo_plan import CLAIM_SIZES, PODS, REPLICAS, SPARE_GIB, replica_claims
from devtools.testbed.controlplane import ControlPlane

GiB = 1 << 30
NS = "default"
RELEASE, RELEASE_NS = "topolvm", "topolvm-system"
# VG sizes (NODE_VG_GIB): uml-1 is too small for a 10Gi claim (kube-scheduler must skip it),
# uml-2 has room for one replica (15 GiB), uml-3 for two; after its replicas neither node has
# room for another claim, so a replica can never get one claim on a node and miss the other.
# Which replica lands alone on uml-2 is kube-scheduler's choice (devtools/demo_plan.py).
SSD = {"name": "ssd", "volume-group": "vg1", "default": True, "spare-gb": SPARE_GIB}
THIN = {"name": "thin", "volume-group": "vg1", "type": "thin", "spare-gb": 0,
        "thin-pool": {"name": "pool0", "overprovision-ratio": 5.0}}  # fmt: skip
SC, SC_THIN = "topolvm-provisioner", "topolvm-thin"
VALUES: dict[str, Any] = {
    "lvmd": {"managed": False, "deviceClasses": [SSD, THIN]},
    "node": {"lvmdEmbedded": True},
    "controller": {"replicaCount": 1},
    "snapshot": {"enabled": True},
    # the pod webhook holds the pod of a claim being moved (step 8), so that its StatefulSet
    # cannot start it again on the old node meanwhile; its certificate made by
    # topolvm-controller (no cert-manager here)
    "webhook": {"certManager": False, "podMutatingWebhook": {"enabled": True}},
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
NODE_SELECTOR = {"kubernetes.io/os": "linux"}  # every node of the demo: the kubelet sets it
CLAIMS = [c for p in PODS for c in replica_claims(p)]
COPY_COLUMNS = (
    "custom-columns=LOGICALVOLUME:.metadata.name,NODE:.spec.nodeName,SIZE:.status.currentSize,"
    "COPY:.status.copy.phase,FROM:.status.copy.sourceNode,MOVED:.status.copy.transferredBytes"
)
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


def kubectl(cp: ControlPlane, *args: str, check: bool = True) -> str:
    """Run kubectl as the cluster admin; show the command and what it printed (stderr too, as
    in a terminal: "No resources found"), return its stdout. A failure raises
    :class:`DemoError` (with ``check``)."""
    say(f"  $ kubectl {shlex.join(args)}")
    try:
        res = subprocess.run([str(cp.bins["kubectl"]), f"--kubeconfig={cp.kubeconfig}", *args],
                             capture_output=True, text=True, check=False, timeout=180)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise DemoError(f"kubectl {shlex.join(args)}: no answer within 180s") from exc
    say(indent((res.stdout + res.stderr).strip() or "(no output)"))
    if check and res.returncode != 0:
        raise DemoError(f"kubectl {shlex.join(args)} exited {res.returncode}: "
                        f"{res.stderr.strip()}")  # fmt: skip
    return res.stdout


def in_pod(cp: ControlPlane, pod_name: str, script: str) -> str:
    """``sh -c script`` in the pod's container (kubectl exec through the API server and the
    pod's kubelet), shown as a user types it."""
    return kubectl(cp, "exec", pod_name, "--", "sh", "-c", script)


def get_json(cp: ControlPlane, *args: str) -> Any:
    out = cp.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(out) if out.strip() else {}


def items(cp: ControlPlane, *args: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = get_json(cp, *args).get("items", [])
    return found


def until(
    what: str,
    check: Callable[[], Any],
    timeout: float = 120,
    details: Callable[[], str] = lambda: "",
) -> Any:
    """Call ``check()`` (e.g. kubectl) every second until it returns something truthy; raise
    :class:`DemoError` naming ``what`` after ``timeout`` seconds, with ``details()``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = details()
            raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}"
                            + (f"\n{extra}" if extra else ""))  # fmt: skip
        time.sleep(1)


# --- objects as a user writes them ---------------------------------------------------------


def container(script: str, mounts: dict[str, str]) -> dict[str, Any]:
    """A busybox container (the image every node's containerd holds, devtools/nodeimages.py)
    that runs ``script`` with the volumes ``mounts`` (name -> path), then sleeps. It is started
    once the script has touched /tmp/started (a startup probe), so what it writes is there
    when the pod is Ready."""
    env = [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
           for name, path in (("POD_NAME", "metadata.name"), ("POD_UID", "metadata.uid"),
                              ("NODE_NAME", "spec.nodeName"))]  # fmt: skip
    return {"name": "app", "image": nodeimages.busybox().name, "env": env,
            "command": ["sh", "-c", f"{script}\nsync\ntouch /tmp/started\nexec sleep 1000000"],
            "startupProbe": {"exec": {"command": ["test", "-e", "/tmp/started"]},
                             "periodSeconds": 1, "failureThreshold": 120},
            "volumeMounts": [{"name": n, "mountPath": p} for n, p in mounts.items()]}  # fmt: skip


VAULT_SCRIPT = """\
cd /vault
[ -s data/secret.txt ] ||
  echo "secret of $POD_NAME, first written on $NODE_NAME at $(date -u +%T)" > data/secret.txt
echo "$(date -u +%T) $POD_NAME (uid ${POD_UID%%-*}) started on $NODE_NAME" >> audit/audit.log"""


def claim_template(name: str, size: str) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": SC,
                     "resources": {"requests": {"storage": size}}}}  # fmt: skip


def placed_claims(placement: dict[str, str]) -> list[dict[str, Any]]:
    """The replicas' claims as the StatefulSet would make them, each with the node it is to be
    on in ``volume.kubernetes.io/selected-node`` (what kube-scheduler writes when it picks a
    node for a WaitForFirstConsumer claim): csi-provisioner creates the volume there, and
    kube-scheduler then puts the replica where its claims are (TOPOLVM_DEMO_PLACEMENT)."""
    out = []
    for pod, node in placement.items():
        for kind, size in CLAIM_SIZES:
            obj = claim_template(f"{kind}-{pod}", f"{size // GiB}Gi")
            obj["metadata"].update(
                namespace=NS, labels={"app": "vault"},
                annotations={"volume.kubernetes.io/selected-node": node},
            )  # fmt: skip
            out.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim", **obj})
    return out


def vault_statefulset() -> dict[str, Any]:
    """The seed's Vault: 3 replicas, each with a 10Gi data and a 5Gi audit volume; a busybox
    container stands for Vault: it writes a secret once and an audit line at every start."""
    app = container(VAULT_SCRIPT, {"data": "/vault/data", "audit": "/vault/audit"})
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "vault", "namespace": NS},
        "spec": {
            "serviceName": "vault", "replicas": REPLICAS, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "vault"}},
            "template": {"metadata": {"labels": {"app": "vault"}},
                         "spec": {"terminationGracePeriodSeconds": 1, "containers": [app]}},
            "volumeClaimTemplates": [claim_template(kind, f"{size // GiB}Gi")
                                     for kind, size in CLAIM_SIZES],
        },
    }  # fmt: skip


def claim(name: str, size: str, source: str | None = None,
          storage_class: str = SC_THIN) -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class,
                            "resources": {"requests": {"storage": size}}}  # fmt: skip
    if source:
        spec["dataSource"] = {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                              "name": source}  # fmt: skip
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}  # fmt: skip


def pod(name: str, claim_name: str, script: str = ":", node: str | None = None) -> dict[str, Any]:
    """A busybox pod with ``claim_name`` at /notes that runs ``script``, on ``node`` if given."""
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1, "containers": [container(script, {"vol": "/notes"})],
        "volumes": [{"name": "vol", "persistentVolumeClaim": {"claimName": claim_name}}],
    }  # fmt: skip
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}  # fmt: skip


def snapshot_objects(snap_class: str, snap: str, source: str,
                     params: dict[str, str] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    group = "snapshot.storage.k8s.io/v1"
    klass = {"apiVersion": group, "kind": "VolumeSnapshotClass", "metadata": {"name": snap_class},
             "driver": "topolvm.io", "deletionPolicy": "Delete"}  # fmt: skip
    if params:
        klass["parameters"] = params
    return [klass,
            {"apiVersion": group, "kind": "VolumeSnapshot",
             "metadata": {"name": snap, "namespace": NS},
             "spec": {"volumeSnapshotClassName": snap_class,
                      "source": {"persistentVolumeClaimName": source}}}]  # fmt: skip


class _Dumper(yaml.SafeDumper):
    """YAML as a user writes it: scripts as literal blocks, no anchors for repeated values."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    return dumper.represent_scalar(
        "tag:yaml.org,2002:str", data, style="|" if "\n" in data else None
    )


_Dumper.add_representer(str, _str)


def show_yaml(obj: dict[str, Any]) -> None:
    say(indent(yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=100)))


# --- what the cluster says -------------------------------------------------------------------


def webhook_trusted(cp: ControlPlane) -> bool:
    """The release's MutatingWebhookConfiguration carries the caBundle topolvm-controller wrote
    (until then the API server cannot call the pod webhook, and pods are not admitted)."""
    hooks = [h for c in items(cp, "mutatingwebhookconfigurations")
             if "topolvm" in c["metadata"]["name"] for h in c.get("webhooks") or []]  # fmt: skip
    return bool(hooks) and all((h.get("clientConfig") or {}).get("caBundle") for h in hooks)


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


def placed(cp: ControlPlane, pods: Sequence[str], claims: Sequence[str]) -> dict[str, str] | None:
    """pod -> node once every pod of ``pods`` is scheduled and every claim is Bound."""
    nodes = {p["metadata"]["name"]: p["spec"].get("nodeName")
             for p in items(cp, "pods", "-n", NS)}  # fmt: skip
    phases = {c["metadata"]["name"]: c.get("status", {}).get("phase")
              for c in items(cp, "pvc", "-n", NS)}  # fmt: skip
    if all(nodes.get(p) for p in pods) and all(phases.get(c) == "Bound" for c in claims):
        return {p: str(nodes[p]) for p in pods}
    return None


def ready_pod(cp: ControlPlane, name: str, not_uid: str = "") -> dict[str, Any] | None:
    """The pod once it is Ready (its containers started: the kubelet published its volumes),
    unless it is the pod with uid ``not_uid`` (one that was deleted and not yet replaced)."""
    obj = get_json(cp, "pod", name, "-n", NS)
    if not obj or obj["metadata"]["uid"] == not_uid:
        return None
    conds = obj.get("status", {}).get("conditions") or []
    return obj if any(c["type"] == "Ready" and c["status"] == "True" for c in conds) else None


def claim_state(cp: ControlPlane) -> str:
    """For a timeout message: the claims' phases and chosen nodes, the pods' phases, and the
    latest events."""
    lines = []
    for c in items(cp, "pvc", "-n", NS):
        selected = c["metadata"].get("annotations", {}).get("volume.kubernetes.io/selected-node")
        lines.append(f"{c['metadata']['name']}: {c.get('status', {}).get('phase')}, "
                     f"selected node {selected or '-'}")  # fmt: skip
    for p in items(cp, "pods", "-n", NS):
        lines.append(f"pod {p['metadata']['name']}: {p.get('status', {}).get('phase')} on "
                     f"{p['spec'].get('nodeName') or '-'}")  # fmt: skip
    events = cp.kubectl("get", "events", "-n", NS, "--sort-by=.lastTimestamp", check=False)
    return "claims and pods:\n" + indent("\n".join(lines)) + "\nevents:\n" + indent(events[-3000:])


def snapshot_ready(cp: ControlPlane, name: str) -> bool:
    snap = get_json(cp, "volumesnapshot", name, "-n", NS)
    return bool(snap.get("status", {}).get("readyToUse"))


def snapshot_volume(cp: ControlPlane, name: str) -> dict[str, Any]:
    """The LogicalVolume that holds VolumeSnapshot ``name``'s data (its content's handle is the
    LogicalVolume's volume id)."""
    snap = get_json(cp, "volumesnapshot", name, "-n", NS)
    content = get_json(cp, "volumesnapshotcontent",
                       snap["status"]["boundVolumeSnapshotContentName"])  # fmt: skip
    handle = content["status"]["snapshotHandle"]
    return next(lv for lv in items(cp, "logicalvolumes.topolvm.io")
                if lv.get("status", {}).get("volumeID") == handle)  # fmt: skip


def expanded(cp: ControlPlane, claim_name: str) -> bool:
    """The claim's status shows the size it asks for and no resize is pending: csi-resizer
    (ControllerExpandVolume) and the kubelet (NodeExpandVolume) both did their part."""
    obj = get_json(cp, "pvc", claim_name, "-n", NS)
    status = obj.get("status", {})
    conds = [c["type"] for c in status.get("conditions") or []]
    want = obj.get("spec", {}).get("resources", {}).get("requests", {}).get("storage")
    return (
        bool(want)
        and status.get("capacity", {}).get("storage") == want
        and not ({"Resizing", "FileSystemResizePending"} & set(conds))
    )


def restarts(cp: ControlPlane, namespace: str) -> list[str]:
    """pod/container (restarts) for every container in ``namespace`` that was restarted."""
    return [f"{p['metadata']['name']}/{s['name']} ({s['restartCount']})"
            for p in items(cp, "pods", "-n", namespace)
            for s in p.get("status", {}).get("containerStatuses") or []
            if s.get("restartCount")]  # fmt: skip


def nothing_left(cp: ControlPlane) -> bool:
    return not any(items(cp, kind) for kind in
                   ("pv", "logicalvolumes.topolvm.io", "volumesnapshotcontents"))  # fmt: skip

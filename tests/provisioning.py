"""Objects and checks the provisioning tests share: StorageClasses, claims and pods as a user
writes them, pods run by the real kubelets of the test's nodes, and the "nothing left behind"
assertion of upstream's e2e suite (no LV, and every node's capacity annotations as before the
test)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import ALL_NS, AsyncClient
from lightkube.resources.core_v1 import Event, PersistentVolume, PersistentVolumeClaim, Pod
from lightkube.resources.storage_v1 import CSIStorageCapacity

from devtools import nodeimages
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.kubelet import block_target, mount_target
from devtools.testbed.process import HarnessError
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import GROUP_LABEL, NodeSet, node_annotations, unique
from tests.helpers import eventually
from topolvm.constants import NORMAL, Names
from topolvm.k8s import api
from topolvm.k8s.lvobject import parse_quantity

GiB = 1 << 30
MiB = 1 << 20
NS = "default"


@functools.cache
def busybox() -> str:
    """The workloads' image, in every Kubernetes node's containerd (devtools/nodeimages.py)."""
    return nodeimages.busybox().name


def storage_class(
    name: str, device_class: str | None = "ssd", fs_type: str | None = "xfs", *,
    binding: str = "WaitForFirstConsumer", names: Names = NORMAL,
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    params: dict[str, str] = dict(extra or {})
    if device_class is not None:
        params[names.device_class_param] = device_class
    if fs_type:
        params["csi.storage.k8s.io/fstype"] = fs_type
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name}, "provisioner": names.plugin,
            "volumeBindingMode": binding, "allowVolumeExpansion": True,
            "parameters": params}  # fmt: skip


def claim(
    name: str, sc: str, size: str, *, block: bool = False,
    source: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"], "storageClassName": sc,
        "volumeMode": "Block" if block else "Filesystem",
        "resources": {"requests": {"storage": size}},
    }  # fmt: skip
    if source:
        spec["dataSourceRef"] = source
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}  # fmt: skip


def pod(
    name: str, group: str, claims: Iterable[str] = (), *, block: Iterable[str] = (),
    ephemeral: dict[str, Any] | None = None, scheduler: str = "default-scheduler",
    script: str = "sleep 1000000", security: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A pod that runs ``script`` in busybox with ``claims`` mounted at ``/<claim>``, ``block``
    claims at ``/dev/<claim>`` and an ephemeral volume at ``/scratch``, on a node of ``group``."""
    mounts = [{"name": c, "mountPath": f"/{c}"} for c in claims]
    devices = [{"name": c, "devicePath": f"/dev/{c}"} for c in block]
    volumes: list[dict[str, Any]] = [
        {"name": c, "persistentVolumeClaim": {"claimName": c}} for c in [*claims, *block]
    ]
    if ephemeral is not None:
        volumes.append({"name": "scratch", "ephemeral": {"volumeClaimTemplate": ephemeral}})
        mounts.append({"name": "scratch", "mountPath": "/scratch"})
    container: dict[str, Any] = {"name": "app", "image": busybox(),
                                 "command": ["sh", "-c", script]}  # fmt: skip
    if mounts:
        container["volumeMounts"] = mounts
    if devices:
        container["volumeDevices"] = devices
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"schedulerName": scheduler, "nodeSelector": {GROUP_LABEL: group},
                     "terminationGracePeriodSeconds": 1, "securityContext": security or {},
                     "containers": [container], "volumes": volumes}}  # fmt: skip


async def pvc(client: AsyncClient, name: str) -> dict[str, Any] | None:
    return await api.get(client, PersistentVolumeClaim, name, namespace=NS)


async def bound(client: AsyncClient, name: str, timeout: float = 120) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        obj = await pvc(client, name)
        return obj if obj and obj.get("status", {}).get("phase") == "Bound" else None

    result: dict[str, Any] = await eventually(f"PVC {name} Bound", check, timeout=timeout)
    return result


async def scheduled(client: AsyncClient, name: str, timeout: float = 120) -> str:
    async def check() -> str | None:
        obj = await api.get(client, Pod, name, namespace=NS)
        return None if obj is None else obj["spec"].get("nodeName")

    node: str = await eventually(f"pod {name} scheduled", check, timeout=timeout)
    return node


async def unschedulable_message(
    client: AsyncClient, name: str, expected: str = "", timeout: float = 120
) -> str:
    """The PodScheduled=False message kube-scheduler wrote for the pod, once it contains
    ``expected``. (Before csi-provisioner re-publishes capacity, kube-scheduler may still pick
    a node that just filled up; the controller then refuses it with RESOURCE_EXHAUSTED, the
    message is "provisioning failed", and the pod is scheduled again.)"""
    seen: list[str] = []

    async def check() -> str | None:
        obj = await api.get(client, Pod, name, namespace=NS)
        for c in (obj or {}).get("status", {}).get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("message"):
                seen.append(str(c["message"]))
                return seen[-1] if expected in seen[-1] else None
            if c["type"] == "PodScheduled" and c["status"] == "True":
                raise AssertionError(f"pod {name} was scheduled; messages before: {seen}")
        return None

    msg: str = await eventually(
        f"pod {name} unschedulable with {expected!r}", check, timeout=timeout,
        details=lambda: f"messages seen: {seen[-3:]}",
    )  # fmt: skip
    return msg


async def events_for(client: AsyncClient, kind: str, name: str) -> list[str]:
    items, _ = await api.list_all(
        client, Event, namespace=NS,
        fields={"involvedObject.name": name, "involvedObject.kind": kind},
    )  # fmt: skip
    return [f"{e.get('reason')}: {e.get('message')}" for e in items]


@dataclass
class Published:
    """A volume the kubelet published for a pod: where (in the node), and what."""

    pvc: str
    pv: str
    volume_id: str
    target: str
    block: bool


async def published(client: AsyncClient, pod_obj: dict[str, Any]) -> list[Published]:
    """The pod's claims (persistent and generic ephemeral) and their publish targets."""
    found = []
    uid, pod_name = pod_obj["metadata"]["uid"], pod_obj["metadata"]["name"]
    for vol in pod_obj["spec"].get("volumes", []):
        if "persistentVolumeClaim" in vol:
            claim_name = vol["persistentVolumeClaim"]["claimName"]
        elif "ephemeral" in vol:
            claim_name = f"{pod_name}-{vol['name']}"
        else:
            continue
        claimed = await pvc(client, claim_name)
        assert claimed is not None, claim_name
        pv = await api.get(client, PersistentVolume, claimed["spec"]["volumeName"])
        assert pv is not None
        block = pv["spec"].get("volumeMode") == "Block"
        pv_name = pv["metadata"]["name"]
        target = block_target(uid, pv_name) if block else mount_target(uid, pv_name)
        found.append(Published(claim_name, pv_name, pv["spec"]["csi"]["volumeHandle"], target,
                               block))  # fmt: skip
    return found


@contextlib.contextmanager
def shared_nodes(
    cp: ControlPlane, workdir: Path, prefix: str, vg_gib: list[float],
    device_classes: list[dict[str, Any]], *, disks: int = 2,
    prepare: Callable[[UmlNode], None] | None = None, extra: Sequence[str] = (),
    kubelet: bool = True,
) -> Iterator[list[UmlNode]]:  # fmt: skip
    """UML nodes for a whole test module, Kubernetes nodes that run the tests' pods (with
    ``kubelet``), each running topolvm-node with ``device_classes``; ``prepare`` makes more VGs
    before the node starts."""
    node_set = NodeSet(cp, prefix, workdir)
    try:
        nodes = node_set.make(len(vg_gib), vg_gib=vg_gib, disks=disks, kubelet=kubelet)
        for n in nodes:
            if prepare is not None:
                prepare(n)
            n.start_topolvm_node(cp, device_classes, *extra)
        yield nodes
    finally:
        node_set.close()


# the processes of a pod's start and stop in a guest (a CNI plugin or runc that hangs shows here)
RUNTIME_PROCS = ("bridge", "host-local", "loopback", "runc", "containerd-shim", "pause", "mount")
# what containerd's goroutine dump (SIGUSR1) shows of the calls that start and stop pods
STUCK_CALLS = (
    "RunPodSandbox", "StopPodSandbox", "RemovePodSandbox", "CreateContainer", "StartContainer",
    "setupPodNetwork", "teardownPodNetwork", "libcni",
)  # fmt: skip


def runtime_logs(nodes: Iterable[UmlNode], lines: int = 15) -> str:
    """For a pod that does not start or stop (a sandbox that hangs shows on its node, not in the
    pod's events), each node's: processes of the pod runtime older than a minute, the calls
    containerd is in (its goroutine dump, SIGUSR1), and the last lines of the kubelet and
    containerd. Short, and first in a failure's message (a CI log keeps its start)."""
    out = []
    for n in nodes:
        try:
            ps = n.exec("ps", "-eo", "pid,etimes,stat,wchan:24,args", check=False, timeout=20)
            old = [ln[:200] for ln in ps.stdout.splitlines()[1:]
                   if any(p in ln for p in RUNTIME_PROCS) and int(ln.split()[1]) > 60]  # fmt: skip
            out.append(f"{n.name} runtime processes over 60 s old:\n" + "\n".join(old[-20:]))
            out.append(f"{n.name} containerd is in: {_containerd_calls(n)}")
            for daemon in ("kubelet", "containerd"):
                d = n.daemon(daemon, lines, timeout=20)
                state = "running" if d.get("running") else f"exited {d.get('rc')}"
                out.append(f"{n.name} {daemon} ({state}):\n{str(d.get('log', ''))[-3000:]}")
        except HarnessError as e:  # a guest that stopped answering is the finding
            out.append(f"{n.name}: {e}")
    return "\n".join([*out, f"host kernel: {_host_kernel_news()}"])


def _host_kernel_news() -> str:
    """What the host's kernel said of UML processes (a signal it could not deliver to one)."""
    res = subprocess.run(["dmesg"], capture_output=True, text=True, check=False)
    said = [ln for ln in res.stdout.splitlines() if "linux[" in ln or "sigaltstack" in ln]
    return "\n".join(said[-5:]) or ("nothing of UML processes" if res.returncode == 0
                                     else f"(dmesg: {res.stderr.strip()})")  # fmt: skip


def _containerd_calls(node: UmlNode) -> str:
    """How many of containerd's goroutines are in each call that starts or stops a pod."""
    pid = node.pids.get("containerd")
    if pid is None:
        return "(not started by the test bed)"
    node.exec("kill", "-USR1", str(pid), check=False, timeout=10)
    time.sleep(1)  # the dump goes to its log
    dump = node.node_log("containerd", 4000, timeout=20)
    start = dump.rfind("=== BEGIN goroutine stack dump ===")
    if start < 0:
        return "(no goroutine dump in its log)"
    dump = dump[start:].replace("\\n", "\n")  # one log entry: its newlines may be escaped
    counts: dict[str, int] = {}
    for goroutine in dump.split("\n\n"):
        for call in STUCK_CALLS:
            if call in goroutine:
                counts[call] = counts.get(call, 0) + 1
    return ", ".join(f"{call} x{k}" for call, k in counts.items()) or "none of " + "/".join(
        STUCK_CALLS
    )


@dataclass
class Scenario:
    """What one test made, removed in reverse by :meth:`clean` (pods first, so that their
    kubelets unpublish the volumes), then checked to leave nothing behind."""

    cp: ControlPlane
    client: AsyncClient
    nodes: list[UmlNode]
    names: Names = NORMAL
    pods: list[str] = field(default_factory=list)
    claims: list[str] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    snapshots: list[str] = field(default_factory=list)
    snapshot_classes: list[str] = field(default_factory=list)
    before: dict[str, dict[str, str]] = field(default_factory=dict)
    # more to print when a wait times out (a chart's pods and events, say)
    diagnose: Callable[[], str] | None = None

    def _state(self) -> str:
        """The storage side of a failed wait: claims, volumes, capacities, LogicalVolumes."""
        cp = self.cp
        parts = [
            cp.kubectl("get", "pvc", "-n", NS, check=False),
            cp.kubectl("get", "pv", check=False),
            cp.kubectl("get", "csistoragecapacities", "-A", check=False),
            cp.kubectl("get", f"logicalvolumes.{self.names.group}", check=False),
        ]
        if self.diagnose is not None:
            parts.append(self.diagnose())
        return "\n".join(p[-3000:] for p in parts)

    @property
    def group(self) -> str:
        return self.nodes[0].labels[GROUP_LABEL]

    async def annotations(self) -> dict[str, dict[str, str]]:
        prefix = self.names.capacity_prefix
        out = {}
        for n in self.nodes:
            ann = await node_annotations(self.client, n.name)
            out[n.name] = {k: v for k, v in ann.items() if k.startswith(prefix)}
        return out

    async def record(self) -> None:
        """Wait for the nodes' capacity annotations and keep them to compare at the end."""

        async def annotated() -> dict[str, dict[str, str]] | None:
            found = await self.annotations()
            return found if all(found.values()) else None

        def logs() -> str:
            return "\n".join(f"{n.name}:\n{n.node_log(lines=20)}" for n in self.nodes)

        self.before = await eventually(
            "capacity annotations on every node", annotated, details=logs
        )

    async def capacities_published(self, sc: str, device_class: str) -> None:
        """Wait until csi-provisioner has a CSIStorageCapacity of ``sc`` for every node that
        says what the node's annotation says. Until then kube-scheduler's VolumeBinding filter
        rejects the nodes without one, and a pod created at once may land on whichever node's
        object came first rather than where the test expects it."""
        key, topology = self.names.capacity_annotation(device_class), self.names.topology_key

        async def matching() -> bool:
            items, _ = await api.list_all(self.client, CSIStorageCapacity, namespace=ALL_NS)
            says = {
                (i.get("nodeTopology") or {}).get("matchLabels", {}).get(topology):
                    str(i.get("capacity", ""))
                for i in items if i.get("storageClassName") == sc
            }  # fmt: skip
            for n in self.nodes:
                want = (await node_annotations(self.client, n.name)).get(key)
                if want is None or n.name not in says:
                    return False
                if parse_quantity(says[n.name]) != int(want):
                    return False
            return True

        await eventually(f"CSIStorageCapacity of {sc} for every node", matching,
                         details=self._state)  # fmt: skip

    def apply(self, *objs: dict[str, Any]) -> None:
        for obj in objs:
            kind, name = obj["kind"], obj["metadata"]["name"]
            {"Pod": self.pods, "PersistentVolumeClaim": self.claims,
             "StorageClass": self.classes, "VolumeSnapshot": self.snapshots,
             "VolumeSnapshotClass": self.snapshot_classes}.get(kind, []).append(name)  # fmt: skip
        self.cp.apply(*objs)

    def sc(self, **kw: Any) -> str:
        name = unique("sc")
        self.apply(storage_class(name, names=self.names, **kw))
        return name

    async def delete_pod(self, *names: str) -> None:
        """Delete the pods and wait until they are gone: their kubelets stopped them and
        unpublished their volumes (forced on a node without a kubelet, which never confirms)."""
        kubelets = {n.name for n in self.nodes if n.kubelet}
        graceful: list[str] = []
        forced: list[str] = []
        for name in names:
            obj = await api.get(self.client, Pod, name, namespace=NS)
            if obj is not None:
                on_kubelet = obj["spec"].get("nodeName") in kubelets
                (graceful if on_kubelet else forced).append(name)
        if graceful:
            await asyncio.to_thread(self.cp.kubectl, "delete", "pod", *graceful, "-n", NS,
                                    "--ignore-not-found", "--timeout=180s",
                                    timeout=200)  # fmt: skip
        if forced:
            self.cp.kubectl("delete", "pod", *forced, "-n", NS, "--grace-period=0", "--force",
                            "--ignore-not-found", check=False)  # fmt: skip
        for name in names:
            if name in self.pods:
                self.pods.remove(name)

    async def running(self, name: str, timeout: float = 180) -> list[Published]:
        """Wait until the pod's containers run (its kubelet published every volume); what it
        published where, the claims in the pod's order."""

        async def started() -> dict[str, Any] | None:
            obj = await api.get(self.client, Pod, name, namespace=NS)
            statuses = (obj or {}).get("status", {}).get("containerStatuses") or []
            return obj if statuses and all(st.get("ready") for st in statuses) else None

        def details() -> str:
            pod_state = self.cp.kubectl("describe", "pod", name, "-n", NS, check=False)
            nodes = "\n".join(f"{n.name}:\n{n.node_log(lines=10)}" for n in self.nodes)
            runtime = runtime_logs([n for n in self.nodes if n.kubelet])
            return f"{runtime}\n{pod_state[-2500:]}\n{nodes}\n{self._state()}"

        obj: dict[str, Any] = await eventually(
            f"pod {name} running", started, timeout=timeout, details=details
        )
        return await published(self.client, obj)

    def exec(self, pod: str, script: str) -> str:
        """``sh -c script`` in the pod's container (kubectl exec, through the API server)."""
        return self.cp.kubectl("exec", pod, "-n", NS, "--", "sh", "-c", script)

    async def expanded(self, claim_name: str, timeout: float = 120) -> None:
        """Until the claim's status shows the size it asks for, no resize pending: the resizer
        and the kubelet (NodeExpandVolume on the mounted volume) both did their part."""

        async def done() -> bool:
            obj = await pvc(self.client, claim_name)
            if obj is None:
                return False
            conds = obj.get("status", {}).get("conditions") or []
            want = obj["spec"]["resources"]["requests"]["storage"]
            return obj.get("status", {}).get("capacity", {}).get("storage") == want and not any(
                c["type"] in ("Resizing", "FileSystemResizePending") for c in conds
            )

        await eventually(f"{claim_name} expanded", done, timeout=timeout)

    async def clean(self) -> None:
        if self.pods:
            await self.delete_pod(*self.pods)
        cp = self.cp
        if self.snapshots:
            cp.kubectl("delete", "volumesnapshot", *self.snapshots, "-n", NS, "--wait=false",
                       check=False)  # fmt: skip
        if self.claims:
            cp.kubectl("delete", "pvc", *self.claims, "-n", NS, "--wait=false", check=False)
        lv_res = api.logicalvolume_resource(self.names)
        node_names = {n.name for n in self.nodes}

        async def gone() -> bool:
            lvs, _ = await api.list_all(self.client, lv_res)
            mine = [o for o in lvs if o["spec"].get("nodeName") in node_names]
            pvs, _ = await api.list_all(self.client, PersistentVolume)
            claimed = [p for p in pvs if (p["spec"].get("claimRef") or {}).get("name")
                       in self.claims]  # fmt: skip
            return not mine and not claimed

        await eventually("volumes of the test deleted", gone, timeout=120, details=self._state)
        for n in self.nodes:  # thin pools are the node's set-up, not volumes
            left = {k: v for k, v in n.lvs("vg1").items() if not v["lv_attr"].startswith("t")}
            assert left == {}, f"LVs left on {n.name}: {left}"
        if self.snapshot_classes:
            cp.kubectl("delete", "volumesnapshotclass", *self.snapshot_classes, check=False)
        if self.classes:
            cp.kubectl("delete", "storageclass", *self.classes, check=False)
        if self.before:

            async def restored() -> bool:
                return await self.annotations() == self.before

            await eventually("capacity annotations as before the test", restored, timeout=60)

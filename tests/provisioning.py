"""Objects and checks the provisioning tests share: StorageClasses, claims and pods as a user
writes them, and the "nothing left behind" assertion of upstream's e2e suite (no LV, and every
node's capacity annotations as before the test)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Event, PersistentVolume, PersistentVolumeClaim, Pod

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.kubelet import KubeletStandIn
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import GROUP_LABEL, NodeSet, node_annotations, unique
from tests.helpers import eventually
from topolvm.constants import NORMAL, Names
from topolvm.k8s import api

GiB = 1 << 30
MiB = 1 << 20
NS = "default"


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
) -> dict[str, Any]:  # fmt: skip
    mounts = [{"name": c, "mountPath": f"/{c}"} for c in claims]
    devices = [{"name": c, "devicePath": f"/dev/{c}"} for c in block]
    volumes: list[dict[str, Any]] = [
        {"name": c, "persistentVolumeClaim": {"claimName": c}} for c in [*claims, *block]
    ]
    if ephemeral is not None:
        volumes.append({"name": "scratch", "ephemeral": {"volumeClaimTemplate": ephemeral}})
        mounts.append({"name": "scratch", "mountPath": "/scratch"})
    container: dict[str, Any] = {"name": "app", "image": "registry.invalid/app:1"}
    if mounts:
        container["volumeMounts"] = mounts
    if devices:
        container["volumeDevices"] = devices
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"schedulerName": scheduler, "nodeSelector": {GROUP_LABEL: group},
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


@contextlib.contextmanager
def shared_nodes(
    cp: ControlPlane, workdir: Path, prefix: str, vg_gib: list[float],
    device_classes: list[dict[str, Any]], *, disks: int = 2,
    prepare: Callable[[UmlNode], None] | None = None, extra: Sequence[str] = (),
) -> Iterator[list[UmlNode]]:  # fmt: skip
    """UML nodes for a whole test module, each running topolvm-node with ``device_classes``;
    ``prepare`` makes more VGs before the node starts."""
    node_set = NodeSet(cp, prefix, workdir)
    try:
        nodes = node_set.make(len(vg_gib), vg_gib=vg_gib, disks=disks)
        for n in nodes:
            if prepare is not None:
                prepare(n)
            n.start_topolvm_node(cp, device_classes, *extra)
        yield nodes
    finally:
        node_set.close()


@dataclass
class Scenario:
    """What one test made, removed in reverse by :meth:`clean` (pods through the kubelet
    stand-in first, so their volumes are unpublished), then checked to leave nothing behind."""

    cp: ControlPlane
    client: AsyncClient
    nodes: list[UmlNode]
    kubelet: KubeletStandIn | None = None
    names: Names = NORMAL
    pods: list[str] = field(default_factory=list)
    claims: list[str] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    snapshots: list[str] = field(default_factory=list)
    snapshot_classes: list[str] = field(default_factory=list)
    before: dict[str, dict[str, str]] = field(default_factory=dict)

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

    async def delete_pod(self, name: str) -> None:
        if self.kubelet is not None:
            with contextlib.suppress(Exception):
                await self.kubelet.stop_pod(name)
        self.cp.kubectl("delete", "pod", name, "-n", NS, "--grace-period=0", "--force",
                        "--ignore-not-found", check=False)  # fmt: skip
        if name in self.pods:
            self.pods.remove(name)

    async def clean(self) -> None:
        for name in list(self.pods):
            await self.delete_pod(name)
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

        await eventually("volumes of the test deleted", gone, timeout=120)
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

"""Helpers for the pod webhook's tests without Kubernetes (tests/test_unit_podmutate.py,
tests/test_controller_webhook.py): pods, PVCs and StorageClasses as dicts, and a reader of them."""

from __future__ import annotations

from typing import Any

from topolvm.constants import NORMAL, Names

GiB = 1 << 30
Obj = dict[str, Any]


class Reader:
    """PVCs and StorageClasses from dicts; records reads; ``fail`` makes a kind of read fail."""

    def __init__(
        self, pvcs: dict[str, Obj] | None = None, fail: str = "",
        moves: dict[str, Obj] | None = None,
    ) -> None:  # fmt: skip
        self.pvcs = pvcs or {}
        self.moves = moves or {}  # "namespace/claim" -> VolumeMove
        # a restore's source: PVs, VolumeSnapshots ("namespace/name"), their contents and
        # classes, and the node of each volume id
        self.pvs: dict[str, Obj] = {}
        self.snapshots: dict[str, Obj] = {}
        self.contents: dict[str, Obj] = {}
        self.snapshot_classes: dict[str, Obj] = {}
        self.volume_nodes: dict[str, str] = {}
        self.classes: dict[str, Obj] = {
            "ssd": sc("topolvm.io", "ssd"),
            "plain": sc("topolvm.io", None),
            "legacy-ssd": sc("topolvm.cybozu.com", "ssd"),
            "nfs": sc("example.com/nfs", "ssd"),
        }
        self.fail = fail
        self.reads: list[str] = []

    async def get_pvc(self, namespace: str, name: str) -> Obj | None:
        self.reads.append(f"pvc {namespace}/{name}")
        if self.fail == "pvc":
            raise RuntimeError("503 ServiceUnavailable: etcd is down")
        return self.pvcs.get(f"{namespace}/{name}")

    async def get_storageclass(self, name: str) -> Obj | None:
        self.reads.append(f"sc {name}")
        if self.fail == "sc":
            raise RuntimeError("503 ServiceUnavailable: etcd is down")
        return self.classes.get(name)

    async def get_volumemove(self, namespace: str, name: str) -> Obj | None:
        if self.fail == "move":
            raise RuntimeError("503 ServiceUnavailable: etcd is down")
        return self.moves.get(f"{namespace}/{name}")

    async def get_pv(self, name: str) -> Obj | None:
        return self.pvs.get(name)

    async def get_volumesnapshot(self, namespace: str, name: str) -> Obj | None:
        if self.fail == "snapshot":
            raise RuntimeError("404 NotFound: the server could not find the requested resource")
        return self.snapshots.get(f"{namespace}/{name}")

    async def get_volumesnapshotcontent(self, name: str) -> Obj | None:
        return self.contents.get(name)

    async def get_volumesnapshotclass(self, name: str) -> Obj | None:
        return self.snapshot_classes.get(name)

    async def node_of_volume(self, volume_id: str) -> str | None:
        return self.volume_nodes.get(volume_id)


def sc(provisioner: str, device_class: str | None) -> Obj:
    params = {} if device_class is None else {f"{provisioner}/device-class": device_class}
    return {"metadata": {"name": "x"}, "provisioner": provisioner, "parameters": params}


def pvc(sc_name: str | None, size: str | None = "1Gi", phase: str = "Pending") -> Obj:
    spec: Obj = {"accessModes": ["ReadWriteOnce"]}
    if sc_name is not None:
        spec["storageClassName"] = sc_name
    if size is not None:
        spec["resources"] = {"requests": {"storage": size}}
    return {"spec": spec, "status": {"phase": phase}}


def claim(name: str) -> Obj:
    return {"name": f"v-{name}", "persistentVolumeClaim": {"claimName": name}}


def ephemeral(sc_name: str | None, size: str | None = "1Gi", name: str = "eph") -> Obj:
    spec: Obj = {"accessModes": ["ReadWriteOnce"]}
    if sc_name is not None:
        spec["storageClassName"] = sc_name
    if size is not None:
        spec["resources"] = {"requests": {"storage": size}}
    return {"name": name, "ephemeral": {"volumeClaimTemplate": {"spec": spec}}}


def pod(*volumes: Obj, namespace: str | None = "app", containers: int = 2) -> Obj:
    meta: Obj = {"name": "p", "annotations": {"team": "a"}}
    if namespace is not None:
        meta["namespace"] = namespace
    ctrs = [
        {"name": f"c{i}", "image": "app:1", "resources": {"requests": {"cpu": "1"}}}
        for i in range(containers)
    ]
    spec: Obj = {"containers": ctrs}
    if volumes:
        spec["volumes"] = list(volumes)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def capacity(p: Obj, names: Names = NORMAL) -> dict[str, str]:
    annotations = p["metadata"].get("annotations") or {}
    return {k: v for k, v in annotations.items() if k.startswith(names.capacity_prefix)}

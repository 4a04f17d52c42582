"""topolvm-controller's reconcilers against the real kube-apiserver and kube-controller-manager,
for tests/test_cluster_controllers_*.py: node cleanup (§8.1), the PVC reconciler (§8.2) and
the LogicalVolume garbage collector.

No UML node is needed: Nodes, StorageClasses, PVCs, pods and LogicalVolumes are written directly
(no kubelet or topolvm-node acts on them; the LogicalVolume finalizer is put there by the test).
The reconcilers run with a service account bound to exactly the ClusterRole
docs/controller-reconcilers.md documents, so a missing permission fails here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import yaml
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, PersistentVolumeClaim, Pod
from lightkube.resources.storage_v1 import StorageClass
from lightkube.types import PatchType
from prometheus_client import CollectorRegistry

from devtools.testbed.controlplane import ControlPlane
from tests.cluster_fixtures import unique
from tests.helpers import eventually
from topolvm.constants import NORMAL
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.nodecleanup import SELECTED_NODE
from topolvm.k8s import api
from topolvm.k8s.lvstore import LogicalVolumeStore
from topolvm.k8s.runtime import Informer

LV = api.logicalvolume_resource(NORMAL)
HOLD = "topolvm.test/hold"  # keeps an object visible after its deletion, to read it
P = NORMAL.plugin


def rules() -> list[dict[str, Any]]:
    """The union of the RBAC rules docs/controller-reconcilers.md gives for the reconcilers."""

    def rule(group: str, resource: str, *verbs: str) -> dict[str, Any]:
        return {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}

    return [
        rule("", "nodes", "get", "list", "watch", "patch"),
        rule("", "persistentvolumeclaims", "get", "list", "watch", "patch", "delete"),
        rule("", "pods", "list", "patch"),
        rule("", "persistentvolumes", "list"),
        rule("storage.k8s.io", "storageclasses", "get", "list"),
        rule(P, "logicalvolumes", "get", "list", "patch", "delete"),
        rule("snapshot.storage.k8s.io", "volumesnapshotcontents", "list"),
    ]


class Bed:
    """Objects a test made (removed at the end, finalizers dropped) and its clients."""

    def __init__(self, cp: ControlPlane, admin: AsyncClient, tmp: Path):
        self.cp, self.admin, self.tmp = cp, admin, tmp
        self.ns = unique("ctl")
        self.made: list[tuple[str, str, str | None]] = []  # kubectl kind, name, namespace
        self.tasks: list[asyncio.Task[None]] = []
        self.clients: list[AsyncClient] = []
        self.registry = CollectorRegistry()
        self.metrics = ControllerMetrics(self.registry)
        cp.kubectl("create", "namespace", self.ns)

    def sa_client(self, role_rules: list[dict[str, Any]]) -> AsyncClient:
        """A client authenticated as a new service account bound to ``role_rules``."""
        sa = unique("reconcilers")
        self.cp.kubectl("create", "serviceaccount", sa, "-n", self.ns)
        role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": sa}, "rules": role_rules}  # fmt: skip
        self.cp.apply(role)
        self.made.append(("clusterrole", sa, None))
        self.cp.kubectl("create", "clusterrolebinding", sa, f"--clusterrole={sa}",
                        f"--serviceaccount={self.ns}:{sa}")  # fmt: skip
        self.made.append(("clusterrolebinding", sa, None))
        token = self.cp.kubectl("create", "token", sa, "-n", self.ns, "--duration=1h").strip()
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": self.cp.server,
                          "certificate-authority": str(self.cp.pki.ca_file)}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        }  # fmt: skip
        path = self.tmp / f"{sa}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        client = api.make_client(str(path))
        self.clients.append(client)  # closed after the reconcilers stopped
        return client

    def start(self, coro: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.create_task(coro))

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(f"topolvm_controller_{name}", labels) or 0.0

    async def create(self, res: Any, obj: dict[str, Any], kind: str) -> dict[str, Any]:
        namespaced = kind in ("pvc", "pod")
        meta = obj["metadata"]
        if namespaced:
            meta["namespace"] = self.ns
        self.made.append((kind, meta["name"], self.ns if namespaced else None))
        return api.to_dict(await self.admin.create(res.from_dict(obj)))

    async def storage_class(self, provisioner: str = P) -> str:
        name = unique("sc")
        obj = {"metadata": {"name": name}, "provisioner": provisioner,
               "volumeBindingMode": "WaitForFirstConsumer"}  # fmt: skip
        await self.create(StorageClass, obj, "storageclass")
        return name

    async def pvc(self, sc: str, node: str = "", finalizers: list[str] | None = None) -> str:
        name = unique("pvc")
        meta: dict[str, Any] = {"name": name, "finalizers": finalizers or []}
        if node:
            meta["annotations"] = {SELECTED_NODE: node}
        spec = {"storageClassName": sc, "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}  # fmt: skip
        await self.create(PersistentVolumeClaim, {"metadata": meta, "spec": spec}, "pvc")
        return name

    async def pod(self, claim: str = "", annotations: dict[str, str] | None = None) -> str:
        """A pod no scheduler or kubelet acts on (the namespace's default service account,
        which the service-account admission needs, is made by kube-controller-manager)."""
        await eventually("default service account", lambda: self.cp.kubectl(
            "get", "serviceaccount", "default", "-n", self.ns, "--ignore-not-found"))  # fmt: skip
        name = unique("pod")
        volumes = [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}] if claim else []
        spec = {"schedulerName": "nobody-schedules-these", "volumes": volumes,
                "containers": [{"name": "c", "image": "registry.invalid/pause"}]}  # fmt: skip
        meta = {"name": name, "annotations": annotations or {}}
        await self.create(Pod, {"metadata": meta, "spec": spec}, "pod")
        return name

    async def lv(self, node: str, finalizers: list[str] | None = None, volume_id: str = "",
                 access_type: str = "", source: str = "") -> str:  # fmt: skip
        name = unique("lv")
        spec = {"name": name, "nodeName": node, "size": "1Gi"}
        spec.update({k: v for k, v in (("accessType", access_type), ("source", source)) if v})
        meta = {"name": name, "finalizers": finalizers or []}
        obj = {"apiVersion": f"{P}/v1", "kind": "LogicalVolume", "metadata": meta, "spec": spec}
        await self.create(LV, obj, f"logicalvolumes.{P}")
        if volume_id:
            status = {"volumeID": volume_id, "currentSize": "1Gi"}
            await self.admin.patch(LV.Status, name, {"status": status}, patch_type=PatchType.MERGE)
        return name

    async def node(self) -> str:
        name = unique("gone")
        self.cp.add_node(name)
        self.made += [("node", name, None), ("csinode", name, None)]
        await api.set_finalizer(self.admin, Node, name, NORMAL.node_finalizer, True)
        return name

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        pending: set[asyncio.Task[None]] = set()
        if self.tasks:
            _, pending = await asyncio.wait(self.tasks, timeout=10)
            for t in pending:
                t.print_stack()
        for c in self.clients if not pending else []:  # closing under an open watch can hang
            await c.close()
        for kind, name, ns in reversed(self.made):
            where = ["-n", ns] if ns else []
            self.cp.kubectl("patch", kind, name, *where, "--type=merge", "-p",
                            '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip
            self.cp.kubectl("delete", kind, name, *where, "--ignore-not-found", "--wait=false",
                            "--grace-period=0", "--force", check=False)  # fmt: skip
        self.cp.kubectl("delete", "namespace", self.ns, "--wait=false", check=False)
        assert not pending, "a reconciler did not stop when cancelled"


def store(client: AsyncClient) -> LogicalVolumeStore:
    return LogicalVolumeStore(client, NORMAL, Informer(client, LV))


async def obj_of(client: AsyncClient, res: Any, name: str, ns: str | None = None) -> Any:
    return await api.get(client, res, name, **({"namespace": ns} if ns else {}))


async def gone(client: AsyncClient, res: Any, name: str, ns: str | None = None) -> bool:
    return await obj_of(client, res, name, ns) is None

"""topolvm-controller's reconcilers against the real kube-apiserver and kube-controller-manager:
node cleanup (§8.1), the PVC reconciler (§8.2) and the LogicalVolume garbage collector.

No UML node is needed: Nodes, StorageClasses, PVCs, pods and LogicalVolumes are written directly
(no kubelet or topolvm-node acts on them; the LogicalVolume finalizer is put there by the test).
The reconcilers run with a service account bound to exactly the ClusterRole
docs/controller-reconcilers.md documents, so a missing permission fails here.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import AsyncClient
from lightkube.generic_resource import create_global_resource
from lightkube.resources.core_v1 import Node, PersistentVolume, PersistentVolumeClaim, Pod
from lightkube.resources.storage_v1 import StorageClass
from lightkube.types import PatchType
from prometheus_client import CollectorRegistry

from devtools import gobuild
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from tests.cluster_fixtures import session_controller_paused, unique
from tests.helpers import eventually
from topolvm.constants import NORMAL, RESIZEFS_REQUESTED_AT
from topolvm.controller.lvgc import LogicalVolumeGC, VolumeSnapshotContent
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.nodecleanup import SELECTED_NODE, NodeCleanupReconciler
from topolvm.controller.pvcresize import PersistentVolumeClaimReconciler, parse_rfc3339
from topolvm.k8s import api
from topolvm.k8s.lvstore import LogicalVolumeStore
from topolvm.k8s.runtime import Informer

pytestmark = pytest.mark.cluster
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


@pytest.fixture(scope="module")
def no_other_reconcilers(driver: DriverStack) -> Iterator[None]:
    """The session's topolvm-controller runs the same reconcilers (with other flags) on the
    same cluster: stop it while this module's reconcilers are under test."""
    with session_controller_paused():
        yield


@pytest.fixture
async def bed(
    control_plane: ControlPlane,
    cluster_client: AsyncClient,
    tmp_path: Path,
    no_other_reconcilers: None,
) -> AsyncIterator[Bed]:
    b = Bed(control_plane, cluster_client, tmp_path)
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture
async def client(bed: Bed) -> AsyncClient:
    """The reconcilers' client: a service account with the documented ClusterRole."""
    return bed.sa_client(rules())


def store(client: AsyncClient) -> LogicalVolumeStore:
    return LogicalVolumeStore(client, NORMAL, Informer(client, LV))


async def obj_of(client: AsyncClient, res: Any, name: str, ns: str | None = None) -> Any:
    return await api.get(client, res, name, **({"namespace": ns} if ns else {}))


async def gone(client: AsyncClient, res: Any, name: str, ns: str | None = None) -> bool:
    return await obj_of(client, res, name, ns) is None


# -- node cleanup --------------------------------------------------------------------------------


async def test_deleted_node_takes_its_pvcs_and_logicalvolumes(
    bed: Bed, client: AsyncClient
) -> None:
    node, other = await bed.node(), unique("elsewhere")
    sc, foreign = await bed.storage_class(), await bed.storage_class("other.example.com")
    selected = await bed.pvc(sc, node)
    immediate = await bed.pvc(sc)  # Immediate binding: no selected-node annotation
    foreign_pvc, other_pvc = await bed.pvc(foreign, node), await bed.pvc(sc, other)
    held = await bed.lv(node, [NORMAL.lv_finalizer, HOLD])
    plain, bare = await bed.lv(node, [NORMAL.lv_finalizer]), await bed.lv(node)
    elsewhere = await bed.lv(other, [NORMAL.lv_finalizer])
    bed.start(NodeCleanupReconciler(client, NORMAL, store(client), bed.metrics).run())

    await bed.admin.delete(Node, node)
    await eventually("Node removed", lambda: gone(bed.admin, Node, node), 30)
    await eventually(
        "PVC deleted", lambda: gone(bed.admin, PersistentVolumeClaim, selected, bed.ns)
    )
    for kept in (immediate, foreign_pvc, other_pvc):
        pvc = await obj_of(bed.admin, PersistentVolumeClaim, kept, bed.ns)
        assert pvc is not None and not pvc["metadata"].get("deletionTimestamp"), kept
    lv = await obj_of(bed.admin, LV, held)
    assert lv is not None and lv["metadata"].get("deletionTimestamp")
    assert lv["metadata"]["annotations"][NORMAL.pending_deletion] == "true"
    assert lv["metadata"]["finalizers"] == [HOLD]
    assert await gone(bed.admin, LV, plain) and await gone(bed.admin, LV, bare)
    kept_lv = await obj_of(bed.admin, LV, elsewhere)
    assert kept_lv is not None and not kept_lv["metadata"].get("deletionTimestamp")
    assert NORMAL.pending_deletion not in (kept_lv["metadata"].get("annotations") or {})
    assert bed.sample("reconciles_total", controller="node", result="ok") >= 1


async def test_skip_node_finalize_only_releases_the_node(bed: Bed, client: AsyncClient) -> None:
    node, sc = await bed.node(), await bed.storage_class()
    pvc, lv = await bed.pvc(sc, node), await bed.lv(node, [NORMAL.lv_finalizer])
    reconciler = NodeCleanupReconciler(client, NORMAL, store(client), skip_node_finalize=True)
    bed.start(reconciler.run())
    await bed.admin.delete(Node, node)
    await eventually("Node removed", lambda: gone(bed.admin, Node, node), 30)
    claim = await obj_of(bed.admin, PersistentVolumeClaim, pvc, bed.ns)
    assert claim is not None and not claim["metadata"].get("deletionTimestamp")
    obj = await obj_of(bed.admin, LV, lv)
    assert obj is not None and not obj["metadata"].get("deletionTimestamp")
    assert obj["metadata"]["finalizers"] == [NORMAL.lv_finalizer]


async def test_failed_cleanup_holds_the_node_and_is_retried(bed: Bed) -> None:
    """Without permission to delete PVCs the Node stays (finalizer kept, errors counted);
    once the permission is granted, the retry (with backoff) completes the cleanup."""
    node, sc = await bed.node(), await bed.storage_class()
    pvc = await bed.pvc(sc, node)
    limited = [r for r in rules() if r["resources"] != ["persistentvolumeclaims"]]
    limited.append({"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["list"]})
    client = bed.sa_client(limited)
    bed.start(NodeCleanupReconciler(client, NORMAL, store(client), bed.metrics).run())
    await bed.admin.delete(Node, node)
    await eventually("failed reconciles",
                     lambda: bed.sample("reconciles_total", controller="node", result="error")
                     >= 2)  # fmt: skip
    obj = await obj_of(bed.admin, Node, node)
    assert obj is not None and NORMAL.node_finalizer in obj["metadata"]["finalizers"]
    role = next(name for kind, name, _ in bed.made if kind == "clusterrole")
    bed.cp.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                  "metadata": {"name": role}, "rules": rules()})  # fmt: skip
    await eventually("Node removed after the retry", lambda: gone(bed.admin, Node, node), 90)
    await eventually("PVC deleted", lambda: gone(bed.admin, PersistentVolumeClaim, pvc, bed.ns))


# -- PVC reconciler ------------------------------------------------------------------------------


async def test_deprecated_pvc_finalizers_are_removed(bed: Bed, client: AsyncClient) -> None:
    sc = await bed.storage_class()
    old = ["topolvm.io/pvc", "topolvm.cybozu.com/pvc"]
    live = await bed.pvc(sc, finalizers=[*old, HOLD])
    deleting = await bed.pvc(sc, finalizers=["topolvm.io/pvc"])
    await bed.admin.delete(PersistentVolumeClaim, deleting, namespace=bed.ns)
    bed.start(PersistentVolumeClaimReconciler(client, NORMAL, bed.metrics).run())

    async def cleaned() -> bool:
        obj = await obj_of(bed.admin, PersistentVolumeClaim, live, bed.ns)
        return not set(old) & set(api.finalizers(obj))

    await eventually("deprecated finalizers removed", cleaned)
    obj = await obj_of(bed.admin, PersistentVolumeClaim, live, bed.ns)
    assert HOLD in api.finalizers(obj) and not obj["metadata"].get("deletionTimestamp")
    await eventually("deleted PVC released",
                     lambda: gone(bed.admin, PersistentVolumeClaim, deleting, bed.ns))  # fmt: skip


async def set_resize_pending(bed: Bed, pvc: str, since: str) -> None:
    cond = {
        "type": "FileSystemResizePending",
        "status": "True",
        "lastTransitionTime": since,
        "message": "Waiting for user to (re-)start a pod to finish file system resize",
    }
    await bed.admin.patch(PersistentVolumeClaim.Status, pvc, {"status": {"conditions": [cond]}},
                          namespace=bed.ns, patch_type=PatchType.MERGE)  # fmt: skip


async def annotation(bed: Bed, pod: str) -> str | None:
    obj = await obj_of(bed.admin, Pod, pod, bed.ns)
    value = (obj["metadata"].get("annotations") or {}).get(RESIZEFS_REQUESTED_AT)
    return None if value is None else str(value)


async def test_resize_pending_nudges_pods_using_the_claim(bed: Bed, client: AsyncClient) -> None:
    sc, foreign = await bed.storage_class(), await bed.storage_class("other.example.com")
    claim, other_claim = await bed.pvc(sc), await bed.pvc(foreign)
    user, stranger = await bed.pod(claim), await bed.pod()
    stale = await bed.pod(claim, {RESIZEFS_REQUESTED_AT: "2001-01-01T00:00:00.5Z"})
    future = "2999-01-01T00:00:00.123456789Z"
    recent = await bed.pod(claim, {RESIZEFS_REQUESTED_AT: future})
    foreign_user = await bed.pod(other_claim)
    bed.start(PersistentVolumeClaimReconciler(client, NORMAL, bed.metrics).run())
    since = "2020-06-01T12:00:00Z"
    await set_resize_pending(bed, claim, since)
    await set_resize_pending(bed, other_claim, since)

    first = await eventually("pod annotated", lambda: annotation(bed, user))
    stamp = parse_rfc3339(first)
    assert stamp is not None and stamp > (parse_rfc3339(since) or 0), first
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d*[1-9])?Z", first), (
        first
    )  # RFC3339Nano

    async def renewed() -> bool:
        return await annotation(bed, stale) not in (None, "2001-01-01T00:00:00.5Z")

    await eventually("stale annotation renewed", renewed)
    assert await annotation(bed, recent) == future
    assert await annotation(bed, stranger) is None and await annotation(bed, foreign_user) is None
    # Another event on the claim (a label) does not nudge again for the same resize.
    await bed.admin.patch(PersistentVolumeClaim, claim, {"metadata": {"labels": {"x": "y"}}},
                          namespace=bed.ns, patch_type=PatchType.MERGE)  # fmt: skip
    await asyncio.sleep(1.5)
    assert await annotation(bed, user) == first


# -- LogicalVolume garbage collector -------------------------------------------------------------

NOT_INSTALLED = create_global_resource("snapshot.invalid", "v1", "Nothing", "nothings")


async def pv_for(bed: Bed, handle: str, driver: str = P) -> str:
    name = unique("pv")
    spec = {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
            "csi": {"driver": driver, "volumeHandle": handle}}  # fmt: skip
    await bed.create(PersistentVolume, {"metadata": {"name": name}, "spec": spec}, "pv")
    return name


async def test_gc_off_never_deletes(bed: Bed, client: AsyncClient) -> None:
    orphan = await bed.lv("gc-nowhere", volume_id=unique("vid"))
    gc = LogicalVolumeGC(client, NORMAL, store(client), bed.metrics, grace=0, interval=0.05)
    await asyncio.wait_for(gc.run(), 5)  # "off" returns at once
    assert await obj_of(bed.admin, LV, orphan) is not None
    assert bed.sample("gc_orphan_logicalvolumes") == 0


async def test_gc_dry_run_reports_orphans_only(
    bed: Bed, client: AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    orphan, bound_id = await bed.lv("gc-nowhere", volume_id=unique("vid")), unique("vid")
    bound = await bed.lv("gc-nowhere", volume_id=bound_id)
    await pv_for(bed, bound_id)
    foreign_id = unique("vid")
    foreign = await bed.lv("gc-nowhere", volume_id=foreign_id)
    await pv_for(bed, foreign_id, driver="other.example.com")
    # Without the snapshot API, snapshot LVs (accessType ro) are never orphans.
    snap = await bed.lv("gc-nowhere", volume_id=unique("vid"), access_type="ro", source=bound)
    gc = LogicalVolumeGC(client, NORMAL, store(client), bed.metrics, mode="dry-run", grace=1,
                         interval=0.2, snapshot_contents=NOT_INSTALLED)  # fmt: skip
    with caplog.at_level(logging.INFO, logger="topolvm.controller"):
        bed.start(gc.run())
        await eventually("orphans found", lambda: {orphan, foreign} <= set(gc.orphans), 20)
    assert bound not in gc.orphans and snap not in gc.orphans
    assert bed.sample("gc_orphan_logicalvolumes") == len(gc.orphans)
    for name in (orphan, bound, foreign, snap):
        assert await obj_of(bed.admin, LV, name) is not None, name
    logged = [r for r in caplog.records if "dry run" in r.getMessage()]
    assert {getattr(r, "lv", "") for r in logged} >= {orphan, foreign}
    assert bed.sample("gc_deleted_logicalvolumes_total") == 0


def install_snapshot_crds(cp: ControlPlane) -> None:
    crds = gobuild.ensure("snapshot-crds")["snapshot-crds"]
    for f in sorted(crds.glob("snapshot.storage.k8s.io_*.yaml")):
        cp.kubectl("apply", "--server-side", "-f", str(f))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
               "crd/volumesnapshotcontents.snapshot.storage.k8s.io")  # fmt: skip


async def snapshot_content(bed: Bed, handle: str, pre_provisioned: bool) -> None:
    name = unique("vsc")
    source = {"snapshotHandle": handle} if pre_provisioned else {"volumeHandle": "some-volume"}
    spec = {"deletionPolicy": "Retain", "driver": P, "source": source,
            "volumeSnapshotRef": {"name": "snap", "namespace": bed.ns}}  # fmt: skip
    obj = {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
           "metadata": {"name": name}, "spec": spec}  # fmt: skip
    await bed.create(VolumeSnapshotContent, obj, "volumesnapshotcontent")
    if not pre_provisioned:
        await bed.admin.patch(VolumeSnapshotContent.Status, name,
                              {"status": {"snapshotHandle": handle, "readyToUse": True}},
                              patch_type=PatchType.MERGE)  # fmt: skip


async def test_gc_delete_collects_only_orphans_seen_twice(bed: Bed, client: AsyncClient) -> None:
    install_snapshot_crds(bed.cp)
    ids = {k: unique("vid") for k in ("orphan", "bound", "snap1", "snap2", "snap3", "late")}
    lvs = {k: await bed.lv("gc-nowhere", volume_id=v,
                           access_type="ro" if k.startswith("snap") else "")
           for k, v in ids.items()}  # fmt: skip
    await pv_for(bed, ids["bound"])
    await snapshot_content(bed, ids["snap1"], pre_provisioned=False)
    await snapshot_content(bed, ids["snap2"], pre_provisioned=True)
    creating = await bed.lv("gc-nowhere", source=lvs["orphan"])  # being created from "orphan"
    gc = LogicalVolumeGC(client, NORMAL, store(client), bed.metrics, mode="delete", grace=1)
    await asyncio.sleep(2.1)  # every LV is past the grace period now

    assert not set(lvs.values()) & set(await gc.scan())  # first sighting: nothing deleted
    await pv_for(bed, ids["late"])  # referenced from the second scan on
    orphans = set(await gc.scan())
    assert {lvs["snap3"], creating} <= orphans
    assert not {lvs["orphan"], lvs["bound"], lvs["snap1"], lvs["snap2"], lvs["late"]} & orphans
    for key in ("orphan", "bound", "snap1", "snap2", "late"):
        assert await obj_of(bed.admin, LV, lvs[key]) is not None, key
    assert await gone(bed.admin, LV, lvs["snap3"]) and await gone(bed.admin, LV, creating)
    # Its dependant gone, "orphan" is an orphan after two more scans.
    assert lvs["orphan"] not in await gc.scan()
    assert lvs["orphan"] in await gc.scan()
    assert await gone(bed.admin, LV, lvs["orphan"])
    assert bed.sample("gc_deleted_logicalvolumes_total") >= 3


async def test_gc_spares_young_logicalvolumes(bed: Bed, client: AsyncClient) -> None:
    gc = LogicalVolumeGC(client, NORMAL, store(client), bed.metrics, mode="delete", grace=4,
                         interval=0.2)  # fmt: skip
    bed.start(gc.run())
    young = await bed.lv("gc-nowhere")  # still being created: no volume id yet
    await asyncio.sleep(2)
    assert await obj_of(bed.admin, LV, young) is not None
    await eventually("old orphan deleted", lambda: gone(bed.admin, LV, young), 20)

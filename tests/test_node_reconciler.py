"""LogicalVolume reconciler and capacity export: API emulator + real lvmd on real LVM (in UML)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from lightkube import AsyncClient
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import eventually
from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import kube  # noqa: F401
from tests.lvm_fixtures import THICK, THIN, VolumeGroups, lvm
from topolvm.constants import LEGACY, NORMAL, Names
from topolvm.k8s import api
from topolvm.k8s.runtime import Controller, Informer
from topolvm.node.exporter import CapacityExporter, NodeMetrics
from topolvm.node.lvmd_client import SocketLvmd
from topolvm.node.reconciler import LogicalVolumeReconciler
from topolvm.proto import lvmd_pb2 as pb

pytestmark = pytest.mark.uml
GiB = 1 << 30
MiB = 1 << 20
NODE = "node1"


def lvs(vg: str = "vg1") -> dict[str, dict[str, str]]:
    out = lvm(
        "lvs", vg, "--reportformat", "json", "--units", "b", "--nosuffix",
        "-o", "lv_name,lv_size,lv_attr,origin,pool_lv",
    )  # fmt: skip
    return {r["lv_name"]: r for r in json.loads(out)["report"][0]["lv"]}


@dataclass
class Env:
    kube: KubeEmulator
    client: AsyncClient
    lvmd: SocketLvmd
    names: Names
    socket: str
    tasks: list[asyncio.Task[None]]
    reconciler: LogicalVolumeReconciler | None = None
    exporter: CapacityExporter | None = None
    registry: CollectorRegistry | None = None

    @property
    def group(self) -> str:
        return self.names.group

    def lv(self, name: str) -> dict[str, Any] | None:
        return self.kube.get("logicalvolumes", name, group=self.group)

    async def create_lv(self, name: str, size: str, node: str = NODE, **spec: str) -> str:
        obj = {
            "apiVersion": f"{self.group}/v1",
            "kind": "LogicalVolume",
            "metadata": {"name": name},
            "spec": {"name": name, "nodeName": node, "size": size, **spec},
        }
        res = api.logicalvolume_resource(self.names)
        created = await self.client.create(res.from_dict(obj))
        return str(api.to_dict(created)["metadata"]["uid"])

    async def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
        return await eventually(what, check, timeout)

    async def wait_status(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        def status() -> dict[str, Any] | None:
            obj = self.lv(name)
            st = (obj or {}).get("status") or {}
            return st if st.get("volumeID") or st.get("code") else None

        result: dict[str, Any] = await self.wait_for(f"status of {name}", status, timeout)
        return result

    def start_node(self) -> None:
        """Start (or restart) the reconciler the way topolvm-node wires it."""
        self.reconciler = LogicalVolumeReconciler(self.client, self.names, NODE, self.lvmd)
        informer = Informer(self.client, api.logicalvolume_resource(self.names), resync=30)
        controller = Controller("logicalvolume", self.reconciler.reconcile, base_backoff=0.05)
        self.reconciler.watch(informer, controller)
        self.tasks += [asyncio.create_task(informer.run()), asyncio.create_task(controller.run())]

    def start_exporter(self) -> None:
        self.registry = CollectorRegistry()
        metrics = NodeMetrics(self.registry, NODE)
        self.exporter = CapacityExporter(self.client, self.names, NODE, self.lvmd, metrics)
        self.tasks.append(asyncio.create_task(self.exporter.run()))

    async def stop_tasks(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self.tasks.clear()


async def _env(
    vgs: VolumeGroups, lvmd_factory: Any, emu: KubeEmulator, names: Names
) -> AsyncIterator[Env]:
    vgs.create("vg1", size_gib=6)
    vgs.thin_pool("vg1", "pool0", 2)
    server = await lvmd_factory([THICK, THIN])
    client = api.make_client(server=emu.url)
    emu.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    lvmd = SocketLvmd(server.server.config.socket_name)
    env = Env(emu, client, lvmd, names, server.server.config.socket_name, [])
    try:
        yield env
    finally:
        await env.stop_tasks()
        await lvmd.close()
        await client.close()


@pytest.fixture
async def env(vgs: VolumeGroups, lvmd_factory: Any, kube: KubeEmulator) -> AsyncIterator[Env]:  # noqa: F811
    async for e in _env(vgs, lvmd_factory, kube, NORMAL):
        yield e


@pytest.fixture
async def legacy_env(
    vgs: VolumeGroups,
    lvmd_factory: Any,
    kube: KubeEmulator,  # noqa: F811
) -> AsyncIterator[Env]:
    async for e in _env(vgs, lvmd_factory, kube, LEGACY):
        yield e


async def test_create_sets_status_finalizer_and_label(env: Env) -> None:
    env.start_node()
    uid = await env.create_lv("pvc-a", "1Gi")
    status = await env.wait_status("pvc-a")
    assert status == {"volumeID": uid, "currentSize": "1Gi"}
    obj = env.lv("pvc-a")
    assert obj is not None
    assert obj["metadata"]["finalizers"] == ["topolvm.io/logicalvolume"]
    assert obj["metadata"]["labels"] == {"app.kubernetes.io/created-by": "topolvm-controller"}
    assert int(lvs()[uid]["lv_size"]) == GiB


async def test_extent_rounding_reported_in_current_size(env: Env) -> None:
    env.start_node()
    uid = await env.create_lv("pvc-odd", "1023Mi")  # 4 MiB extents: 1023 MiB becomes 1024
    status = await env.wait_status("pvc-odd")
    assert status["currentSize"] == "1Gi"
    assert int(lvs()[uid]["lv_size"]) == GiB


async def test_lv_for_another_node_is_left_alone(env: Env) -> None:
    env.start_node()
    await env.create_lv("pvc-other", "1Gi", node="node2")
    await env.create_lv("pvc-mine", "1Gi")
    await env.wait_status("pvc-mine")
    other = env.lv("pvc-other")
    assert other is not None and "status" not in other and "finalizers" not in other["metadata"]
    assert len(lvs()) == 2  # pool0 + pvc-mine


async def test_resize_grows_the_lv(env: Env) -> None:
    env.start_node()
    uid = await env.create_lv("pvc-r", "1Gi")
    await env.wait_status("pvc-r")
    res = api.logicalvolume_resource(env.names)
    await api.patch_merge(env.client, res, "pvc-r", {"spec": {"size": "2Gi"}})
    await env.wait_for(
        "currentSize 2Gi",
        lambda: ((env.lv("pvc-r") or {}).get("status") or {}).get("currentSize") == "2Gi",
    )
    assert int(lvs()[uid]["lv_size"]) == 2 * GiB


async def test_create_failure_sets_code_and_message_without_lv(env: Env) -> None:
    env.start_node()
    await env.create_lv("pvc-huge", "100Gi")
    status = await env.wait_status("pvc-huge")
    assert status["code"] == 8  # RESOURCE_EXHAUSTED
    assert "no enough space" in status["message"]
    assert "volumeID" not in status
    assert len(lvs()) == 1  # only the thin pool
    # the failure is final: later reconciles do not retry the create
    await asyncio.sleep(1.0)
    assert len(lvs()) == 1


async def test_unknown_device_class_reports_not_found(env: Env) -> None:
    env.start_node()
    await env.create_lv("pvc-nodc", "1Gi", deviceClass="nvme")
    status = await env.wait_status("pvc-nodc")
    assert status["code"] == 5 and "device-class not found" in status["message"]


async def test_snapshot_and_clone_from_a_thin_volume(env: Env) -> None:
    env.start_node()
    src_uid = await env.create_lv("pvc-src", "1Gi", deviceClass="thin")
    await env.wait_status("pvc-src")
    snap_uid = await env.create_lv(
        "snapshot-1", "1Gi", deviceClass="thin", source="pvc-src", accessType="ro"
    )
    clone_uid = await env.create_lv(
        "pvc-clone", "2Gi", deviceClass="thin", source="pvc-src", accessType="rw"
    )
    snap = await env.wait_status("snapshot-1")
    clone = await env.wait_status("pvc-clone")
    assert snap == {"volumeID": snap_uid, "currentSize": "1Gi"}
    assert clone == {"volumeID": clone_uid, "currentSize": "2Gi"}
    report = lvs()
    assert report[snap_uid]["origin"] == src_uid and report[clone_uid]["origin"] == src_uid
    assert report[snap_uid]["lv_attr"][1] == "r"  # read-only snapshot
    assert report[clone_uid]["lv_attr"][1] == "w"


async def test_snapshot_on_thick_class_is_unimplemented(env: Env) -> None:
    env.start_node()
    await env.create_lv("pvc-thick", "1Gi")
    await env.wait_status("pvc-thick")
    await env.create_lv("snapshot-thick", "1Gi", source="pvc-thick", accessType="ro")
    status = await env.wait_status("snapshot-thick")
    assert status["code"] == 12  # UNIMPLEMENTED, as lvmd answers for thick classes


async def test_delete_removes_lv_then_finalizer(env: Env) -> None:
    env.start_node()
    uid = await env.create_lv("pvc-d", "1Gi")
    await env.wait_status("pvc-d")
    res = api.logicalvolume_resource(env.names)
    await env.client.delete(res, "pvc-d")
    await env.wait_for("object gone", lambda: env.lv("pvc-d") is None)
    assert uid not in lvs()


async def test_delete_when_lv_is_already_gone(env: Env) -> None:
    env.start_node()
    uid = await env.create_lv("pvc-g", "1Gi")
    await env.wait_status("pvc-g")
    lvm("lvremove", "-y", f"vg1/{uid}")
    res = api.logicalvolume_resource(env.names)
    await env.client.delete(res, "pvc-g")
    await env.wait_for("object gone", lambda: env.lv("pvc-g") is None)


async def test_pending_deletion_annotation_is_left_alone(env: Env) -> None:
    env.start_node()
    uid = await env.create_lv("pvc-p", "1Gi")
    await env.wait_status("pvc-p")
    obj = env.lv("pvc-p")
    assert obj is not None
    obj["metadata"]["annotations"] = {"topolvm.io/pendingdeletion": "true"}
    obj["metadata"]["finalizers"] = []
    await env.kube.put(obj)
    res = api.logicalvolume_resource(env.names)
    await env.client.delete(res, "pvc-p")
    await env.wait_for("object gone", lambda: env.lv("pvc-p") is None)
    await asyncio.sleep(0.5)
    assert uid in lvs()  # the node controller's cleanup path never removes LVs itself


async def test_restart_adopts_an_lv_created_before_a_crash(env: Env) -> None:
    """The node created the LV, then died before writing status: no second LV, status set."""
    res = api.logicalvolume_resource(env.names)
    uid = await env.create_lv("pvc-crash", "1Gi")
    await env.lvmd.create_lv(pb.CreateLVRequest(name=uid, device_class="ssd", size_bytes=GiB))
    before = lvs()
    env.start_node()
    status = await env.wait_status("pvc-crash")
    assert status == {"volumeID": uid, "currentSize": "1Gi"}
    assert lvs().keys() == before.keys()
    # and a restart of a fully reconciled node changes nothing either
    await env.stop_tasks()
    env.start_node()
    await asyncio.sleep(1.0)
    obj = await api.get(env.client, res, "pvc-crash")
    assert obj is not None and obj["status"] == status
    assert lvs().keys() == before.keys()


async def test_status_write_lost_then_restart_creates_once(env: Env) -> None:
    """Every status write fails for a while (the LV exists by then); the retry adopts it."""
    env.kube.inject("PUT", "logicalvolumes", subresource="status", code=500, times=3)
    env.start_node()
    uid = await env.create_lv("pvc-lost", "1Gi")
    status = await env.wait_status("pvc-lost")
    assert status["volumeID"] == uid
    assert [n for n in lvs() if n != "pool0"] == [uid]
    failed = [
        r for r in env.kube.requests
        if r.method == "PUT" and r.path.endswith("/pvc-lost/status")
    ]  # fmt: skip
    assert len(failed) >= 4  # three injected failures, then the write that stuck


async def test_conflicts_during_status_update_are_retried(env: Env) -> None:
    env.kube.inject("PUT", "logicalvolumes", subresource="status", code=409, times=3)
    env.start_node()
    uid = await env.create_lv("pvc-409", "1Gi")
    status = await env.wait_status("pvc-409")
    assert status == {"volumeID": uid, "currentSize": "1Gi"}
    assert [n for n in lvs() if n != "pool0"] == [uid]


async def test_status_update_after_a_concurrent_change_keeps_the_change(env: Env) -> None:
    """Someone updates the object between our read and our write: we re-read, theirs stays."""
    env.start_node()
    await env.create_lv("pvc-c", "1Gi")
    await env.wait_status("pvc-c")
    res = api.logicalvolume_resource(env.names)
    anno = {"metadata": {"annotations": {"example.com/touched": "yes"}}}
    await api.patch_merge(env.client, res, "pvc-c", anno)
    await api.patch_merge(env.client, res, "pvc-c", {"spec": {"size": "2Gi"}})
    await env.wait_for(
        "resize", lambda: (env.lv("pvc-c") or {}).get("status", {}).get("currentSize") == "2Gi"
    )
    obj = env.lv("pvc-c")
    assert obj is not None and obj["metadata"]["annotations"] == {"example.com/touched": "yes"}


async def test_survives_watch_loss_and_410(env: Env) -> None:
    env.start_node()
    await env.create_lv("pvc-w1", "1Gi")
    await env.wait_status("pvc-w1")
    env.kube.compact()
    await env.kube.close_watches()
    await env.create_lv("pvc-w2", "1Gi")
    await env.wait_status("pvc-w2")


async def test_node_annotations_finalizer_and_metrics(env: Env) -> None:
    env.start_exporter()
    free_ssd = await env.lvmd.get_free_bytes("ssd")

    def annotations() -> dict[str, str]:
        node = env.kube.get("nodes", NODE) or {}
        return dict(node.get("metadata", {}).get("annotations") or {})

    annos = await env.wait_for("capacity annotations", annotations)
    assert annos["capacity.topolvm.io/00default"] == str(free_ssd)
    assert annos["capacity.topolvm.io/ssd"] == str(free_ssd)
    assert int(annos["capacity.topolvm.io/thin"]) == 10 * GiB  # 2 GiB pool x 5 overprovision
    node = env.kube.get("nodes", NODE)
    assert node is not None and node["metadata"]["finalizers"] == ["topolvm.io/node"]

    await env.lvmd.create_lv(pb.CreateLVRequest(name="x1", device_class="ssd", size_bytes=GiB))
    await env.wait_for(
        "annotation after CreateLV",
        lambda: annotations().get("capacity.topolvm.io/ssd") == str(free_ssd - GiB),
    )
    assert env.registry is not None
    samples = {
        (sample.name, sample.labels["device_class"], sample.labels["node"]): sample.value
        for family in text_string_to_metric_families(generate_latest(env.registry).decode())
        for sample in family.samples
    }
    assert samples["topolvm_volumegroup_available_bytes", "ssd", NODE] == free_ssd - GiB
    assert samples["topolvm_thinpool_size_bytes", "thin", NODE] == 2 * GiB
    assert samples["topolvm_thinpool_overprovisioned_available", "thin", NODE] == 10 * GiB
    assert samples["topolvm_volumegroup_size_bytes", "ssd", NODE] == 6 * GiB - 4 * MiB
    for metric in ("topolvm_thinpool_data_percent", "topolvm_thinpool_metadata_percent"):
        assert 0 <= samples[metric, "thin", NODE] <= 100
    assert ("topolvm_thinpool_size_bytes", "ssd", NODE) not in samples


async def test_exporter_stops_when_the_node_is_deleted(env: Env) -> None:
    env.start_exporter()
    assert env.exporter is not None
    await env.wait_for("first update", lambda: env.exporter is not None and env.exporter.updates)
    from lightkube.resources.core_v1 import Node

    await env.client.delete(Node, NODE)  # the finalizer keeps it, with a deletionTimestamp
    await env.lvmd.create_lv(pb.CreateLVRequest(name="x2", device_class="ssd", size_bytes=GiB))
    await asyncio.wait_for(env.exporter.stopped.wait(), 30)
    node = env.kube.get("nodes", NODE)
    assert node is not None and node["metadata"]["deletionTimestamp"]


async def test_legacy_group_and_names(legacy_env: Env) -> None:
    env = legacy_env
    env.start_node()
    env.start_exporter()
    uid = await env.create_lv("pvc-legacy", "1Gi")
    status = await env.wait_status("pvc-legacy")
    assert status["volumeID"] == uid
    obj = env.lv("pvc-legacy")
    assert obj is not None and obj["metadata"]["finalizers"] == ["topolvm.cybozu.com/logicalvolume"]
    assert env.kube.get("logicalvolumes", "pvc-legacy", group="topolvm.io") is None

    def annotations() -> dict[str, str]:
        node = env.kube.get("nodes", NODE) or {}
        return dict(node.get("metadata", {}).get("annotations") or {})

    annos = await env.wait_for("legacy annotations", annotations)
    assert "capacity.topolvm.cybozu.com/00default" in annos
    assert not any(k.startswith("capacity.topolvm.io/") for k in annos)

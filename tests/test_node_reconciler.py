"""The LogicalVolume reconciler under API faults the real API server cannot produce on demand
(injected 500s and 409s on status writes, closed watches, expired resourceVersions): API
emulator + real lvmd on real LVM (in UML). Its ordinary life cycle is tested against the real
kube-apiserver in tests/test_cluster_node.py."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.types import PatchType

from tests.helpers import eventually
from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import kube  # noqa: F401
from tests.lvm_fixtures import THICK, THIN, VolumeGroups, lvm
from topolvm.constants import CREATED_BY_LABEL, NORMAL, Names
from topolvm.k8s import api
from topolvm.k8s.runtime import Controller, Informer
from topolvm.node.lvmd_client import SocketLvmd
from topolvm.node.reconciler import LogicalVolumeReconciler

pytestmark = pytest.mark.uml
GiB = 1 << 30
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

    def wire_node(self) -> tuple[LogicalVolumeReconciler, Informer, Controller]:
        """The reconciler wired the way topolvm-node wires it, not started."""
        self.reconciler = LogicalVolumeReconciler(self.client, self.names, NODE, self.lvmd)
        informer = Informer(self.client, api.logicalvolume_resource(self.names), resync=30)
        controller = Controller("logicalvolume", self.reconciler.reconcile, base_backoff=0.05)
        self.reconciler.watch(informer, controller)
        return self.reconciler, informer, controller

    def start_node(self, wired: tuple[Any, Informer, Controller] | None = None) -> None:
        """Start (or restart) the reconciler the way topolvm-node does."""
        _, informer, controller = wired or self.wire_node()
        self.tasks += [asyncio.create_task(informer.run()), asyncio.create_task(controller.run())]

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


async def test_status_write_lost_then_restart_creates_once(env: Env) -> None:
    """Every status write fails for a while (the LV exists by then); the retry adopts it."""
    env.kube.inject("PATCH", "logicalvolumes", subresource="status", code=500, times=3)
    env.start_node()
    uid = await env.create_lv("pvc-lost", "1Gi")
    status = await env.wait_status("pvc-lost")
    assert status["volumeID"] == uid
    assert [n for n in lvs() if n != "pool0"] == [uid]
    failed = [
        r for r in env.kube.requests
        if r.method == "PATCH" and r.path.endswith("/pvc-lost/status")
    ]  # fmt: skip
    assert len(failed) >= 4  # three injected failures, then the write that stuck


async def test_an_adopted_smaller_lv_is_grown_in_the_same_pass(env: Env) -> None:
    """A crash after lvcreate, then spec.size grew: the LV is adopted and expanded at once."""
    uid = await env.create_lv("pvc-adopt", "2Gi")
    lvm("lvcreate", "-n", uid, "-L", "1g", "-W", "y", "-y", "vg1")  # made before the crash
    env.start_node()

    def grown() -> dict[str, Any] | None:
        st = (env.lv("pvc-adopt") or {}).get("status") or {}
        return st if st.get("currentSize") == "2Gi" else None

    status = await env.wait_for("currentSize 2Gi", grown)
    assert status["volumeID"] == uid and not status.get("code")
    assert int(lvs()[uid]["lv_size"]) == 2 * GiB


async def test_a_volume_costs_the_node_writes_only(env: Env) -> None:
    """Reconciles work from the informer's cache: a volume's life costs the node one write for
    its finalizer and label, one status write and one finalizer removal, and no read of it."""
    env.start_node()
    uid = await env.create_lv("pvc-cost", "1Gi")
    await env.wait_status("pvc-cost")
    res = api.logicalvolume_resource(env.names)
    await env.client.delete(res, "pvc-cost")
    await env.wait_for("LogicalVolume gone", lambda: env.lv("pvc-cost") is None)
    assert uid not in lvs()
    by_node = [
        (r.method, r.path.rsplit("/logicalvolumes/", 1)[1])
        for r in env.kube.requests
        if "/logicalvolumes/pvc-cost" in r.path and r.method != "DELETE"  # the test's delete
    ]  # fmt: skip
    assert by_node == [("PUT", "pvc-cost"), ("PATCH", "pvc-cost/status"), ("PATCH", "pvc-cost")]


def deliver_late(informer: Informer, name: str) -> None:
    """Put into the informer's cache the version before the last one, without its status, as a
    watch event that arrives late leaves it."""
    late = copy.deepcopy(informer.get(name))
    assert late is not None
    late.pop("status", None)
    late["metadata"]["resourceVersion"] = str(int(late["metadata"]["resourceVersion"]) - 1)
    informer.cache[name] = late


async def test_a_late_event_never_writes_a_failure_over_a_created_volume(env: Env) -> None:
    """The informer delivers a version from before the node's own status write late, and lvmd
    is unreachable when it is reconciled. The node reads the object again (its cache is behind
    its own write) and finds nothing to do; acting on the old copy would retry the create and
    write lvmd's error over a volume that exists."""
    reconciler, informer, controller = env.wire_node()
    env.start_node((reconciler, informer, controller))
    uid = await env.create_lv("pvc-late", "1Gi")
    created = await env.wait_status("pvc-late")
    await env.stop_tasks()
    deliver_late(informer, "pvc-late")
    reconciler.lvmd = gone = SocketLvmd(env.socket + ".gone")  # lvmd restarting: UNAVAILABLE
    try:
        assert await reconciler.reconcile("pvc-late") is None
    finally:
        await gone.close()
    assert (env.lv("pvc-late") or {}).get("status") == created
    assert uid in lvs()


async def test_a_failed_create_stays_final_after_a_late_event(env: Env) -> None:
    """The node's last write was a failure (too large for the VG); a version from before it
    arrives late: the node reads the object again and does not try the create a second time."""
    reconciler, informer, controller = env.wire_node()
    env.start_node((reconciler, informer, controller))
    await env.create_lv("pvc-huge", "100Gi")
    failed = await env.wait_status("pvc-huge")
    assert failed["code"] == 8  # RESOURCE_EXHAUSTED
    await env.stop_tasks()
    deliver_late(informer, "pvc-huge")
    before = len(env.kube.requests)

    assert await reconciler.reconcile("pvc-huge") is None
    assert [r.method for r in env.kube.requests[before:]] == ["GET"]
    assert (env.lv("pvc-huge") or {}).get("status") == failed


async def test_a_size_raised_during_the_create_is_acted_on(env: Env) -> None:
    """spec.size grows after the copy the node creates the LV from: the status write lands on
    the larger object, and its echo is reconciled (not skipped as the node's own) to grow it."""
    res = api.logicalvolume_resource(env.names)
    label, value = CREATED_BY_LABEL
    created = await env.client.create(
        res.from_dict({
            "apiVersion": f"{env.group}/v1", "kind": "LogicalVolume",
            "metadata": {"name": "pvc-grow", "finalizers": [env.names.lv_finalizer],
                         "labels": {label: value}},
            "spec": {"name": "pvc-grow", "nodeName": NODE, "size": "1Gi", "deviceClass": "ssd"},
        })
    )  # fmt: skip
    uid = api.to_dict(created)["metadata"]["uid"]
    reconciler, informer, controller = env.wire_node()
    await informer.relist()  # the cache holds the 1Gi version
    await env.client.patch(res, "pvc-grow", {"spec": {"size": "2Gi"}}, patch_type=PatchType.MERGE)
    await reconciler.reconcile("pvc-grow")  # from the cache: creates 1Gi
    assert int(lvs()[uid]["lv_size"]) == GiB

    env.start_node((reconciler, informer, controller))

    def grown() -> dict[str, Any] | None:
        st = (env.lv("pvc-grow") or {}).get("status") or {}
        return st if st.get("currentSize") == "2Gi" else None

    await env.wait_for("currentSize 2Gi", grown, timeout=20)
    assert int(lvs()[uid]["lv_size"]) == 2 * GiB


async def test_conflicts_during_status_update_are_retried(env: Env) -> None:
    env.kube.inject("PATCH", "logicalvolumes", subresource="status", code=409, times=3)
    env.start_node()
    uid = await env.create_lv("pvc-409", "1Gi")
    status = await env.wait_status("pvc-409")
    assert status == {"volumeID": uid, "currentSize": "1Gi"}
    assert [n for n in lvs() if n != "pool0"] == [uid]


async def test_survives_watch_loss_and_410(env: Env) -> None:
    env.start_node()
    await env.create_lv("pvc-w1", "1Gi")
    await env.wait_status("pvc-w1")
    env.kube.compact()
    await env.kube.close_watches()
    await env.create_lv("pvc-w2", "1Gi")
    await env.wait_status("pvc-w2")

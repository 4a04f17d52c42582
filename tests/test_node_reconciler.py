"""The LogicalVolume reconciler under API faults the real API server cannot produce on demand
(injected 500s and 409s on status writes, closed watches, expired resourceVersions): API
emulator + real lvmd on real LVM (in UML). Its ordinary life cycle is tested against the real
kube-apiserver in tests/test_cluster_node.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from lightkube import AsyncClient

from tests.helpers import eventually
from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import kube  # noqa: F401
from tests.lvm_fixtures import THICK, THIN, VolumeGroups, lvm
from topolvm.constants import NORMAL, Names
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

    def start_node(self) -> None:
        """Start (or restart) the reconciler the way topolvm-node wires it."""
        self.reconciler = LogicalVolumeReconciler(self.client, self.names, NODE, self.lvmd)
        informer = Informer(self.client, api.logicalvolume_resource(self.names), resync=30)
        controller = Controller("logicalvolume", self.reconciler.reconcile, base_backoff=0.05)
        self.reconciler.watch(informer, controller)
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

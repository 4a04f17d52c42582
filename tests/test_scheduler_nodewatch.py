"""``--node-cache`` mode under watch faults (410 Gone, API server restarts, lost sync) against the
API emulator (host). The real kube-scheduler + Node watch is in tests/test_cluster_scheduler.py."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers import free_port
from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import kube, write_kubeconfig  # noqa: F401

DATA = Path(__file__).parent / "data" / "scheduler"
GiB = 1 << 30


def node(name: str, **caps: int) -> dict[str, Any]:
    annotations = {f"capacity.topolvm.io/{dc}": str(v) for dc, v in caps.items()}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": annotations}}  # fmt: skip


class Extender:
    def __init__(self, url: str, http: aiohttp.ClientSession):
        self.url = url
        self.http = http

    async def predicate(self, names: list[str]) -> dict[str, Any]:
        body = json.loads((DATA / "nodenames-pascal.json").read_text())  # requests 10 GiB of ssd
        body["NodeNames"] = names
        async with self.http.post(f"{self.url}/predicate", json=body) as resp:
            assert resp.status == 200, await resp.text()
            reply: dict[str, Any] = await resp.json()
            return reply

    async def until(self, names: list[str], passing: list[str], timeout: float = 20) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            reply = await self.predicate(names)
            if reply["NodeNames"] == passing:
                return reply
            if loop.time() > deadline:
                raise AssertionError(f"expected {passing} to pass, last reply {reply}")
            await asyncio.sleep(0.1)


@pytest.fixture
async def extender(kube: KubeEmulator, tmp_path: Path) -> AsyncIterator[Extender]:  # noqa: F811
    kube.create(node("node-a", ssd=20 * GiB))
    kube.create(node("node-b", ssd=GiB))
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-c"}})
    kc = write_kubeconfig(tmp_path / "kc", kube.url)
    port = free_port()
    log = (tmp_path / "scheduler.log").open("w")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "topolvm", "--log-format", "text", "scheduler", "--node-cache",
        "--kubeconfig", str(kc), "--listen", f"127.0.0.1:{port}",
        stdout=log, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                try:
                    async with http.get(f"{url}/status") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.05)
            yield Extender(url, http)
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 20)
        log.close()
    assert proc.returncode == 0, (tmp_path / "scheduler.log").read_text()


async def test_watch_recovers_from_410_and_apiserver_restarts(
    extender: Extender,
    kube: KubeEmulator,  # noqa: F811
) -> None:
    await extender.until(["node-a", "node-b"], ["node-a"])
    kube.compact()
    await kube.close_watches()
    kube.create(node("node-b", ssd=30 * GiB))
    await extender.until(["node-a", "node-b"], ["node-a", "node-b"])


async def test_lost_sync_means_unknown_capacity_not_zero(
    extender: Extender,
    kube: KubeEmulator,  # noqa: F811
) -> None:
    await extender.until(["node-a"], ["node-a"])
    kube.inject("GET", "nodes", code=500, times=1000)  # lists and watches fail from now on
    await kube.close_watches()
    reply = await extender.until(["node-a"], [], timeout=30)
    assert "unknown capacity" in reply["FailedNodes"]["node-a"]
    assert "lost its sync" in reply["FailedNodes"]["node-a"]

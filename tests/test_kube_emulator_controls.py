"""The Kubernetes API emulator's test controls: injected faults, the request log, direct
state access, the standalone CLI and several clients."""

# ruff: noqa: F811  (pytest fixtures imported from tests.kube_fixtures and
# tests.kube_emulator_helpers are parameters here)

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.types import PatchType

from tests.kube_emulator import KubeEmulator
from tests.kube_emulator_helpers import (
    Collector,
    LogicalVolume,
    http,  # noqa: F401
    lv,
)
from tests.kube_fixtures import client_for, kube, kube_client  # noqa: F401


async def test_injected_faults(kube_client: AsyncClient, kube: KubeEmulator) -> None:
    created = await kube_client.create(lv("v1"))
    kube.inject("PUT", "logicalvolumes", name="v1")
    rv = kube.resource_version
    with pytest.raises(ApiError) as exc:
        await kube_client.replace(created)
    assert exc.value.status.code == 409 and exc.value.status.reason == "Conflict"
    assert "the object has been modified" in (exc.value.status.message or "")
    assert kube.resource_version == rv
    created["spec"]["size"] = "2Gi"
    assert (await kube_client.replace(created))["spec"]["size"] == "2Gi"  # only once

    kube.inject("GET", "logicalvolumes", code=500, reason="InternalError", times=2)
    assert kube.pending_faults == 2
    for _ in range(2):
        with pytest.raises(ApiError) as exc:
            await kube_client.get(LogicalVolume, "v1")
        assert exc.value.status.code == 500 and exc.value.status.reason == "InternalError"
    await kube_client.get(LogicalVolume, "v1")
    assert kube.pending_faults == 0

    kube.inject("PATCH", "logicalvolumes", subresource="status", code=503)
    await kube_client.patch(  # the main resource is not affected
        LogicalVolume, "v1", {"metadata": {"labels": {"a": "b"}}}, patch_type=PatchType.MERGE
    )
    with pytest.raises(ApiError) as exc:
        await kube_client.patch(
            LogicalVolume.Status, "v1", {"status": {"code": 1}}, patch_type=PatchType.MERGE
        )
    assert exc.value.status.code == 503
    recorded = [r for r in kube.requests if r.method == "PATCH"]
    assert recorded[-1].path == "/apis/topolvm.io/v1/logicalvolumes/v1/status"
    assert recorded[-1].content_type == "application/merge-patch+json"
    assert recorded[-1].body == {"status": {"code": 1}}


async def test_direct_state_access(kube_client: AsyncClient, kube: KubeEmulator) -> None:
    watch = Collector(kube_client.watch(LogicalVolume))
    try:
        seeded = await kube.put(
            {
                "apiVersion": "topolvm.cybozu.com/v1",
                "kind": "LogicalVolume",
                "metadata": {"name": "legacy"},
                "spec": {"name": "legacy", "nodeName": "n", "size": "1"},
            }
        )
        assert seeded["metadata"]["uid"]
        obj = kube.create(
            {
                "apiVersion": "topolvm.io/v1",
                "kind": "LogicalVolume",
                "metadata": {"name": "new", "finalizers": ["f"]},
                "spec": {"name": "new", "nodeName": "n", "size": "1"},
                "status": {"volumeID": "id"},
            }
        )
        kind, got = await watch.next()  # the legacy group is a different resource
        assert kind == "ADDED" and got["status"] == {"volumeID": "id"}
        assert got.metadata.resourceVersion == obj["metadata"]["resourceVersion"]  # type: ignore[union-attr]
        assert [o["metadata"]["name"] for o in kube.list("logicalvolumes", group="topolvm.io")] == [
            "new"
        ]
        with pytest.raises(KeyError):
            kube.get("logicalvolumes", "new")  # ambiguous without a group
        removed = await kube.remove("logicalvolumes", "new", group="topolvm.io")
        assert removed is not None
        assert (await watch.next())[0] == "DELETED"
        assert kube.get("logicalvolumes", "new", group="topolvm.io") is None
        assert kube.get("logicalvolumes", "legacy", group="topolvm.cybozu.com") is not None
    finally:
        await watch.close()


async def test_cli_serves(http: aiohttp.ClientSession) -> None:
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.kube_emulator", "--port", "0",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
        async with http.get(f"{url}/api/v1/nodes") as r:
            assert (await r.json())["kind"] == "NodeList"
    finally:
        proc.terminate()
        await proc.wait()


async def test_second_client(kube: KubeEmulator) -> None:
    a, b = client_for(kube), client_for(kube, namespace="other")
    try:
        await a.create(Lease(metadata=ObjectMeta(name="l"), spec=LeaseSpec(holderIdentity="a")))
        await b.create(Lease(metadata=ObjectMeta(name="l"), spec=LeaseSpec(holderIdentity="b")))
        assert {(x["metadata"]["namespace"]) for x in kube.list("leases")} == {"default", "other"}
    finally:
        await a.close()
        await b.close()

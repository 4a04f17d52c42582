"""The Kubernetes API emulator: replace, patch, status subresources, generation, finalizers
and deletion, driven by the production client (lightkube) and raw HTTP."""

# ruff: noqa: F811  (pytest fixtures imported from tests.kube_fixtures and
# tests.kube_emulator_helpers are parameters here)

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import NodeStatus
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from tests.kube_emulator import KubeEmulator
from tests.kube_emulator_helpers import (
    Collector,
    LogicalVolume,
    http,  # noqa: F401
    lv,
    node,
)
from tests.kube_fixtures import kube, kube_client  # noqa: F401


async def test_replace_conflict_and_unconditional(kube_client: AsyncClient) -> None:
    first = await kube_client.create(node("n1"))
    assert first.metadata is not None
    stale_rv = first.metadata.resourceVersion
    first.metadata.labels = {"x": "1"}
    updated = await kube_client.replace(first)
    assert updated.metadata is not None and updated.metadata.resourceVersion != stale_rv

    first.metadata.labels = {"x": "2"}
    first.metadata.resourceVersion = stale_rv
    with pytest.raises(ApiError) as exc:
        await kube_client.replace(first)
    status = exc.value.status
    assert status.code == 409 and status.reason == "Conflict"
    assert status.message == (
        'Operation cannot be fulfilled on nodes "n1": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )

    first.metadata.resourceVersion = None  # unconditional update of a built-in kind
    done = await kube_client.replace(first)
    assert done.metadata is not None and done.metadata.labels == {"x": "2"}


async def test_crd_replace_requires_resource_version(kube_client: AsyncClient) -> None:
    created = await kube_client.create(lv("v1"))
    created["metadata"] = {"name": "v1"}
    with pytest.raises(ApiError) as exc:
        await kube_client.replace(created)
    assert exc.value.status.code == 422
    assert "must be specified for an update" in (exc.value.status.message or "")


async def test_immutable_metadata(kube_client: AsyncClient, kube: KubeEmulator) -> None:
    created = await kube_client.create(node("n1"))
    assert created.metadata is not None
    uid, ts = created.metadata.uid, kube.get("nodes", "n1", group="")["metadata"]  # type: ignore[index]
    await kube_client.patch(
        Node,
        "n1",
        {"metadata": {"creationTimestamp": "2000-01-01T00:00:00Z", "labels": {"a": "b"}}},
        patch_type=PatchType.MERGE,
    )
    stored = kube.get("nodes", "n1")
    assert stored is not None
    assert stored["metadata"]["creationTimestamp"] == ts["creationTimestamp"]
    assert stored["metadata"]["uid"] == uid
    with pytest.raises(ApiError) as exc:
        await kube_client.patch(Node, "n1", {"metadata": {"uid": "x"}}, patch_type=PatchType.MERGE)
    assert exc.value.status.code == 422
    with pytest.raises(ApiError) as exc:
        await kube_client.patch(Node, "n1", {"metadata": {"name": "x"}}, patch_type=PatchType.MERGE)
    assert exc.value.status.code == 400 and exc.value.status.reason == "BadRequest"


async def test_noop_update_keeps_resource_version(kube_client: AsyncClient) -> None:
    created = await kube_client.create(node("n1"))
    again = await kube_client.replace(created)
    assert again.metadata is not None and created.metadata is not None
    assert again.metadata.resourceVersion == created.metadata.resourceVersion


async def test_merge_and_json_patch(kube_client: AsyncClient, kube: KubeEmulator) -> None:
    await kube_client.create(node("n1", {"keep": "1", "drop": "1"}))
    patched = await kube_client.patch(
        Node, "n1", {"metadata": {"labels": {"drop": None, "new": "2"}}}, patch_type=PatchType.MERGE
    )
    assert patched.metadata is not None
    assert patched.metadata.labels == {"keep": "1", "new": "2"}

    ops = [
        {"op": "test", "path": "/metadata/labels/keep", "value": "1"},
        {"op": "add", "path": "/metadata/labels/a~1b", "value": "3"},
        {"op": "remove", "path": "/metadata/labels/new"},
        {"op": "add", "path": "/spec/taints", "value": [{"key": "k", "effect": "NoSchedule"}]},
        {"op": "add", "path": "/spec/taints/-", "value": {"key": "z", "effect": "NoExecute"}},
        {"op": "copy", "from": "/metadata/labels/keep", "path": "/metadata/labels/copied"},
        {"op": "move", "from": "/metadata/labels/copied", "path": "/metadata/labels/moved"},
        {"op": "replace", "path": "/spec/podCIDR", "value": "10.1.0.0/24"},
    ]
    patched = await kube_client.patch(Node, "n1", ops, patch_type=PatchType.JSON)
    assert patched.metadata is not None and patched.spec is not None
    assert patched.metadata.labels == {"keep": "1", "a/b": "3", "moved": "1"}
    assert [t.key for t in patched.spec.taints or []] == ["k", "z"]
    assert patched.spec.podCIDR == "10.1.0.0/24"

    rv = kube.resource_version
    with pytest.raises(ApiError) as exc:
        await kube_client.patch(
            Node,
            "n1",
            [
                {"op": "replace", "path": "/spec/podCIDR", "value": "x"},
                {"op": "test", "path": "/metadata/labels/keep", "value": "nope"},
            ],
            patch_type=PatchType.JSON,
        )
    assert exc.value.status.code == 422 and exc.value.status.reason == "Invalid"
    assert kube.resource_version == rv  # nothing was written
    stored = kube.get("nodes", "n1")
    assert stored is not None and stored["spec"]["podCIDR"] == "10.1.0.0/24"

    with pytest.raises(ApiError) as exc:
        await kube_client.patch(
            Node, "n1", [{"op": "remove", "path": "/spec/nothing"}], patch_type=PatchType.JSON
        )
    assert exc.value.status.code == 422


async def test_patch_carrying_resource_version(kube_client: AsyncClient) -> None:
    created = await kube_client.create(lv("v1"))
    rv = created.metadata.resourceVersion
    ok = await kube_client.patch(
        LogicalVolume,
        "v1",
        {"metadata": {"resourceVersion": rv}, "spec": {"size": "2Gi"}},
        patch_type=PatchType.MERGE,
    )
    assert ok["spec"]["size"] == "2Gi"
    with pytest.raises(ApiError) as exc:
        await kube_client.patch(
            LogicalVolume,
            "v1",
            {"metadata": {"resourceVersion": rv}, "spec": {"size": "3Gi"}},
            patch_type=PatchType.MERGE,
        )
    assert exc.value.status.code == 409 and exc.value.status.reason == "Conflict"
    assert 'logicalvolumes.topolvm.io "v1": the object has been modified' in (
        exc.value.status.message or ""
    )


async def test_strategic_and_apply_patch(kube_client: AsyncClient) -> None:
    await kube_client.create(node("n1"))
    patched = await kube_client.patch(Node, "n1", {"metadata": {"labels": {"s": "1"}}})
    assert patched.metadata is not None and patched.metadata.labels == {"s": "1"}
    await kube_client.create(lv("v1"))
    with pytest.raises(ApiError) as exc:
        await kube_client.patch(LogicalVolume, "v1", {"spec": {"size": "2Gi"}})
    assert exc.value.status.code == 415 and exc.value.status.reason == "UnsupportedMediaType"
    with pytest.raises(ApiError) as exc:
        await kube_client.patch(
            Node, "n1", {"metadata": {}}, patch_type=PatchType.APPLY, field_manager="t"
        )
    assert exc.value.status.code == 415


async def test_status_subresource_isolation_and_generation(
    kube_client: AsyncClient, kube: KubeEmulator
) -> None:
    created = await kube_client.create(lv("v1"))
    assert created.status is None  # status is dropped on create
    gen = created.metadata.generation
    assert gen == 1

    # The main resource ignores status...
    with_status = await kube_client.patch(
        LogicalVolume,
        "v1",
        {"status": {"volumeID": "x"}, "metadata": {"labels": {"l": "1"}}},
        patch_type=PatchType.MERGE,
    )
    assert with_status.status is None and with_status.metadata.labels == {"l": "1"}
    assert with_status.metadata.generation == 1

    # ...the status subresource changes only status (and keeps the resourceVersion check).
    st = await kube_client.patch(
        LogicalVolume.Status,
        "v1",
        {"status": {"volumeID": "vol"}, "spec": {"size": "9Gi"}, "metadata": {"labels": None}},
        patch_type=PatchType.MERGE,
    )
    assert st["status"] == {"volumeID": "vol"} and st["spec"]["size"] == "1Gi"
    assert st.metadata.labels == {"l": "1"} and st.metadata.generation == 1

    stale = dict(st)
    stale["metadata"] = {"name": "v1", "resourceVersion": created.metadata.resourceVersion}
    stale["status"] = {"volumeID": "other"}
    with pytest.raises(ApiError) as exc:
        await kube_client.replace(LogicalVolume.Status(stale), "v1")
    assert exc.value.status.code == 409

    # A spec change bumps generation and keeps the status.
    current = await kube_client.get(LogicalVolume, "v1")
    current["spec"]["size"] = "5Gi"
    current["status"] = {"volumeID": "ignored"}
    replaced = await kube_client.replace(current)
    assert replaced.metadata.generation == 2
    assert replaced["status"] == {"volumeID": "vol"}

    # Built-in kinds behave the same: a Node's status via the main resource is ignored.
    n = await kube_client.create(Node(metadata=ObjectMeta(name="n1"), status=NodeStatus()))
    assert n.metadata is not None
    n.status = NodeStatus(capacity={"cpu": "4"})
    assert (await kube_client.replace(n)).status in (None, NodeStatus())
    stored = kube.get("nodes", "n1")
    assert stored is not None and "capacity" not in (stored.get("status") or {})


async def test_finalizers_and_deletion(kube_client: AsyncClient, kube: KubeEmulator) -> None:
    v = lv("v1")
    v["metadata"] = ObjectMeta(name="v1", finalizers=["topolvm.io/a", "topolvm.io/b"])
    await kube_client.create(v)
    watch = Collector(kube_client.watch(LogicalVolume, resource_version=kube.resource_version))
    try:
        await kube_client.delete(LogicalVolume, "v1")
        kind, obj = await watch.next()
        first = kube.get("logicalvolumes", "v1", group="topolvm.io")
        assert first is not None and kind == "MODIFIED"
        ts = first["metadata"]["deletionTimestamp"]
        assert ts and first["metadata"]["deletionGracePeriodSeconds"] == 0
        assert obj.metadata.deletionTimestamp is not None  # type: ignore[union-attr]

        rv = kube.resource_version
        await asyncio.sleep(1.1)  # a second DELETE keeps the first timestamp
        await kube_client.delete(LogicalVolume, "v1")
        again = kube.get("logicalvolumes", "v1", group="topolvm.io")
        assert again is not None and again["metadata"]["deletionTimestamp"] == ts
        assert kube.resource_version == rv

        with pytest.raises(ApiError) as exc:
            await kube_client.patch(
                LogicalVolume,
                "v1",
                {"metadata": {"finalizers": ["topolvm.io/a", "topolvm.io/b", "new"]}},
                patch_type=PatchType.MERGE,
            )
        assert exc.value.status.code == 422
        assert (
            "metadata.finalizers: Forbidden: no new finalizers can be added if the object is "
            "being deleted" in (exc.value.status.message or "")
        )

        await kube_client.patch(
            LogicalVolume,
            "v1",
            [{"op": "remove", "path": "/metadata/finalizers/0"}],
            patch_type=PatchType.JSON,
        )
        assert (await watch.next())[0] == "MODIFIED"
        assert kube.get("logicalvolumes", "v1", group="topolvm.io") is not None
        await kube_client.patch(
            LogicalVolume, "v1", {"metadata": {"finalizers": None}}, patch_type=PatchType.MERGE
        )
        kind, obj = await watch.next()
        assert kind == "DELETED" and obj.metadata.name == "v1"  # type: ignore[union-attr]
        assert kube.get("logicalvolumes", "v1", group="topolvm.io") is None
    finally:
        await watch.close()


async def test_delete_without_finalizers_and_preconditions(
    kube_client: AsyncClient, kube: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    await kube_client.create(node("n1"))
    url = f"{kube.url}/api/v1/nodes/n1"
    pre = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "wrong"}}
    async with http.delete(url, json=pre) as r:
        body = await r.json()
        assert r.status == 409 and body["reason"] == "Conflict"
        assert "Precondition failed: UID in precondition: wrong" in body["message"]
    pre = {"preconditions": {"resourceVersion": "1"}}
    async with http.delete(url, json=pre) as r:
        assert r.status == 409
    async with http.delete(url) as r:
        assert r.status == 200 and (await r.json())["metadata"]["name"] == "n1"
    assert kube.get("nodes", "n1") is None
    with pytest.raises(ApiError) as exc:
        await kube_client.delete(Node, "n1")
    assert exc.value.status.code == 404

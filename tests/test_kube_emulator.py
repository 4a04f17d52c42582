"""The Kubernetes API emulator, driven by the production client (lightkube) and raw HTTP."""

# ruff: noqa: F811  (pytest fixtures imported from tests.kube_fixtures are parameters here)

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, Generic, TypeVar

import aiohttp
import pytest
from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_global_resource
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.core_v1 import NodeSpec, NodeStatus, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import OnErrorAction, OnErrorResult, PatchType

from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import client_for, kube, kube_client  # noqa: F401

LogicalVolume = create_global_resource("topolvm.io", "v1", "LogicalVolume", "logicalvolumes")

T = TypeVar("T")
JSON = dict[str, Any]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


class Collector(Generic[T]):
    """Consumes a lightkube watch in a task; ``next()`` returns events one by one."""

    def __init__(self, stream: AsyncIterable[tuple[str, T]]) -> None:
        self.queue: asyncio.Queue[tuple[str, T] | BaseException] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(stream))

    async def _run(self, stream: AsyncIterable[tuple[str, T]]) -> None:
        try:
            async for item in stream:
                self.queue.put_nowait(item)
        except Exception as e:
            self.queue.put_nowait(e)

    async def next(self, timeout: float = 5.0) -> tuple[str, T]:
        item = await asyncio.wait_for(self.queue.get(), timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    async def error(self, timeout: float = 5.0) -> BaseException:
        item = await asyncio.wait_for(self.queue.get(), timeout)
        assert isinstance(item, BaseException), item
        return item

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def node(name: str, labels: dict[str, str] | None = None) -> Node:
    return Node(metadata=ObjectMeta(name=name, labels=labels), spec=NodeSpec(podCIDR="10.0.0.0/24"))


def lv(name: str, node_name: str = "n1", size: str = "1Gi") -> Any:
    return LogicalVolume(
        metadata=ObjectMeta(name=name),
        spec={"name": name, "nodeName": node_name, "size": size},
    )


async def raw_events(resp: aiohttp.ClientResponse) -> list[JSON]:
    return [json.loads(line) async for line in resp.content if line.strip()]


# ---------------------------------------------------------------------------- basics


async def test_version_health_discovery_and_unknown(
    kube: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{kube.url}/version") as r:
        assert (await r.json())["major"] == "1"
    async with http.get(f"{kube.url}/healthz") as r:
        assert await r.text() == "ok"
    async with http.get(f"{kube.url}/apis") as r:
        groups = {g["name"] for g in (await r.json())["groups"]}
        assert {"topolvm.io", "topolvm.cybozu.com", "coordination.k8s.io"} <= groups
    async with http.get(f"{kube.url}/apis/example.com/v1/widgets") as r:
        body = await r.json()
        assert r.status == 404
        assert (body["kind"], body["status"], body["reason"], body["code"]) == (
            "Status",
            "Failure",
            "NotFound",
            404,
        )
    async with http.post(f"{kube.url}/api/v1/nodes/n1") as r:
        assert r.status == 405
        assert (await r.json())["reason"] == "MethodNotAllowed"


async def test_create_get_list_and_metadata(kube_client: AsyncClient, kube: KubeEmulator) -> None:
    created = await kube_client.create(node("n1", {"a": "1"}))
    meta = created.metadata
    assert meta is not None and meta.uid and meta.resourceVersion
    assert meta.generation == 1 and meta.creationTimestamp is not None
    got = await kube_client.get(Node, "n1")
    assert got.metadata is not None and got.metadata.uid == meta.uid
    second = await kube_client.create(node("n2"))
    assert second.metadata is not None
    assert int(second.metadata.resourceVersion or 0) > int(meta.resourceVersion)
    stored = kube.get("nodes", "n1")
    assert stored is not None and stored["kind"] == "Node" and stored["apiVersion"] == "v1"
    assert stored["metadata"]["creationTimestamp"].endswith("Z")

    with pytest.raises(ApiError) as exc:
        await kube_client.create(node("n1"))
    assert exc.value.status.code == 409 and exc.value.status.reason == "AlreadyExists"
    assert exc.value.status.message == 'nodes "n1" already exists'

    with pytest.raises(ApiError) as exc:
        await kube_client.create(Node(metadata=ObjectMeta()))
    assert exc.value.status.code == 422 and exc.value.status.reason == "Invalid"

    gen = await kube_client.create(Node(metadata=ObjectMeta(generateName="worker-")))
    assert gen.metadata is not None and gen.metadata.name
    assert gen.metadata.name.startswith("worker-") and len(gen.metadata.name) == len("worker-") + 5

    with pytest.raises(ApiError) as exc:
        await kube_client.get(Node, "missing")
    assert exc.value.status.code == 404 and exc.value.status.message == 'nodes "missing" not found'
    details = exc.value.status.details
    assert details is not None and details.name == "missing" and details.kind == "nodes"

    names = [n.metadata.name or "" async for n in kube_client.list(Node) if n.metadata]
    assert sorted(names) == sorted(["n1", "n2", gen.metadata.name or ""])


async def test_namespaced_list_across_namespaces_and_paging(
    kube_client: AsyncClient, kube: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    for ns in ("a", "b"):
        for i in range(3):
            await kube_client.create(
                Lease(metadata=ObjectMeta(name=f"l{i}", namespace=ns), spec=LeaseSpec())
            )
    in_a = [
        x.metadata.namespace async for x in kube_client.list(Lease, namespace="a") if x.metadata
    ]
    assert in_a == ["a"] * 3
    everywhere = kube_client.list(Lease, namespace="*", chunk_size=2)
    keys = [(x.metadata.namespace, x.metadata.name) async for x in everywhere if x.metadata]
    assert keys == [(ns, f"l{i}") for ns in ("a", "b") for i in range(3)]
    assert everywhere.resourceVersion == kube.resource_version
    paged = [r for r in kube.requests if r.path == "/apis/coordination.k8s.io/v1/leases"]
    assert len(paged) == 3 and "continue" in paged[1].query  # 2 + 2 + 2
    async with http.get(f"{kube.url}/apis/coordination.k8s.io/v1/leases?limit=4") as r:
        body = await r.json()
    assert body["kind"] == "LeaseList" and body["apiVersion"] == "coordination.k8s.io/v1"
    assert len(body["items"]) == 4 and body["metadata"]["continue"]
    assert all(i["kind"] == "Lease" for i in body["items"])


# ---------------------------------------------------------------------------- updates


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


# ---------------------------------------------------------------------------- deletion


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


# ---------------------------------------------------------------------------- selectors


async def test_label_selectors(kube_client: AsyncClient) -> None:
    await kube_client.create(node("a", {"tier": "web", "zone": "z1"}))
    await kube_client.create(node("b", {"tier": "db", "zone": "z2"}))
    await kube_client.create(node("c", {"tier": "cache"}))

    async def names(selector: str) -> list[str]:
        # lightkube passes a pre-built selector string through the labels dict's encoding
        return sorted(
            [
                n.metadata.name or ""
                async for n in kube_client._client.list(
                    kube_client._client.prepare_request(
                        "list", Node, params={"labelSelector": selector}
                    )
                )
                if n.metadata
            ]
        )

    assert await names("tier=web") == ["a"]
    assert await names("tier==web") == ["a"]
    assert await names("tier!=web") == ["b", "c"]
    assert await names("tier in (web, db)") == ["a", "b"]
    assert await names("tier notin (web,db)") == ["c"]
    assert await names("zone") == ["a", "b"]
    assert await names("!zone") == ["c"]
    assert await names("zone,tier!=db") == ["a"]
    assert await names("zone!=z1") == ["b", "c"]
    # the public lightkube API builds the same selectors
    from lightkube import operators

    listed = kube_client.list(Node, labels={"tier": operators.not_in(["web"]), "zone": None})
    assert [n.metadata.name async for n in listed if n.metadata] == ["b"]


async def test_field_selectors(kube_client: AsyncClient, http: aiohttp.ClientSession) -> None:
    for ns, name, node_name in (("x", "p1", "n1"), ("x", "p2", "n2"), ("y", "p3", "n1")):
        await kube_client.create(
            Pod(
                metadata=ObjectMeta(name=name, namespace=ns),
                spec=PodSpec(containers=[], nodeName=node_name),
            )
        )
    on_n1 = kube_client.list(Pod, namespace="*", fields={"spec.nodeName": "n1"})
    assert [p.metadata.name async for p in on_n1 if p.metadata] == ["p1", "p3"]
    named = kube_client.list(Pod, namespace="x", fields={"metadata.name": "p2"})
    assert [p.metadata.name async for p in named if p.metadata] == ["p2"]
    not_x = kube_client.list(
        Pod, namespace="*", fields={"metadata.namespace": "y", "spec.nodeName": "n1"}
    )
    assert [p.metadata.name async for p in not_x if p.metadata] == ["p3"]
    from lightkube import operators

    neq = kube_client.list(Pod, namespace="*", fields={"spec.nodeName": operators.not_equal("n1")})
    assert [p.metadata.name async for p in neq if p.metadata] == ["p2"]

    with pytest.raises(ApiError) as exc:
        _ = [p async for p in kube_client.list(Pod, namespace="*", fields={"spec.foo": "1"})]
    assert exc.value.status.code == 400 and exc.value.status.reason == "BadRequest"
    with pytest.raises(ApiError) as exc:
        _ = [n async for n in kube_client.list(Node, fields={"spec.nodeName": "n1"})]
    assert exc.value.status.code == 400  # not selectable on nodes
    async with http.get(
        f"{kube_client.config.cluster.server}/api/v1/pods?labelSelector=a%20b"
    ) as r:
        assert r.status == 400


# ---------------------------------------------------------------------------- watch


async def test_watch_from_zero_then_live(kube_client: AsyncClient, kube: KubeEmulator) -> None:
    await kube_client.create(node("a"))
    await kube_client.create(node("b"))
    watch = Collector(kube_client.watch(Node, resource_version="0"))
    try:
        first = [await watch.next(), await watch.next()]
        assert [(k, o.metadata.name) for k, o in first if o.metadata] == [
            ("ADDED", "a"),
            ("ADDED", "b"),
        ]
        await kube_client.patch(
            Node, "a", {"metadata": {"labels": {"x": "1"}}}, patch_type=PatchType.MERGE
        )
        kind, obj = await watch.next()
        assert kind == "MODIFIED" and obj.metadata is not None
        assert obj.metadata.labels == {"x": "1"}
        assert obj.metadata.resourceVersion == kube.resource_version
        await kube_client.delete(Node, "b")
        kind, obj = await watch.next()
        assert kind == "DELETED" and obj.metadata is not None and obj.metadata.name == "b"
        assert obj.kind == "Node" and obj.apiVersion == "v1"
    finally:
        await watch.close()


async def test_watch_from_resource_version_replays(
    kube_client: AsyncClient, kube: KubeEmulator
) -> None:
    await kube_client.create(node("a"))
    since = kube.resource_version
    await kube_client.create(node("b"))
    await kube_client.delete(Node, "a")
    watch = Collector(kube_client.watch(Node, resource_version=since))
    try:
        events = [await watch.next(), await watch.next()]
        assert [(k, o.metadata.name) for k, o in events if o.metadata] == [
            ("ADDED", "b"),
            ("DELETED", "a"),
        ]
        with pytest.raises(TimeoutError):
            await watch.next(timeout=0.3)
    finally:
        await watch.close()


async def test_watch_selector_transitions(kube_client: AsyncClient, kube: KubeEmulator) -> None:
    await kube_client.create(node("a", {"role": "x"}))
    watch = Collector(kube_client.watch(Node, labels={"role": "x"}, resource_version="0"))
    try:
        assert (await watch.next())[0] == "ADDED"
        await kube_client.create(node("other", {"role": "y"}))  # never seen
        await kube_client.patch(
            Node, "a", {"metadata": {"labels": {"role": "y"}}}, patch_type=PatchType.MERGE
        )
        kind, obj = await watch.next()
        assert kind == "DELETED" and obj.metadata is not None and obj.metadata.name == "a"
        await kube_client.patch(
            Node, "other", {"metadata": {"labels": {"role": "x"}}}, patch_type=PatchType.MERGE
        )
        kind, obj = await watch.next()
        assert kind == "ADDED" and obj.metadata is not None and obj.metadata.name == "other"
    finally:
        await watch.close()


async def test_watch_too_old_resource_version(kube_client: AsyncClient, kube: KubeEmulator) -> None:
    await kube_client.create(node("a"))
    old = kube.resource_version
    await kube_client.create(node("b"))
    kube.compact()

    # lightkube raises the 410 from the ERROR event by default.
    watch = Collector(kube_client.watch(Node, resource_version=old))
    try:
        err = await watch.error()
        assert isinstance(err, ApiError)
        assert err.status.code == 410 and err.status.reason == "Expired"
        assert err.status.message == f"too old resource version: {old} ({kube.resource_version})"
    finally:
        await watch.close()

    # With a retrying error handler it restarts from scratch: synthetic ADDED for everything.
    def retry(e: Exception, count: int) -> OnErrorResult:
        return OnErrorResult(OnErrorAction.RETRY)

    watch = Collector(kube_client.watch(Node, resource_version=old, on_error=retry))
    try:
        events = [await watch.next(), await watch.next()]
        assert sorted(o.metadata.name or "" for _, o in events if o.metadata) == ["a", "b"]
        assert {k for k, _ in events} == {"ADDED"}
        watches = [r.query for r in kube.requests if r.query.get("watch") == "true"]
        assert watches[-2].get("resourceVersion") == old
        assert "resourceVersion" not in watches[-1]
    finally:
        await watch.close()


async def test_watch_history_limit(http: aiohttp.ClientSession) -> None:
    async with KubeEmulator(history_limit=3) as emu:
        start = emu.resource_version
        for i in range(5):
            emu.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"n{i}"}})
        url = f"{emu.url}/api/v1/nodes?watch=true&resourceVersion={start}"
        async with http.get(url) as r:
            events = await raw_events(r)
        assert [e["type"] for e in events] == ["ERROR"]
        assert events[0]["object"]["code"] == 410
        ok_from = int(emu.resource_version) - 3
        url = f"{emu.url}/api/v1/nodes?watch=true&resourceVersion={ok_from}&timeoutSeconds=1"
        async with http.get(url) as r:
            events = await raw_events(r)
        assert [e["object"]["metadata"]["name"] for e in events] == ["n2", "n3", "n4"]


async def test_bookmarks(kube: KubeEmulator, http: aiohttp.ClientSession) -> None:
    kube.bookmark_interval = 60.0
    url = f"{kube.url}/apis/topolvm.io/v1/logicalvolumes?watch=1&allowWatchBookmarks=true"
    async with http.get(url) as r:
        assert r.status == 200
        await kube.put(
            {
                "apiVersion": "topolvm.io/v1",
                "kind": "LogicalVolume",
                "metadata": {"name": "v"},
                "spec": {"name": "v", "nodeName": "n", "size": "1"},
            }
        )
        added = json.loads(await asyncio.wait_for(r.content.readline(), 5))
        assert added["type"] == "ADDED"
        await kube.send_bookmarks()
        mark = json.loads(await asyncio.wait_for(r.content.readline(), 5))
        assert mark == {
            "type": "BOOKMARK",
            "object": {
                "kind": "LogicalVolume",
                "apiVersion": "topolvm.io/v1",
                "metadata": {"resourceVersion": kube.resource_version},
            },
        }
    kube.bookmark_interval = 0.1
    async with http.get(url) as r:  # periodic bookmarks, after the synthetic ADDED
        types = [json.loads(await asyncio.wait_for(r.content.readline(), 5))["type"]]
        types += [json.loads(await asyncio.wait_for(r.content.readline(), 5))["type"]]
        types += [json.loads(await asyncio.wait_for(r.content.readline(), 5))["type"]]
        assert types == ["ADDED", "BOOKMARK", "BOOKMARK"]
    async with http.get(url.replace("&allowWatchBookmarks=true", "&timeoutSeconds=1")) as r:
        events = await raw_events(r)  # no bookmarks unless asked for
    assert [e["type"] for e in events] == ["ADDED"]


async def test_timeout_seconds_and_lightkube_reconnect(
    kube_client: AsyncClient, kube: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    url = f"{kube.url}/api/v1/nodes?watch=true&timeoutSeconds=1"
    loop = asyncio.get_running_loop()
    began = loop.time()
    async with http.get(url) as r:
        assert await raw_events(r) == []
    assert 0.8 < loop.time() - began < 5

    await kube_client.create(node("a"))
    watch = Collector(kube_client.watch(Node, resource_version="0", server_timeout=1))
    try:
        kind, obj = await watch.next()
        assert kind == "ADDED"
        seen_rv = obj.metadata.resourceVersion if obj.metadata else None

        async def reconnected() -> None:
            while sum(r.query.get("watch") == "true" for r in kube.requests) < 3:  # noqa: ASYNC110
                await asyncio.sleep(0.05)

        await asyncio.wait_for(reconnected(), 5)  # the raw watch, lightkube's, its reconnect
        again = [r.query for r in kube.requests if r.query.get("watch") == "true"][2]
        assert again["resourceVersion"] == seen_rv and again["timeoutSeconds"] == "1"
        await kube_client.create(node("b"))
        kind, obj = await watch.next()
        assert (kind, obj.metadata.name if obj.metadata else None) == ("ADDED", "b")
    finally:
        await watch.close()


async def test_close_watches(
    kube_client: AsyncClient, kube: KubeEmulator, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{kube.url}/api/v1/nodes?watch=true") as r:
        await asyncio.sleep(0.05)
        await kube.close_watches()
        assert await asyncio.wait_for(raw_events(r), 5) == []

    watch = Collector(kube_client.watch(Node))
    try:
        await kube_client.create(node("a"))
        assert (await watch.next())[0] == "ADDED"
        await kube.close_watches()
        await kube_client.create(node("b"))  # lightkube resumes from "a"'s version: no loss
        kind, obj = await watch.next()
        assert (kind, obj.metadata.name if obj.metadata else None) == ("ADDED", "b")
        with pytest.raises(TimeoutError):
            await watch.next(timeout=0.3)  # and no duplicate of "a"
    finally:
        await watch.close()


# ---------------------------------------------------------------------------- faults, direct


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

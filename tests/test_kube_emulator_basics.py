"""The Kubernetes API emulator: version, health, discovery, create/get/list, paging and
selectors, driven by the production client (lightkube) and raw HTTP."""

# ruff: noqa: F811  (pytest fixtures imported from tests.kube_fixtures and
# tests.kube_emulator_helpers are parameters here)

from __future__ import annotations

import aiohttp
import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.core_v1 import PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Pod

from tests.kube_emulator import KubeEmulator
from tests.kube_emulator_helpers import (
    http,  # noqa: F401
    node,
)
from tests.kube_fixtures import kube, kube_client  # noqa: F401


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

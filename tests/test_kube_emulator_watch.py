"""The Kubernetes API emulator's watches: replay, selectors, 410 Expired, history limit,
bookmarks, timeouts and closed streams, driven by lightkube and raw HTTP."""

# ruff: noqa: F811  (pytest fixtures imported from tests.kube_fixtures and
# tests.kube_emulator_helpers are parameters here)

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node
from lightkube.types import OnErrorAction, OnErrorResult, PatchType

from tests.kube_emulator import KubeEmulator
from tests.kube_emulator_helpers import (
    Collector,
    http,  # noqa: F401
    node,
    raw_events,
)
from tests.kube_fixtures import kube, kube_client  # noqa: F401


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

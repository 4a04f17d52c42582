"""topolvm-scheduler over HTTP: /status, /metrics and the wiring watchdog, in both modes."""

# ruff: noqa: F811  (the make_client fixture imported from tests.scheduler_http_helpers is a
# parameter here)

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.scheduler_http_helpers import (
    FakeClock,
    MakeClient,
    fixture_cache,
    load,
    make_client,  # noqa: F401
    post,
    status_of,
)


async def test_status_reports_mode_and_last_call(make_client: MakeClient) -> None:
    clock = FakeClock()
    client = await make_client(wall_clock=clock)
    resp = await client.get("/status")
    assert resp.status == 200
    doc = await resp.json()
    assert doc["status"] == "ok"
    assert doc["mode"] == "extender"
    assert doc["managedResource"] is None
    assert doc["lastRequestTime"] is None
    assert doc["wired"].startswith("unknown: no /predicate or /prioritize call since start")
    clock.now = 1_700_000_000.0
    await post(client, "predicate", load("predicate-pascal.json"))
    clock.now += 42
    doc = await (await client.get("/status")).json()
    assert doc["lastRequestTime"] == "2023-11-14T22:13:20.000+00:00"
    assert doc["lastRequestPath"] == "predicate"
    assert doc["secondsSinceLastRequest"] == 42
    assert doc["wired"] == "yes: kube-scheduler called predicate 42s ago"


async def test_managed_resource_mode_status_and_metrics(make_client: MakeClient) -> None:
    clock = FakeClock()
    client = await make_client("managed-resource: true\n", wall_clock=clock)
    doc = await (await client.get("/status")).json()
    assert doc["mode"] == "managed-resource"
    assert doc["managedResource"] == "topolvm.io/capacity"
    assert "Insufficient topolvm.io/capacity" in doc["wired"]
    metrics = await (await client.get("/metrics")).text()
    assert "topolvm_scheduler_last_request_timestamp_seconds 0.0" in metrics
    assert (
        'topolvm_scheduler_mode_info{managed_resource="topolvm.io/capacity",'
        'mode="managed-resource",node_cache_capable="false"} 1.0'
    ) in metrics
    clock.now = 1_700_000_000.0
    await post(client, "prioritize", load("predicate-pascal.json"))
    await status_of(client, "predicate", b"nope")
    metrics = await (await client.get("/metrics")).text()
    assert "topolvm_scheduler_last_request_timestamp_seconds 1.7e+09" in metrics
    assert 'topolvm_scheduler_requests_total{code="200",path="prioritize"} 1.0' in metrics
    assert 'topolvm_scheduler_requests_total{code="400",path="predicate"} 1.0' in metrics
    assert 'topolvm_scheduler_request_duration_seconds_count{path="prioritize"} 1.0' in metrics


async def test_node_cache_metrics_and_status(make_client: MakeClient) -> None:
    cache = fixture_cache()
    client = await make_client("node-cache: true\n", cache=cache)
    doc = await (await client.get("/status")).json()
    assert doc["nodeCacheCapable"] is True
    assert doc["nodeCache"] == {"synced": True, "nodes": 3, "maxAgeSeconds": 300}
    metrics = await (await client.get("/metrics")).text()
    assert "topolvm_scheduler_node_cache_nodes 3.0" in metrics
    assert "topolvm_scheduler_node_cache_synced 1.0" in metrics
    cache.mark_unsynced()
    metrics = await (await client.get("/metrics")).text()
    assert "topolvm_scheduler_node_cache_synced 0.0" in metrics


async def test_wiring_watchdog_warns_until_kube_scheduler_calls(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="topolvm.scheduler")
    client = await make_client("managed-resource: true\n", wiring_warning_after=0.05)
    await asyncio.sleep(0.2)
    warned = [r for r in caplog.records if "has not called the extender" in r.getMessage()]
    assert warned
    assert "Insufficient topolvm.io/capacity" in warned[0].__dict__["wired"]
    await post(client, "predicate", load("predicate-pascal.json"))
    await asyncio.sleep(0.1)
    caplog.clear()
    await asyncio.sleep(0.2)
    assert not [r for r in caplog.records if "has not called" in r.getMessage()]

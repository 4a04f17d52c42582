"""topolvm-scheduler over HTTP: kube-scheduler request bodies, both key spellings, both modes."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bench.scheduler_bench import make_node, make_pod
from topolvm.config.scheduler import SchedulerConfig, parse_scheduler_config
from topolvm.constants import LEGACY, NORMAL, Names
from topolvm.scheduler.nodecache import NodeCache
from topolvm.scheduler.server import make_app

DATA = Path(__file__).parent / "data" / "scheduler"
GiB = 1 << 30
Client = TestClient[web.Request, web.Application]
MakeClient = Callable[..., Awaitable[Client]]


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DATA / name).read_text())
    return doc


def args(pod: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}


def names_args(pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def node(name: str, **caps: int | str) -> dict[str, Any]:
    n = make_node(0, {f"capacity.topolvm.io/{dc}": str(v) for dc, v in caps.items()})
    n["metadata"]["name"] = name
    return n


def pod(**requests: int | str) -> dict[str, Any]:
    return make_pod({f"capacity.topolvm.io/{dc}": str(v) for dc, v in requests.items()})


@pytest.fixture
async def make_client() -> AsyncIterator[MakeClient]:
    clients: list[Client] = []

    async def factory(
        config: SchedulerConfig | str | None = None,
        *,
        cache: NodeCache | None = None,
        plugin_names: Names = NORMAL,
        wall_clock: Callable[[], float] | None = None,
        wiring_warning_after: float = 600,
    ) -> Client:
        if isinstance(config, str):
            config = parse_scheduler_config(config)
        kwargs: dict[str, Any] = {}
        if wall_clock is not None:
            kwargs["wall_clock"] = wall_clock
        app = make_app(
            config,
            cache=cache,
            plugin_names=plugin_names,
            wiring_warning_after=wiring_warning_after,
            **kwargs,
        )
        client = TestClient(TestServer(app))
        await client.start_server()
        clients.append(client)
        return client

    yield factory
    for c in clients:
        await c.close()


async def post(client: Client, verb: str, body: Any, path_prefix: str = "") -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = await client.post(f"{path_prefix}/{verb}", data=data)
    text = await resp.text()
    assert resp.status == 200, text
    assert resp.content_type == "application/json"
    return json.loads(text)


async def status_of(client: Client, verb: str, body: bytes | str) -> tuple[int, str]:
    resp = await client.post(f"/{verb}", data=body)
    return resp.status, await resp.text()


# -- filtering, full Node objects ----------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["predicate-pascal.json", "predicate-lower.json"])
async def test_predicate_real_bodies_both_key_spellings(
    make_client: MakeClient, fixture: str
) -> None:
    client = await make_client()
    body = load(fixture)
    reply = await post(client, "predicate", body)
    nodes_key = "Nodes" if "Nodes" in body else "nodes"
    # Passing nodes are returned as the complete Node objects kube-scheduler sent.
    assert reply["Nodes"]["items"] == [body[nodes_key]["items"][0]]
    assert reply["NodeNames"] is None
    assert reply["Error"] == ""
    assert set(reply["FailedNodes"]) == {"node-b", "node-c"}
    assert reply["FailedNodes"]["node-b"] == (
        f"out of VG free space for device-class ssd: requested {10 * GiB} bytes, "
        f"available {GiB} bytes"
    )
    assert reply["FailedNodes"]["node-c"].startswith("no capacity annotation")
    assert "capacity.topolvm.io/ssd" in reply["FailedNodes"]["node-c"]
    assert f"requested {10 * GiB} bytes" in reply["FailedNodes"]["node-c"]


@pytest.mark.parametrize("fixture", ["predicate-pascal.json", "predicate-lower.json"])
async def test_prioritize_real_bodies_both_key_spellings(
    make_client: MakeClient, fixture: str
) -> None:
    client = await make_client()
    reply = await post(client, "prioritize", load(fixture))
    # 240 GiB → floor(log2 240) = 7; 1 GiB → 1; no annotation → 0; input order kept.
    assert reply == [
        {"Host": "node-a", "Score": 7},
        {"Host": "node-b", "Score": 1},
        {"Host": "node-c", "Score": 0},
    ]


async def test_pod_without_topolvm_annotations_passes_untouched(make_client: MakeClient) -> None:
    client = await make_client()
    body = load("predicate-pascal.json")
    body["Pod"]["metadata"]["annotations"] = {"unrelated.example.com/x": "1"}
    reply = await post(client, "predicate", body)
    assert reply["Nodes"] == body["Nodes"]  # the NodeList, unchanged
    assert reply["FailedNodes"] == {}
    assert reply["Error"] == ""
    # Upstream answers null: no score change for any node.
    assert await post(client, "prioritize", body) is None
    del body["Pod"]["metadata"]["annotations"]
    assert (await post(client, "predicate", body))["Nodes"] == body["Nodes"]
    assert await post(client, "prioritize", body) is None


async def test_multi_device_class_pod(make_client: MakeClient) -> None:
    client = await make_client("divisors: {hdd: 4}\n")
    nodes = [
        node("both", ssd=64 * GiB, hdd=1024 * GiB),
        node("ssd-short", ssd=GiB, hdd=1024 * GiB),
        node("hdd-short", ssd=64 * GiB, hdd=GiB),
        node("no-hdd", ssd=64 * GiB),
    ]
    body = args(pod(ssd=2 * GiB, hdd=10 * GiB), nodes)
    reply = await post(client, "predicate", body)
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["both"]
    failed = reply["FailedNodes"]
    assert failed["ssd-short"] == (
        f"out of VG free space for device-class ssd: requested {2 * GiB} bytes, "
        f"available {GiB} bytes"
    )
    assert failed["hdd-short"].startswith("out of VG free space for device-class hdd")
    assert "no capacity annotation capacity.topolvm.io/hdd" in failed["no-hdd"]
    scores = {p["Host"]: p["Score"] for p in await post(client, "prioritize", body)}
    # both: min(ssd log2(64)=6, hdd log2(1024/4)=8) = 6; ssd-short: min(1, 8) = 1;
    # hdd-short: min(6, 1) = 1; no-hdd: only ssd is present → 6.
    assert scores == {"both": 6, "ssd-short": 1, "hdd-short": 1, "no-hdd": 6}


async def test_divisors_and_default_divisor(make_client: MakeClient) -> None:
    client = await make_client("default-divisor: 2\ndivisors: {fast: 0.5}\n")
    nodes = [node("n", ssd=128 * GiB, fast=128 * GiB)]
    ssd = await post(client, "prioritize", args(pod(ssd=1), nodes))
    fast = await post(client, "prioritize", args(pod(fast=1), nodes))
    assert (ssd[0]["Score"], fast[0]["Score"]) == (6, 8)


async def test_bad_and_absurd_node_annotations_fail_the_node_with_a_reason(
    make_client: MakeClient,
) -> None:
    client = await make_client()
    nodes = [
        node("words", ssd="lots"),
        node("negative", ssd="-5"),
        node("too-big", ssd=str(1 << 64)),
        node("max", ssd=str((1 << 64) - 1)),
        node("zero", ssd=0),
    ]
    body = args(pod(ssd=GiB), nodes)
    reply = await post(client, "predicate", body)
    failed = reply["FailedNodes"]
    assert failed["words"].startswith("bad capacity annotation: lots")
    assert failed["negative"].startswith("bad capacity annotation: -5")
    assert failed["too-big"].startswith(f"bad capacity annotation: {1 << 64}")
    assert failed["zero"].endswith(f"requested {GiB} bytes, available 0 bytes")
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["max"]
    scores = {p["Host"]: p["Score"] for p in await post(client, "prioritize", body)}
    assert scores == {"words": 0, "negative": 0, "too-big": 0, "max": 10, "zero": 0}


async def test_zero_request_passes_nodes_with_any_valid_annotation(
    make_client: MakeClient,
) -> None:
    client = await make_client()
    body = args(pod(ssd=0), [node("a", ssd=0), node("b")])
    reply = await post(client, "predicate", body)
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["a"]
    assert list(reply["FailedNodes"]) == ["b"]


async def test_no_nodes_pass(make_client: MakeClient) -> None:
    client = await make_client()
    reply = await post(client, "predicate", args(pod(ssd=GiB), [node("a", ssd=1)]))
    assert reply["Nodes"] == {"metadata": {}, "items": []}
    assert list(reply["FailedNodes"]) == ["a"]


async def test_legacy_names(make_client: MakeClient) -> None:
    client = await make_client(plugin_names=LEGACY)
    n = make_node(0, {"capacity.topolvm.cybozu.com/ssd": str(8 * GiB)})
    p = make_pod({"capacity.topolvm.cybozu.com/ssd": str(GiB)})
    reply = await post(client, "predicate", args(p, [n]))
    assert len(reply["Nodes"]["items"]) == 1
    assert (await post(client, "prioritize", args(p, [n])))[0]["Score"] == 3
    # The normal prefix means nothing in legacy mode.
    assert await post(client, "prioritize", args(pod(ssd=GiB), [n])) is None


# -- malformed requests: 4xx with a reason, never a 500 -----------------------------------------


def _body(**over: Any) -> bytes:
    doc = args(pod(ssd=GiB), [node("a", ssd=8 * GiB)])
    doc.update(over)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"Nodes": {"items": []}}', "missing Pod"),
        (b'{"Pod": null, "Nodes": {"items": []}}', "missing Pod"),
        (json.dumps({"Pod": pod(ssd=1)}).encode(), "missing Nodes and NodeNames"),
        (json.dumps({"Pod": pod(ssd=1), "Nodes": None, "NodeNames": None}).encode(),
         "missing Nodes and NodeNames"),
        (_body(Pod="a pod"), "Pod"),
        (_body(Nodes={"items": "node-a"}), "Nodes"),
        (_body(Nodes={"items": [{"metadata": {}}]}), "items[0]: a Node without metadata.name"),
        (_body(Nodes={"items": [{"metadata": {"name": 5}}]}), "metadata.name"),
        (_body(Nodes=[1]), "Nodes"),
        (_body(pod=pod(ssd=1)), "both 'Pod' and 'pod'"),
        (_body(Pod=pod(ssd="10Gi")),
         "annotation capacity.topolvm.io/ssd: '10Gi' is not an integer number of bytes"),
        (_body(Pod=pod(ssd="-1")), "'-1' is negative"),
        (_body(Pod=pod(ssd=str(1 << 63))), "larger than the int64 maximum"),
        (_body(Pod=pod(ssd="1e9")), "not an integer"),
        (_body(Pod=pod(ssd=" 5")), "not an integer"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("verb", ["predicate", "prioritize"])
async def test_malformed_requests_get_400_with_reason(
    make_client: MakeClient, verb: str, body: bytes, reason: str
) -> None:
    client = await make_client()
    status, text = await status_of(client, verb, body)
    assert status == 400, text
    assert text.startswith("bad request: ")
    assert reason in text


async def test_plus_sign_in_pod_annotation_is_accepted_like_go_parseint(
    make_client: MakeClient,
) -> None:
    client = await make_client()
    reply = await post(client, "predicate", args(pod(ssd=f"+{GiB}"), [node("a", ssd=GiB)]))
    assert reply["FailedNodes"] == {}


async def test_body_over_the_limit_is_413(make_client: MakeClient) -> None:
    client = await make_client("max-request-bytes: 4096\n")
    status, text = await status_of(client, "predicate", b"{" + b" " * 5000 + b"}")
    assert status == 413, text


async def test_get_on_a_verb_is_405_with_a_clear_reason(make_client: MakeClient) -> None:
    client = await make_client()
    for verb in ("predicate", "prioritize"):
        resp = await client.get(f"/{verb}")
        assert resp.status == 405
        assert resp.headers["Allow"] == "POST"
        assert "POST" in await resp.text()


async def test_unknown_path_is_404(make_client: MakeClient) -> None:
    client = await make_client()
    resp = await client.post("/filter", data=b"{}")
    assert resp.status == 404
    assert await resp.text() == "not found\n"


async def test_path_prefix(make_client: MakeClient) -> None:
    client = await make_client("path-prefix: /topolvm\n")
    body = load("predicate-pascal.json")
    reply = await post(client, "predicate", body, path_prefix="/topolvm")
    assert len(reply["Nodes"]["items"]) == 1
    assert (await client.post("/predicate", data=json.dumps(body))).status == 404


async def test_node_names_without_node_cache_is_400(make_client: MakeClient) -> None:
    client = await make_client()
    status, text = await status_of(
        client, "predicate", (DATA / "nodenames-pascal.json").read_text()
    )
    assert status == 400
    assert "--node-cache" in text and "nodeCacheCapable" in text


# -- nodeCacheCapable mode ------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fixture_cache(clock: FakeClock | None = None) -> NodeCache:
    cache = NodeCache(NORMAL, max_age=300, clock=clock or FakeClock())
    cache.replace(load("predicate-pascal.json")["Nodes"]["items"])
    return cache


@pytest.mark.parametrize("fixture", ["nodenames-pascal.json", "nodenames-lower.json"])
async def test_node_cache_mode_filters_by_name(make_client: MakeClient, fixture: str) -> None:
    client = await make_client("node-cache: true\n", cache=fixture_cache())
    body = load(fixture)
    names_key = "NodeNames" if "NodeNames" in body else "nodenames"
    body[names_key].append("node-new")
    reply = await post(client, "predicate", body)
    assert reply["NodeNames"] == ["node-a"]
    assert reply["Nodes"] is None
    assert reply["Error"] == ""
    failed = reply["FailedNodes"]
    assert failed["node-b"] == (
        f"out of VG free space for device-class ssd: requested {10 * GiB} bytes, "
        f"available {GiB} bytes"
    )
    assert failed["node-c"].startswith("no capacity annotation")
    assert failed["node-new"] == (
        f"unknown capacity for device-class ssd (requested {10 * GiB} bytes), available unknown: "
        "node node-new is not in the scheduler extender's node cache"
    )
    scores = await post(client, "prioritize", body)
    assert scores == [
        {"Host": "node-a", "Score": 7},
        {"Host": "node-b", "Score": 1},
        {"Host": "node-c", "Score": 0},
        {"Host": "node-new", "Score": 0},
    ]


async def test_node_cache_not_synced_is_unknown_capacity_not_zero(make_client: MakeClient) -> None:
    cache = NodeCache(NORMAL)
    client = await make_client("node-cache: true\n", cache=cache)
    body = load("nodenames-pascal.json")
    reply = await post(client, "predicate", body)
    assert reply["NodeNames"] == []
    for reason in reply["FailedNodes"].values():
        assert reason.startswith("unknown capacity for device-class ssd")
        assert "has not synced with the API server yet" in reason
        assert "out of VG free space" not in reason
    assert [p["Score"] for p in await post(client, "prioritize", body)] == [0, 0, 0]
    # Pods without TopoLVM annotations never need the cache.
    del body["Pod"]["metadata"]["annotations"]
    reply = await post(client, "predicate", body)
    assert reply["NodeNames"] == ["node-a", "node-b", "node-c"]
    assert reply["FailedNodes"] == {}
    assert await post(client, "prioritize", body) is None


async def test_node_cache_stale_entries_and_updates(make_client: MakeClient) -> None:
    clock = FakeClock()
    cache = fixture_cache(clock)
    client = await make_client("node-cache: true\n", cache=cache)
    body = load("nodenames-pascal.json")
    clock.now += 200
    fresh = load("predicate-pascal.json")["Nodes"]["items"][1]  # node-b, now with more space
    fresh["metadata"]["annotations"]["capacity.topolvm.io/ssd"] = str(64 * GiB)
    cache.upsert(fresh)
    clock.now += 200  # node-a and node-c: 400 s old, limit 300 s; node-b: 200 s
    reply = await post(client, "predicate", body)
    assert reply["NodeNames"] == ["node-b"]
    assert (
        "the node cache entry of node-a is stale (last updated 400s ago, limit 300s)"
        in (reply["FailedNodes"]["node-a"])
    )
    assert reply["FailedNodes"]["node-a"].startswith("unknown capacity")
    scores = await post(client, "prioritize", body)
    assert scores == [
        {"Host": "node-a", "Score": 0},
        {"Host": "node-b", "Score": 6},
        {"Host": "node-c", "Score": 0},
    ]
    cache.delete("node-b")
    reply = await post(client, "predicate", body)
    assert "not in the scheduler extender's node cache" in reply["FailedNodes"]["node-b"]
    cache.mark_unsynced("watch failed: 410 Gone")
    reply = await post(client, "predicate", body)
    assert (
        "lost its sync with the API server: watch failed: 410 Gone"
        in (reply["FailedNodes"]["node-c"])
    )


async def test_node_cache_multi_device_class(make_client: MakeClient) -> None:
    cache = NodeCache(NORMAL)
    cache.replace(
        [
            node("both", ssd=64 * GiB, hdd=1024 * GiB),
            node("ssd-short", ssd=GiB, hdd=1024 * GiB),
            node("no-hdd", ssd=64 * GiB),
            node("bad-hdd", ssd=64 * GiB, hdd="x"),
        ]
    )
    client = await make_client("node-cache: true\ndivisors: {hdd: 4}\n", cache=cache)
    body = names_args(pod(ssd=2 * GiB, hdd=10 * GiB), ["both", "ssd-short", "no-hdd", "bad-hdd"])
    reply = await post(client, "predicate", body)
    assert reply["NodeNames"] == ["both"]
    assert reply["FailedNodes"]["ssd-short"].startswith("out of VG free space for device-class ssd")
    assert reply["FailedNodes"]["no-hdd"].startswith("no capacity annotation")
    assert reply["FailedNodes"]["bad-hdd"].startswith("bad capacity annotation: x")
    scores = {p["Host"]: p["Score"] for p in await post(client, "prioritize", body)}
    assert scores == {"both": 6, "ssd-short": 1, "no-hdd": 6, "bad-hdd": 0}


async def test_node_cache_mode_still_accepts_full_node_objects(make_client: MakeClient) -> None:
    client = await make_client("node-cache: true\n", cache=NodeCache(NORMAL))
    reply = await post(client, "predicate", load("predicate-lower.json"))
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["node-a"]
    assert reply["NodeNames"] is None


# -- /status, /metrics, wiring ------------------------------------------------------------------


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


async def test_reply_keeps_node_bytes_verbatim(make_client: MakeClient) -> None:
    client = await make_client()
    n = node("a", ssd=8 * GiB)
    n["status"]["weird"] = {"unicode": "é☃", "float": 1.5e300, "nested": [[], {}]}
    raw_node = json.dumps(n, ensure_ascii=False, separators=(",", ":"))
    body = '{"Pod":' + json.dumps(pod(ssd=1)) + ',"Nodes":{"items":[' + raw_node + "]}}"
    resp = await client.post("/predicate", data=body.encode())
    text = await resp.text()
    assert raw_node in text
    assert json.loads(text)["Nodes"]["items"][0] == copy.deepcopy(n)

"""topolvm-scheduler over HTTP in nodeCacheCapable mode: node names only, capacities from the
node cache, unknown, stale and unsynced entries."""

# ruff: noqa: F811  (the make_client fixture imported from tests.scheduler_http_helpers is a
# parameter here)

from __future__ import annotations

import pytest

from tests.scheduler_http_helpers import (
    FakeClock,
    GiB,
    MakeClient,
    fixture_cache,
    load,
    make_client,  # noqa: F401
    names_args,
    node,
    pod,
    post,
)
from topolvm.constants import NORMAL
from topolvm.scheduler.nodecache import NodeCache


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

"""topolvm-scheduler over HTTP: predicate and prioritize on kube-scheduler request bodies
with full Node objects, both key spellings, divisors, multi-device-class pods, legacy names."""

# ruff: noqa: F811  (the make_client fixture imported from tests.scheduler_http_helpers is a
# parameter here)

from __future__ import annotations

import copy
import json

import pytest

from bench.scheduler_bench import make_node, make_pod
from tests.scheduler_http_helpers import GiB, MakeClient, args, load, make_client, node, pod, post  # noqa: F401
from topolvm.constants import LEGACY


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

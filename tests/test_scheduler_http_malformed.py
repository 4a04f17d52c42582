"""topolvm-scheduler over HTTP: malformed requests get a 4xx with a reason, never a 500;
body limit, methods, unknown paths and the path prefix."""

# ruff: noqa: F811  (the make_client fixture imported from tests.scheduler_http_helpers is a
# parameter here)

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.scheduler_http_helpers import (
    DATA,
    GiB,
    MakeClient,
    args,
    load,
    make_client,  # noqa: F401
    node,
    pod,
    post,
    status_of,
)


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

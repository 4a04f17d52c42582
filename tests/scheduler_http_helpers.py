"""Helpers for the topolvm-scheduler HTTP tests (tests/test_scheduler_http_*.py): request bodies
as kube-scheduler sends them, and a client for an extender app made with make_app()."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bench.scheduler_bench import make_node, make_pod
from topolvm.config.scheduler import SchedulerConfig, parse_scheduler_config
from topolvm.constants import NORMAL, Names
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


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fixture_cache(clock: FakeClock | None = None) -> NodeCache:
    cache = NodeCache(NORMAL, max_age=300, clock=clock or FakeClock())
    cache.replace(load("predicate-pascal.json")["Nodes"]["items"])
    return cache

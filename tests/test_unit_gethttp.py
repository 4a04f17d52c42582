"""The daemons' small HTTP server for probes and /metrics (src/topolvm/gethttp.py), spoken to
over real sockets: kept-alive connections, wrong methods and paths, bad requests, a route that
fails, and a stop that does not wait for idle clients."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter

from tests.helpers import free_port
from topolvm import daemon
from topolvm.daemon import Parts
from topolvm.gethttp import Answer, GetServer


def broken() -> Answer:
    raise RuntimeError("the check itself failed")


async def test_answers_gets_on_one_kept_alive_connection_and_names_what_is_served() -> None:
    parts, port = Parts("toy"), free_port()
    registry = CollectorRegistry()
    Counter("toy_calls", "calls", registry=registry).inc(3)
    await daemon.serve_metrics(parts, registry, ("127.0.0.1", port))
    try:
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector) as http:
            base = f"http://127.0.0.1:{port}"
            seen = []
            for path in ("/metrics", "/metrics?x=1", "/nothing"):
                async with http.get(base + path) as r:
                    seen.append((r.status, r.headers["Content-Type"], await r.text()))
            async with http.post(base + "/metrics", data=b"x" * 1000) as r:
                seen.append((r.status, r.headers["Allow"], await r.text()))
    finally:
        await parts.stop()
    assert seen[0][0] == 200 and "toy_calls_total 3.0" in seen[0][2]
    assert seen[0][1].startswith("text/plain; version=")  # Prometheus' text format
    assert seen[1][0] == 200
    assert seen[2][0] == 404 and "served: /metrics" in seen[2][2]
    assert seen[3][:2] == (405, "GET, HEAD")


async def raw(port: int, request: bytes) -> bytes:
    """Send ``request`` as is and read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    try:
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


async def test_head_close_http10_pipelining_and_oversize_heads() -> None:
    server, port = GetServer({"/healthz": lambda: Answer(200, b"ok")}, "health"), free_port()
    await server.listen("127.0.0.1", port)
    try:
        head = await raw(port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        old = await raw(port, b"GET /healthz HTTP/1.0\r\n\r\n")
        two = await raw(
            port,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        big = await raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000)
    finally:
        await server.close()
    assert head.startswith(b"HTTP/1.1 200 ") and b"content-length: 2\r\n" in head.lower()
    assert head.endswith(b"\r\n\r\n")  # headers only
    assert old.startswith(b"HTTP/1.1 200 ") and old.endswith(b"ok")
    assert two.count(b"HTTP/1.1 200 ") == 1 and two.count(b"HTTP/1.1 404 ") == 1
    assert big.startswith(b"HTTP/1.1 431 ")


async def test_a_bad_request_gets_400_and_a_failing_route_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, port = GetServer({"/broken": broken}, "health"), free_port()
    await server.listen("127.0.0.1", port)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        bad = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        with caplog.at_level(logging.ERROR):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /broken HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            failed = await asyncio.wait_for(reader.read(), 5)
            writer.close()
    finally:
        await server.close()
    assert bad.startswith(b"HTTP/1.1 400 ")
    assert failed.startswith(b"HTTP/1.1 500 ") and b"see the daemon's log" in failed
    assert "health: answering GET /broken failed" in caplog.text
    assert "the check itself failed" in caplog.text


async def test_stop_ends_idle_kept_alive_connections_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, port = GetServer({"/healthz": lambda: Answer(200, b"ok")}, "health"), free_port()
    await server.listen("127.0.0.1", port)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"ok"), 5)
    assert head.startswith(b"HTTP/1.1 200 ")
    with caplog.at_level(logging.WARNING):
        await asyncio.wait_for(server.close(), 2)  # the client keeps its connection open
        assert await asyncio.wait_for(reader.read(), 2) == b""  # and sees it closed
        writer.close()
        await asyncio.sleep(0.1)  # the stream's callbacks run
    assert caplog.records == []  # asyncio says nothing about the cancelled connection

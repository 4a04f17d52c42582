"""A small HTTP/1.1 server for GET endpoints whose answers are computed in memory: the health
probes and ``/metrics`` of every daemon.

h11 does the protocol (it is already here for the Kubernetes client); asyncio streams do the
I/O. The per-node daemons (topolvm-node, lvmd) serve nothing else over HTTP, and aiohttp would
cost each of them about 15 MB of memory on every node (docs/topolvm-node.md, "Footprint").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import h11

log = logging.getLogger(__name__)

MAX_REQUEST_HEAD = 16 * 1024  # a probe's or Prometheus' request head is well under 1 KiB
IDLE_TIMEOUT = 120.0  # seconds a kept-alive connection may wait for its next request (Prometheus
# scrapes every 60 s or less: longer, so that the server rarely closes one as it is reused)
WRITE_TIMEOUT = 30.0  # seconds a client that stopped reading may hold an answer
TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str = TEXT


Route = Callable[[], Answer]
"""Computes the answer to a GET of its path; it runs on the event loop, so it must be quick."""


class GetServer:
    """Serves ``routes`` (path -> answer) until :meth:`close`."""

    def __init__(self, routes: Mapping[str, Route], what: str) -> None:
        self.routes, self.what = dict(routes), what
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._closing = False

    async def listen(self, host: str, port: int) -> None:
        """Start listening; OSError if the address cannot be bound."""
        self._server = await asyncio.start_server(self._connection, host, port)

    async def close(self) -> None:
        """Stop listening and end the open connections (kept-alive ones would wait)."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:  # accepted just before close(): its task starts only now
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._exchange_and_close(reader, writer)
        except asyncio.CancelledError:  # the server is closing: drop the connection at once
            writer.transport.abort()
        finally:
            self._connections.discard(task)

    async def _exchange_and_close(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            await self._exchange(reader, writer)
        except (ConnectionError, TimeoutError):
            pass  # the client went away, stayed silent or stopped reading: nothing to answer
        except h11.ProtocolError as e:
            log.info(f"{self.what}: bad HTTP request", extra={"error": str(e)})
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), WRITE_TIMEOUT)
        except (ConnectionError, TimeoutError):
            writer.transport.abort()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD)
        request: h11.Request | None = None
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as e:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    status = e.error_status_hint
                    answer = Answer(status, f"bad request: {e}\n".encode())
                    await _send(writer, conn, answer, head=False)
                raise
            if event is h11.NEED_DATA:
                data = await asyncio.wait_for(reader.read(65536), IDLE_TIMEOUT)
                conn.receive_data(data)  # b"": the client closed its side
            elif isinstance(event, h11.Request):
                request = event  # answered at its end, once any body is read and dropped
            elif isinstance(event, h11.EndOfMessage) and request is not None:
                await _send(writer, conn, self._answer(request), head=request.method == b"HEAD")
                request = None
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return  # Connection: close, or HTTP/1.0
                conn.start_next_cycle()
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return

    def _answer(self, request: h11.Request) -> Answer:
        if request.method not in (b"GET", b"HEAD"):
            return Answer(405, b"only GET is served here\n")
        path = request.target.split(b"?", 1)[0].decode("ascii", "replace")
        route = self.routes.get(path)
        if route is None:
            return Answer(404, f"not found: {path}; served: {', '.join(self.routes)}\n".encode())
        try:
            return route()
        except Exception:
            log.exception(f"{self.what}: answering GET {path} failed")
            return Answer(500, b"internal error; see the daemon's log\n")


async def _send(
    writer: asyncio.StreamWriter, conn: h11.Connection, answer: Answer, *, head: bool
) -> None:
    """Write ``answer`` (its headers only for a HEAD request)."""
    headers = [("Content-Type", answer.content_type), ("Content-Length", str(len(answer.body)))]
    if answer.status == 405:
        headers.append(("Allow", "GET, HEAD"))
    writer.write(conn.send(h11.Response(status_code=answer.status, headers=headers)) or b"")
    if not head:
        writer.write(conn.send(h11.Data(data=answer.body)) or b"")
    writer.write(conn.send(h11.EndOfMessage()) or b"")
    await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)

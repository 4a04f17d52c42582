"""A fault-injecting HTTPS reverse proxy in front of the test bed's kube-apiserver.

Point a component's kubeconfig at :attr:`FaultProxy.url` (or, from a UML guest, at
:meth:`FaultProxy.url_for`) and it talks to the real API server, except that a seeded
:class:`Schedule` answers some requests itself, as an API server under trouble does:

- ``409 Conflict`` for a write with a precondition (a PUT, a PATCH carrying a resourceVersion),
  never forwarded: the object "changed since it was read";
- ``429 Too Many Requests`` with ``Retry-After: 1`` (API Priority and Fairness), never forwarded;
- ``500`` before forwarding, or for a write after forwarding it (committed, but the answer is
  lost: the client cannot tell whether its write happened);
- on watches, which the proxy streams event by event: every watch ends after a drawn time
  (0 to 6 s), with an event of type ``ERROR`` carrying a Status of code 410 (``Expired``, what
  the API server sends when the watch's resourceVersion is too old), with the connection cut
  mid-stream (no end of the chunked body), or cleanly (what the API server does when a watch
  times out; not a fault, counted as ``watch ended``).

The proxy terminates TLS with a serving certificate of the test bed's CA and does not ask for a
client certificate; upstream it presents the admin certificate (``system:masters``). So identity
is flattened: whoever connects acts as admin, and RBAC and the Node authorizer are not what a
component behind the proxy is checked against. ``Authorization`` headers are dropped for the
same reason, and ``Accept-Encoding``, so that watch streams are plain lines.

The decision for the k-th request is drawn from ``random.Random(f"{seed}:{k}")``: a run with the
same seed makes the same decisions in the same order, though which request is the k-th depends
on the components' timing. The first write with a precondition is refused with a 409 and the
first write's answer is lost if their draws did not do it already, so that each kind of fault
happens in every run. It runs on its own thread and event loop, so a test that blocks its
own loop (kubectl, a guest command) does not stall the components behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import ssl
import threading
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from devtools.testbed.controlplane import GUEST_SUBNETS, ControlPlane, host_address

CONFLICT = "409 Conflict"
THROTTLED = "429 Too Many Requests"
ERROR = "500 before forwarding"
LOST = "500 after forwarding a write"
GONE = "watch 410 Gone"
DROPPED = "watch dropped mid-stream"
ENDED = "watch ended"  # cleanly: not a fault
FAULTS = (CONFLICT, THROTTLED, ERROR, LOST, GONE, DROPPED)
_HOP = {"host", "connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade",
        "transfer-encoding", "content-length", "accept-encoding", "authorization"}  # fmt: skip


@dataclass(frozen=True)
class Schedule:
    """How often each fault is drawn: fractions of the requests it can apply to."""

    seed: str
    conflict: float = 0.4  # of writes with a precondition
    throttle: float = 0.08  # of every request
    error: float = 0.08  # of every request
    lost: float = 0.08  # of writes (POST, PUT, PATCH, DELETE)
    gone: float = 0.35  # of watches: end with a 410 ERROR event
    drop: float = 0.35  # of watches: the connection cut (the rest end cleanly)
    watch_life: float = 6.0  # longest a watch lasts before its end is due

    def request(
        self, k: int, method: str, watch: bool, precondition: bool, unseen: Collection[str] = ()
    ) -> str | None:
        """The fault for the k-th request, if any, decided before it is forwarded (or, for
        :data:`LOST`, after). A request that draws none gets :data:`CONFLICT` or :data:`LOST`
        if it is the first that could have one (in ``unseen``, the faults not injected yet):
        the rarer kinds happen in every run, however few writes it makes."""
        rng = random.Random(f"{self.seed}:{k}")
        draw = rng.random()
        write = method in ("POST", "PUT", "PATCH", "DELETE") and not watch
        kinds = ((CONFLICT, self.conflict, precondition), (THROTTLED, self.throttle, True),
                 (ERROR, self.error, True), (LOST, self.lost, write))  # fmt: skip
        for fault, p, applies in kinds:
            if not applies:
                continue
            if draw < p:
                return fault
            draw -= p
        if precondition and CONFLICT in unseen:
            return CONFLICT
        return LOST if write and LOST in unseen else None

    def watch(self, k: int) -> tuple[float, str]:
        """When (seconds into the stream) and how the k-th request's watch ends."""
        rng = random.Random(f"{self.seed}:{k}:watch")
        when = 0.0 if rng.random() < 0.2 else rng.uniform(0.2, self.watch_life)
        draw = rng.random()
        how = GONE if draw < self.gone else DROPPED if draw < self.gone + self.drop else ENDED
        return when, how


def _status(code: int, reason: str, message: str) -> dict[str, object]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f"{message} (fault proxy)", "reason": reason, "code": code}  # fmt: skip


class FaultProxy:
    """Start with :meth:`start` (it listens once that returns), stop with :meth:`stop`;
    :attr:`counts` holds how many of each fault (and clean watch end) it injected."""

    def __init__(
        self, cp: ControlPlane, folder: Path, schedule: Schedule, host: str = "0.0.0.0"
    ) -> None:
        self.cp, self.schedule, self.host = cp, schedule, host
        hosts = ("127.0.0.1", "localhost", *(host_address(i) for i in range(1, GUEST_SUBNETS + 1)))
        folder.mkdir(parents=True, exist_ok=True)
        self._serving = cp.pki.issue("faultproxy", "faultproxy", hosts=hosts, server=True,
                                     folder=folder)  # fmt: skip
        self.counts: Counter[str] = Counter()
        self.methods: Counter[str] = Counter()  # requests by method ("GET watch" apart)
        self.requests = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._session: aiohttp.ClientSession | None = None
        self._handlers: set[asyncio.Task[object]] = set()  # requests being answered

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def url_for(self, index: int) -> str:
        """The proxy's URL from UML guest ``index`` (the host's end of its TAP link)."""
        return f"https://{host_address(index)}:{self.port}"

    def kubeconfig(self, path: Path, server: str | None = None) -> Path:
        """A kubeconfig for the proxy (the admin certificate, which the proxy never checks)."""
        return self.cp.write_kubeconfig(path, server or self.url)

    def summary(self) -> str:
        faults = ", ".join(f"{k} {self.counts[k]}" for k in FAULTS)
        methods = ", ".join(f"{m} {n}" for m, n in sorted(self.methods.items()))
        return (f"{faults}; {self.counts[ENDED]} watches ended cleanly; "
                f"{self.requests} requests ({methods})")  # fmt: skip

    # --- running ------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(target=self._run, args=(sock,), name="faultproxy",
                                        daemon=True)  # fmt: skip
        self._thread.start()
        self._ready.wait(30)
        if self._failed is not None or not self._ready.is_set():
            raise RuntimeError(f"fault proxy did not start: {self._failed}")
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(30)
        self._thread = None

    def _run(self, sock: socket.socket) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            runner = loop.run_until_complete(self._serve(sock))
        except BaseException as exc:
            self._failed = exc
            sock.close()
            if self._session is not None:
                loop.run_until_complete(self._session.close())
            loop.close()
            self._ready.set()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._close(runner))
            loop.close()

    async def _serve(self, sock: socket.socket) -> web.AppRunner:
        upstream = ssl.create_default_context(cafile=str(self.cp.pki.ca_file))
        upstream.load_cert_chain(*(str(p) for p in self.cp.admin_cert))
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=upstream, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
        )
        serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        serving.load_cert_chain(*(str(p) for p in self._serving))
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1)
        await runner.setup()
        await web.SockSite(runner, sock, ssl_context=serving).start()
        return runner

    async def _close(self, runner: web.AppRunner) -> None:
        # end the requests in flight (watches wait for the API server) and cut every client's
        # connection (their TLS shutdown would wait for the peer)
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        for conn in runner.server.connections if runner.server is not None else []:
            if conn.transport is not None:
                conn.transport.abort()
        await asyncio.sleep(0.2)  # the aborted sockets are closed by the loop's next rounds
        with contextlib.suppress(Exception):
            await runner.cleanup()
        if self._session is not None:
            await self._session.close()
        await asyncio.sleep(0.2)

    # --- one request --------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            return await self._proxy(request)
        finally:
            self._handlers.discard(task)

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        k = self.requests
        self.requests += 1
        watch = request.query.get("watch", "") in ("true", "1")
        body = await request.read()
        precondition = request.method == "PUT" or (
            request.method == "PATCH" and b'"resourceVersion"' in body
        )
        self.methods[request.method + (" watch" if watch else "")] += 1
        unseen = [f for f in (CONFLICT, LOST) if not self.counts[f]]
        fault = self.schedule.request(k, request.method, watch, precondition, unseen)
        if fault in (CONFLICT, THROTTLED, ERROR):
            return self._refuse(fault, request)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers["Accept-Encoding"] = "identity"
        assert self._session is not None
        async with self._session.request(
            request.method, self.cp.server + request.path_qs, headers=headers,
            data=body if body else None, allow_redirects=False,
        ) as up:  # fmt: skip
            if fault == LOST:
                await up.read()
                return self._refuse(fault, request)
            out = web.StreamResponse(status=up.status, reason=up.reason)
            for key, value in up.headers.items():
                if key.lower() not in _HOP:
                    out.headers.add(key, value)
            await out.prepare(request)
            try:  # the client may go away meanwhile (a watch it closed, say)
                if watch and up.status == 200:
                    await self._stream_watch(k, request, out, up)
                else:
                    async for chunk in up.content.iter_any():
                        await out.write(chunk)
                await out.write_eof()
            except (ConnectionError, aiohttp.ClientError, RuntimeError):
                pass
            return out

    def _refuse(self, fault: str, request: web.Request) -> web.Response:
        self.counts[fault] += 1
        headers = {"X-Fault-Proxy": fault}
        if fault == CONFLICT:
            what = request.path.rstrip("/").rsplit("/", 1)[-1]
            status = _status(409, "Conflict", f'Operation cannot be fulfilled on "{what}": the '
                             "object has been modified; please apply your changes to the "
                             "latest version and try again")  # fmt: skip
        elif fault == THROTTLED:
            status = _status(429, "TooManyRequests", "Too many requests, please try again later")
            status["details"] = {"retryAfterSeconds": 1}
            headers["Retry-After"] = "1"
        else:
            status = _status(500, "InternalError", "Internal error occurred: injected")
        # exactly the API server's Content-Type (lightkube types errors only with it)
        headers["Content-Type"] = "application/json"
        return web.Response(body=json.dumps(status).encode(), status=int(str(status["code"])),
                            headers=headers)  # fmt: skip

    async def _stream_watch(
        self, k: int, request: web.Request, out: web.StreamResponse, up: aiohttp.ClientResponse
    ) -> None:
        """Forward whole event lines until the drawn end, then end as drawn."""
        when, how = self.schedule.watch(k)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + when
        pending = b""
        chunks = up.content.iter_any().__aiter__()
        while (left := deadline - loop.time()) > 0:
            try:
                chunk = await asyncio.wait_for(chunks.__anext__(), left)
            except TimeoutError:
                break
            except StopAsyncIteration:
                return  # the API server ended it first
            pending += chunk
            lines, _, pending = pending.rpartition(b"\n")
            if lines:
                await out.write(lines + b"\n")
        self.counts[how] += 1
        if how == GONE:
            status = _status(410, "Expired", "too old resource version")
            event = {"type": "ERROR", "object": status}
            await out.write(json.dumps(event).encode() + b"\n")
        elif how == DROPPED and request.transport is not None:
            request.transport.abort()

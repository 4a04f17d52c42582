"""What the transfer port's tests share: a crowd of idle, garbage and churning connections,
the API emulator with TokenReview, and a node's port whose HELLOs the real TokenReviewer
authorises (tests/test_transfer_port_limits.py and tests/test_transfer_port_reviews.py, on
loopback; tests/test_cluster_transfer_faults.py, against a UML node's port and the real API
server).

The emulator does no authentication of its own; this subclass answers TokenRequest
(``POST .../serviceaccounts/<name>/token``) and
``POST /apis/authentication.k8s.io/v1/tokenreviews`` as kube-apiserver does for ServiceAccount
tokens: authenticated only for a token it issued (:meth:`TokenReviewEmulator.issue`) whose
audiences meet the review's, with those audiences, the account and, for a token bound to a pod
or Node, the node-name extra (none for a token bound to nothing). ``delay`` holds each answer,
so that reviews in flight can be counted; ``hang`` holds the TokenRequests for the audiences
it names.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import random
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from lightkube import AsyncClient

from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import client_for
from topolvm.transfer import messages
from topolvm.transfer.auth import NODE_NAME_KEY, TokenReviewer, audience
from topolvm.transfer.client import Endpoint, receive
from topolvm.transfer.conn import Conn
from topolvm.transfer.door import PortLimits
from topolvm.transfer.errors import Refused
from topolvm.transfer.jobs import Job, Limits, VolumeInfo
from topolvm.transfer.metrics import TransferMetrics
from topolvm.transfer.server import TransferServer
from topolvm.transfer.tls import client_context

REVIEWS_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCOUNT = "system:serviceaccount:topolvm-system:topolvm-node"
MiB = 1 << 20
SIZE = 16 * MiB
UID = "0b4f5c7e-1111-4222-8333-123456789abc"
NODE = "node-a"  # the sender
RECEIVER = "node-b"


def jwt(claims: dict[str, Any]) -> str:
    def part(obj: Any) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part(claims)}.{secrets.token_urlsafe(16)}"


class TokenReviewEmulator(KubeEmulator):
    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay
        self.issued: dict[str, dict[str, Any]] = {}
        self.reviewed: list[str] = []  # tokens, in the order their reviews arrived
        self.in_flight = 0
        self.most_in_flight = 0
        self.token_requests: list[dict[str, Any]] = []
        self.forbid_tokens = False
        self.max_seconds = 3600
        self.pod_nodes: dict[str, str] = {}  # pod name -> its node, for pod-bound tokens
        self.hang: set[str] = set()  # audiences whose TokenRequests are never answered

    def issue(self, audience: str, node: str, account: str = ACCOUNT) -> str:
        """A token the emulated API server authenticates: ``account``'s, bound to a pod on
        ``node``, for ``audience``."""
        token = jwt({"aud": [audience], "sub": account, "node": node})
        self.issued[token] = {"aud": [audience], "sub": account, "node": node}
        return token

    async def _route(
        self, request: web.Request, query: dict[str, str], ctype: str, body: Any
    ) -> web.StreamResponse:
        parts = request.path.strip("/").split("/")
        if (
            request.method == "POST"
            and parts[:3] == ["api", "v1", "namespaces"]
            and (len(parts) == 7 and parts[4] == "serviceaccounts" and parts[6] == "token")
        ):
            audiences = set(((body or {}).get("spec") or {}).get("audiences") or [])
            if audiences & self.hang:
                await asyncio.sleep(3600)
            return self._token_request(parts[3], parts[5], body or {})
        if request.method != "POST" or request.path.rstrip("/") != REVIEWS_PATH:
            return await super()._route(request, query, ctype, body)
        spec = (body or {}).get("spec") or {}
        token = str(spec.get("token") or "")
        self.reviewed.append(token)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        return web.json_response({**body, "status": self._status(token, spec)}, status=201)

    def _token_request(self, namespace: str, name: str, body: dict[str, Any]) -> web.Response:
        """TokenRequest as kube-apiserver answers it (a 403 while ``forbid_tokens``): a token
        for the audiences asked, bound to a Node (its node) or a Pod (on ``pod_nodes``), for
        the seconds asked but at most ``max_seconds``."""
        self.token_requests.append(body)
        if self.forbid_tokens:
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                      "reason": "Forbidden", "code": 403,
                      "message": f'serviceaccounts "{name}" is forbidden: User "x" cannot '
                                 'create resource "serviceaccounts/token"'}  # fmt: skip
            return web.json_response(status, status=403)
        spec = body.get("spec") or {}
        bound = spec.get("boundObjectRef") or {}
        node = bound.get("name", "") if bound.get("kind") == "Node" else ""
        node = self.pod_nodes.get(bound.get("name", ""), node)
        account = f"system:serviceaccount:{namespace}:{name}"
        token = jwt({"aud": spec.get("audiences") or [], "sub": account, "node": node})
        self.issued[token] = {"aud": spec.get("audiences") or [], "sub": account, "node": node}
        seconds = min(int(spec.get("expirationSeconds") or 3600), self.max_seconds)
        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
        status = {"token": token, "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}
        return web.json_response({**body, "status": status}, status=201)

    def _status(self, token: str, spec: dict[str, Any]) -> dict[str, Any]:
        claims = self.issued.get(token)
        if claims is None:
            return {"user": {}, "error": "[invalid bearer token, square/go-jose: error in "
                                         "cryptographic primitive]"}  # fmt: skip
        wanted = spec.get("audiences") or []
        met = [a for a in claims["aud"] if a in wanted]
        if not met:
            return {"user": {}, "error": "[invalid bearer token, token audiences "
                                         f"{claims['aud']} is invalid for the target audiences "
                                         f"{wanted}]"}  # fmt: skip
        user: dict[str, Any] = {"username": claims["sub"], "uid": "u1",
                                "groups": ["system:serviceaccounts"]}  # fmt: skip
        if claims["node"]:  # bound to a pod or Node; a token bound to nothing names no node
            user["extra"] = {NODE_NAME_KEY: [claims["node"]]}
        return {"authenticated": True, "user": user, "audiences": met}


class Crowd:
    """Idle connections (opened, then silent), garbage ones (random bytes, again and again
    until stopped) and churning ones (idle, opened again as soon as the port closes them, until
    stopped), from addresses of their own, run in a thread with a loop of its own: the port's
    loop does not run them."""

    def __init__(
        self,
        endpoint: Endpoint,
        idle: list[str],
        garbage: list[str],
        churn: list[str] | None = None,
    ) -> None:
        self.endpoint, self.idle, self.garbage = endpoint, idle, garbage
        self.churn = churn or []
        self.lived: list[float] = []  # seconds from connect to the port closing an idle one
        self.opened = threading.Event()
        self.stop = threading.Event()
        self.garbage_sent = 0
        self.reopened = 0  # churning connections the port closed and that were opened again
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def __aenter__(self) -> Crowd:
        self._thread.start()
        assert await asyncio.to_thread(self.opened.wait, 30)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()  # the port's loop goes on meanwhile: it closes the idle ones
        await asyncio.to_thread(self._thread.join, 60)
        assert not self._thread.is_alive()

    async def _run(self) -> None:
        idle = [asyncio.create_task(self._idle(a)) for a in self.idle]
        garbage = [asyncio.create_task(self._garbage(a)) for a in self.garbage]
        churn = [asyncio.create_task(self._churn(a)) for a in self.churn]
        await asyncio.sleep(0.5)
        self.opened.set()
        await asyncio.gather(*idle, *garbage, *churn)

    async def _open(self, address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.endpoint.host, self.endpoint.port,
                                             local_addr=(address, 0))  # fmt: skip

    async def _idle(self, address: str) -> None:
        reader, writer = await self._open(address)
        start = time.monotonic()
        with contextlib.suppress(ConnectionError):
            await asyncio.wait_for(reader.read(1), 60)  # b"" (or a reset) once it is closed
        self.lived.append(time.monotonic() - start)
        writer.close()

    async def _garbage(self, address: str) -> None:
        rng = random.Random(address)
        while not self.stop.is_set():
            try:
                reader, writer = await self._open(address)
                writer.write(rng.randbytes(rng.randrange(1, 2048)))
                await writer.drain()
                self.garbage_sent += 1
                await asyncio.wait_for(reader.read(4096), 30)
                writer.close()
            except (ConnectionError, TimeoutError):
                await asyncio.sleep(0.01)

    async def _churn(self, address: str) -> None:
        while not self.stop.is_set():
            try:
                reader, writer = await self._open(address)
            except OSError:
                await asyncio.sleep(0.01)
                continue
            with contextlib.suppress(ConnectionError, TimeoutError):
                while not self.stop.is_set():  # until the port closes it
                    with contextlib.suppress(TimeoutError):
                        if await asyncio.wait_for(reader.read(1), 0.2) == b"":
                            self.reopened += 1
                            break
            writer.close()


class _Volumes:
    def __init__(self, path: Path) -> None:
        self.path = path

    async def describe(self, name: str, device_class: str, with_uuid: bool = False) -> VolumeInfo:
        return VolumeInfo(str(self.path), SIZE, False, 0, "src-uuid")

    async def mapped(self, name: str, device_class: str) -> list[tuple[int, int]] | None:
        return None

    async def changed(
        self, name: str, base: str, device_class: str, thin: bool = True
    ) -> list[tuple[int, int]] | None:
        return None


class Port:
    """Node a's transfer port; HELLOs are authorised by their token (the real reviewer, with
    ``review`` its keyword arguments) for a job of node b's."""

    def __init__(
        self, tmp: Path, client: AsyncClient, port: PortLimits | None = None,
        review: dict[str, Any] | None = None, **limits: Any,
    ) -> None:  # fmt: skip
        self.source = tmp / "source"
        self.source.write_bytes(random.Random(5).randbytes(SIZE))
        self.metrics = TransferMetrics(None, NODE)
        self.reviewer = TokenReviewer(client, {ACCOUNT}, audience(NODE), self.metrics,
                                      **(review or {}))  # fmt: skip

        async def authorise(hello: messages.Hello) -> Job:
            peer = await self.reviewer.peer(hello.token)
            if peer.node != RECEIVER:
                raise Refused("forbidden", f"the token belongs to node {peer.node}")
            return Job(UID, "pvc-target", RECEIVER, "src", "ssd", "snapshot-1")

        self.server = TransferServer(NODE, authorise, _Volumes(self.source), Limits(**limits),
                                     self.metrics, port=port)  # fmt: skip

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(NODE, "127.0.0.1", self.server.port, self.server.fingerprint)

    def dropped(self, reason: str) -> float:
        return float(self.metrics.dropped.labels(NODE, reason)._value.get())

    def reviews(self, result: str) -> float:
        return float(self.metrics.token_reviews.labels(NODE, result)._value.get())

    def refusals(self, reason: str) -> float:
        return float(self.metrics.refusals.labels(NODE, reason)._value.get())


@pytest.fixture
async def emulator() -> AsyncIterator[TokenReviewEmulator]:
    emu = TokenReviewEmulator()
    await emu.start()
    try:
        yield emu
    finally:
        await emu.stop()


@pytest.fixture
async def api(emulator: TokenReviewEmulator) -> AsyncIterator[AsyncClient]:
    client = client_for(emulator)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def port(tmp_path: Path, api: AsyncClient) -> AsyncIterator[Any]:
    """``make(timeout=10.0, **kw)``: a started :class:`Port` (``kw``: :class:`Port`'s, and
    :class:`~topolvm.transfer.jobs.Limits`'), stopped after the test."""
    made: list[Port] = []

    async def make(timeout: float = 10.0, **kw: Any) -> Port:
        p = Port(tmp_path, api, io_timeout=5, **kw)
        p.server.handshake_timeout = timeout
        await p.server.start("127.0.0.1", 0)
        made.append(p)
        return p

    yield make
    for p in made:
        await p.server.stop()


def hello(token: str, version: int = 1) -> messages.Hello:
    return messages.Hello(version=version, token=token, job="pvc-target", job_uid=UID)


async def copy(p: Port, tmp: Path, token: str) -> bytes:
    """Node b's copy of the job from ``p``: the target's bytes."""
    target = tmp / "target"
    target.write_bytes(bytes(SIZE))
    info = VolumeInfo(str(target), SIZE, False, 0, "t")
    await asyncio.to_thread(receive, p.endpoint, hello(token), info, lambda c: None,
                            lambda *a: None, threading.Event(), 10.0)  # fmt: skip
    return target.read_bytes()


def connect_from(address: str, endpoint: Endpoint) -> socket.socket:
    return socket.create_connection((endpoint.host, endpoint.port), 10, (address, 0))


def ask_from(address: str, endpoint: Endpoint, token: str, version: int = 1) -> str:
    """A HELLO from ``address``: the sender's answer ("accepted" or the refusal's reason)."""
    conn = Conn.tls(connect_from(address, endpoint), client_context(), endpoint.node,
                    server=False)  # fmt: skip
    try:
        conn.send_message(hello(token, version))
        conn.recv_message(messages.Accept)
        return "accepted"
    except Refused as r:
        return r.reason
    finally:
        conn.close()


def addresses(first: int, count: int, each: int) -> list[str]:
    """``count`` loopback addresses from 127.0.0.``first``, each ``each`` times."""
    return [f"127.0.0.{first + i}" for i in range(count) for _ in range(each)]


async def in_threads(fn: Any, calls: list[tuple[Any, ...]]) -> list[Any]:
    """``fn(*args)`` for each of ``calls``, each in a thread of its own, all at once (the
    default executor runs a handful at a time, and the test's own calls would queue behind
    them): their results, in order."""
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        results[i] = fn(*calls[i])

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()

    def join() -> None:
        for t in threads:
            t.join(60)

    await asyncio.to_thread(join)
    return results

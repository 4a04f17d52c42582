"""What a connection to the transfer port may take before it is authorised (docs/security.md,
"The transfer port"): the real TransferServer on loopback, other loopback addresses
(127.0.0.x) standing in for other pods, and the real TokenReviewer asking the API emulator
(tests/transfer_port_helpers.py) over HTTP.

A copy finishes while hundreds of idle and garbage connections are open, and while a crowd
churns through the port's places; idle ones are closed at the deadline that runs from accept;
one address waits only behind its own connections; an address connecting too often is closed
at accept, before any TLS; the handshakes of many addresses together are paced, and a node's
own handshake still gets its turn. (tests/test_transfer_port_reviews.py: what a HELLO may cost
once it is read.)"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from pathlib import Path
from typing import Any

from tests import transfer_port_helpers as fixtures
from tests.transfer_port_helpers import (
    NODE,
    RECEIVER,
    Crowd,
    TokenReviewEmulator,
    addresses,
    connect_from,
    copy,
    hello,
)
from topolvm.transfer import messages, wire
from topolvm.transfer.auth import audience
from topolvm.transfer.client import connect
from topolvm.transfer.door import PortLimits
from topolvm.transfer.errors import TransferError
from topolvm.transfer.tls import client_context

emulator, api, port = fixtures.emulator, fixtures.api, fixtures.port


async def test_a_copy_finishes_while_200_idle_and_200_garbage_connections_are_open(
    port: Any, emulator: TokenReviewEmulator, tmp_path: Path
) -> None:
    p = await port(timeout=3.0, bandwidth=8 * (1 << 20))  # the copy takes about 2 s
    idle, garbage = addresses(10, 50, 4), addresses(100, 50, 4)
    async with Crowd(p.endpoint, idle, garbage) as crowd:
        began = time.monotonic()
        data = await copy(p, tmp_path, emulator.issue(audience(NODE), RECEIVER))
        took = time.monotonic() - began
        assert data == p.source.read_bytes()
        assert crowd.garbage_sent >= 200, crowd.garbage_sent  # garbage all along the copy
    assert len(crowd.lived) == 200
    # every idle connection went at the deadline from its accept (some earlier: evicted)
    assert max(crowd.lived) < 3.0 + 1.5, sorted(crowd.lived)[-5:]
    assert p.dropped("deadline") + p.dropped("evicted") >= 200
    # garbage is dropped at its first bytes (no TLS record), or at accept past its rate
    assert p.dropped("handshake") + p.dropped("rate") >= 200
    assert took < 10, took


async def test_one_address_waits_only_behind_its_own_connections(
    port: Any, emulator: TokenReviewEmulator, tmp_path: Path
) -> None:
    """4 pending per address, 16 in all (the defaults are 8 and 256): an address's new
    connection pushes out its own oldest; a full port pushes out the oldest of an address
    holding the most, never a node's one connection."""
    p = await port(timeout=5.0, port=PortLimits(pending_per_peer=4, pending=16))
    async with Crowd(p.endpoint, addresses(2, 1, 10), []) as one:
        await asyncio.sleep(0.5)
        assert len(one.lived) == 6 and max(one.lived) < 1.0  # its 6 oldest: closed at once
        assert p.dropped("peer-limit") == 6
        async with Crowd(p.endpoint, addresses(3, 5, 4), []) as many:  # 24: the port is full
            await asyncio.sleep(0.5)
            assert p.dropped("evicted") == 8
            data = await copy(p, tmp_path, emulator.issue(audience(NODE), RECEIVER))
            assert data == p.source.read_bytes()
    assert len(one.lived) == 10 and len(many.lived) == 20


async def test_a_copy_finishes_while_a_crowd_churns_through_the_full_port(
    port: Any, emulator: TokenReviewEmulator, tmp_path: Path
) -> None:
    """8 addresses keep 4 connections each open, opening another as soon as one is closed,
    at a port with room for 16: connections are pushed out again and again all along the copy,
    and the receiver's one connection is never among them."""
    limits = PortLimits(pending_per_peer=4, pending=16, connects_per_peer=20, connect_burst=8)
    p = await port(timeout=5.0, port=limits, bandwidth=8 * (1 << 20))  # about 2 s
    async with Crowd(p.endpoint, [], [], churn=addresses(20, 8, 4)) as crowd:
        await asyncio.sleep(0.5)
        before = p.dropped("evicted") + p.dropped("peer-limit")
        data = await copy(p, tmp_path, emulator.issue(audience(NODE), RECEIVER))
        churned = p.dropped("evicted") + p.dropped("peer-limit") - before
    assert data == p.source.read_bytes()
    assert churned >= 20 and crowd.reopened >= 20, (churned, crowd.reopened)


def _handshake_from(address: str, p: Any) -> bool:
    """Whether a TLS handshake from ``address`` completes."""
    try:
        with connect_from(address, p.endpoint) as sock, client_context().wrap_socket(sock) as tls:
            return tls.version() == "TLSv1.3"
    except (ssl.SSLError, OSError):
        return False


def _threads(target: Any, args: list[tuple[Any, ...]]) -> list[threading.Thread]:
    """Threads of their own (the default executor has a handful), started."""
    threads = [threading.Thread(target=target, args=a, daemon=True) for a in args]
    for t in threads:
        t.start()
    return threads


def _join(threads: list[threading.Thread], timeout: float) -> None:
    for t in threads:
        t.join(timeout)


async def test_an_address_connecting_too_often_is_closed_before_any_tls(
    port: Any, emulator: TokenReviewEmulator, tmp_path: Path
) -> None:
    """5 connections at once from one address, then 1 a second: of 40 opened at once, 5 (or
    6, if a second passed) get a TLS handshake; the others are closed at accept. Another
    address is served meanwhile, and the address gets in again once its rate allows."""
    p = await port(port=PortLimits(connects_per_peer=1, connect_burst=5))
    done: list[bool] = []
    threads = _threads(lambda: done.append(_handshake_from("127.0.0.2", p)), [()] * 40)
    await asyncio.to_thread(_join, threads, 30)
    assert len(done) == 40 and sum(done) in (5, 6), sum(done)
    assert p.dropped("rate") == 40 - sum(done)
    data = await copy(p, tmp_path, emulator.issue(audience(NODE), RECEIVER))  # 127.0.0.1
    assert data == p.source.read_bytes()
    await asyncio.sleep(1.1)
    assert await asyncio.to_thread(_handshake_from, "127.0.0.2", p)


async def test_the_handshakes_of_many_addresses_are_paced_and_a_node_still_gets_its_turn(
    port: Any, emulator: TokenReviewEmulator, tmp_path: Path
) -> None:
    """30 addresses doing TLS handshakes as fast as they can, at a port that computes 20 a
    second (after 5 at once): no more than that are done, however many connect, and node b's
    copy is served meanwhile (its handshake waits one turn of each address, not their flood)."""
    limits = PortLimits(handshakes=20, handshake_burst=5, connects_per_peer=1000,
                        connect_burst=1000)  # fmt: skip
    p = await port(timeout=3.0, port=limits)
    stop = threading.Event()
    finished: list[float] = []

    def flood(address: str) -> None:
        while not stop.is_set():
            if _handshake_from(address, p):
                finished.append(time.monotonic())

    began = time.monotonic()
    threads = _threads(flood, [(a,) for a in addresses(30, 30, 1)])
    try:
        await asyncio.sleep(1.0)
        started = time.monotonic()
        data = await copy(p, tmp_path, emulator.issue(audience(NODE), RECEIVER))
        assert data == p.source.read_bytes()
        assert time.monotonic() - started < 3.0
        await asyncio.sleep(max(0.0, began + 3.0 - time.monotonic()))
    finally:
        stop.set()
        await asyncio.to_thread(_join, threads, 10)
    seconds = max(finished) - began
    # the copy's own handshake is one of the paced ones
    assert len(finished) + 1 <= 5 + 20 * seconds + 2, (len(finished), seconds)
    assert len(finished) >= 20, len(finished)


async def test_the_deadline_runs_from_accept_whatever_the_peer_sends(port: Any) -> None:
    """A peer that finishes TLS at once, then trickles its HELLO a byte at a time, is cut off
    at the deadline from accept; so is one that never says a word."""
    p = await port(timeout=1.5)
    frame = wire.control(wire.Kind.HELLO, messages.encode(hello("x" * 200)))

    def trickle() -> float:
        start = time.monotonic()
        conn = connect(p.endpoint, 10.0)
        try:
            for byte in frame:
                conn.send(bytes([byte]))
                time.sleep(0.1)
        except TransferError:
            pass
        with contextlib.suppress(TransferError, OSError):
            conn.recv_message(messages.Accept)
        conn.close()
        return time.monotonic() - start

    def silent() -> float:
        start = time.monotonic()
        with connect_from("127.0.0.2", p.endpoint) as s:
            s.settimeout(30)
            assert s.recv(1) == b""
        return time.monotonic() - start

    lived = await asyncio.gather(asyncio.to_thread(trickle), asyncio.to_thread(silent))
    assert all(1.4 < t < 2.5 for t in lived), lived
    assert p.dropped("deadline") == 2

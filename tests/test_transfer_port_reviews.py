"""What a HELLO may cost once it is read (docs/security.md, "The transfer port"): the real
TokenReviewer asking the API emulator (tests/transfer_port_helpers.py) over HTTP, alone or
behind the real TransferServer on loopback, other loopback addresses (127.0.0.x) standing in
for other pods.

Tokens that are too long, nested too deep, expired, made for another node's port or for the
audience every node used to share are refused without a review; a refusal is remembered
briefly, apart from the answers, so forged tokens never push a node's answer out; reviews are
few at once, shared by one token, handed out round robin by address; an address whose token a
review refused gets no review for a while; a node is served while one address or many flood
the port with forged tokens; refusals before authentication are logged once per address and
reason; a HELLO of another protocol version is refused before it is authorised."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient

from tests import transfer_port_helpers as fixtures
from tests.transfer_port_helpers import (
    ACCOUNT,
    NODE,
    RECEIVER,
    TokenReviewEmulator,
    addresses,
    ask_from,
    copy,
    in_threads,
    jwt,
)
from topolvm.transfer.auth import LEGACY_AUDIENCE, MAX_TOKEN, TokenReviewer, audience
from topolvm.transfer.errors import Refused
from topolvm.transfer.metrics import TransferMetrics
from topolvm.transfer.server import AUTHORISING_PER_PEER

emulator, api, port = fixtures.emulator, fixtures.api, fixtures.port


def _nested(depth: int) -> str:
    """A JWT whose claims are ``depth`` arrays one inside the other."""
    return "x." + base64.urlsafe_b64encode(b"[" * depth).decode().rstrip("=") + ".y"


async def test_a_token_that_is_no_token_for_this_port_is_refused_without_a_review(
    api: AsyncClient, emulator: TokenReviewEmulator
) -> None:
    metrics = TransferMetrics(None, NODE)
    reviewer = TokenReviewer(api, {ACCOUNT}, audience(NODE), metrics)
    expired = jwt({"aud": [audience(NODE)], "sub": ACCOUNT, "exp": int(time.time()) - 3600})
    cases = [
        (emulator.issue(audience("node-c"), RECEIVER), "made for another node's transfer port"),
        (emulator.issue(LEGACY_AUDIENCE, RECEIVER), "every node shared before"),
        ("not-a-token", "no ServiceAccount token"),
        (expired, "expired 36"),
        (_nested(40000), f"more than {MAX_TOKEN}"),  # 53 KB
        (_nested(6000), "no ServiceAccount token"),  # under the bound, nested too deep
    ]
    for token, says in cases:
        with pytest.raises(Refused, match=says) as refused:
            await reviewer.peer(token)
        assert refused.value.reason == "unauthenticated"
    assert emulator.reviewed == []
    good = emulator.issue(audience(NODE), RECEIVER)
    assert (await reviewer.peer(good)).node == RECEIVER
    assert (await reviewer.peer(good)).node == RECEIVER  # cached
    assert emulator.reviewed == [good]


async def test_a_token_bound_to_nothing_names_no_node_and_is_forbidden(
    api: AsyncClient, emulator: TokenReviewEmulator
) -> None:
    """The API server names no node for a token bound to no pod or Node (a Secret's, say)."""
    reviewer = TokenReviewer(api, {ACCOUNT}, audience(NODE))
    with pytest.raises(Refused, match="bound to no node") as refused:
        await reviewer.peer(emulator.issue(audience(NODE), ""))
    assert refused.value.reason == "forbidden"


async def test_a_refused_token_is_remembered_briefly(
    api: AsyncClient, emulator: TokenReviewEmulator
) -> None:
    metrics = TransferMetrics(None, NODE)
    reviewer = TokenReviewer(api, {ACCOUNT}, audience(NODE), metrics, refused_seconds=1.0)
    forged = jwt({"aud": [audience(NODE)], "sub": ACCOUNT})  # the API server never made it
    for _ in range(5):
        with pytest.raises(Refused, match="invalid bearer token"):
            await reviewer.peer(forged)
    assert emulator.reviewed == [forged]
    await asyncio.sleep(1.1)
    with pytest.raises(Refused):
        await reviewer.peer(forged)
    assert emulator.reviewed == [forged, forged]
    assert metrics.token_reviews.labels(NODE, "refused")._value.get() == 2


async def test_forged_refusals_never_push_a_nodes_answer_out(
    api: AsyncClient, emulator: TokenReviewEmulator
) -> None:
    """1100 forged tokens refused (more than the 1024 answers kept): the node's answer stays."""
    reviewer = TokenReviewer(api, {ACCOUNT}, audience(NODE), reviews=64, rate=100000)
    good = emulator.issue(audience(NODE), RECEIVER)
    assert (await reviewer.peer(good)).node == RECEIVER
    forged = [jwt({"aud": [audience(NODE)], "sub": ACCOUNT, "n": i}) for i in range(1100)]
    results = await asyncio.gather(*(reviewer.peer(t) for t in forged), return_exceptions=True)
    assert all(isinstance(r, Refused) for r in results)
    assert (await reviewer.peer(good)).node == RECEIVER
    assert emulator.reviewed.count(good) == 1


async def test_token_reviews_are_few_at_once_and_shared_by_one_token(
    api: AsyncClient, emulator: TokenReviewEmulator
) -> None:
    emulator.delay = 0.3
    reviewer = TokenReviewer(api, {ACCOUNT}, audience(NODE), reviews=4)
    good = emulator.issue(audience(NODE), RECEIVER)
    forged = [jwt({"aud": [audience(NODE)], "sub": ACCOUNT, "n": i}) for i in range(20)]
    results = await asyncio.gather(*(reviewer.peer(t) for t in [*forged, *[good] * 10]),
                                   return_exceptions=True)  # fmt: skip
    assert all(isinstance(r, Refused) for r in results[:20])
    assert all(not isinstance(r, BaseException) and r.node == RECEIVER for r in results[20:])
    assert emulator.most_in_flight == 4
    assert emulator.reviewed.count(good) == 1 and len(emulator.reviewed) == 21


async def test_a_flooded_port_refuses_busy_and_still_serves_another_node(
    port: Any, emulator: TokenReviewEmulator, tmp_path: Path
) -> None:
    """HELLOs with tokens that look right but are not (each would cost a review) from one
    address: past ``AUTHORISING_PER_PEER`` of them it is refused busy at once, and a node
    elsewhere is served meanwhile; once a review refused one, the address gets no review for a
    while (busy), but for a token whose answer is cached."""
    emulator.delay = 1.0
    p = await port(timeout=5.0)
    forged = [jwt({"aud": [audience(NODE)], "sub": ACCOUNT, "n": i}) for i in range(6)]
    started = asyncio.create_task(
        in_threads(ask_from, [("127.0.0.2", p.endpoint, t) for t in forged])
    )
    await asyncio.sleep(0.5)
    began = time.monotonic()
    good = emulator.issue(audience(NODE), RECEIVER)
    data = await copy(p, tmp_path, good)
    assert data == p.source.read_bytes() and time.monotonic() - began < 5
    answers = await started
    assert sorted(answers) == sorted(["busy"] * (6 - AUTHORISING_PER_PEER)
                                     + ["unauthenticated"] * AUTHORISING_PER_PEER)  # fmt: skip
    assert p.reviews("refused") == AUTHORISING_PER_PEER
    # backed off: another forged token gets no review; the cached answer still serves
    another = jwt({"aud": [audience(NODE)], "sub": ACCOUNT, "n": 99})
    assert await asyncio.to_thread(ask_from, "127.0.0.2", p.endpoint, another) == "busy"
    assert await asyncio.to_thread(ask_from, "127.0.0.2", p.endpoint, good) == "accepted"
    assert another not in emulator.reviewed


async def test_many_addresses_flooding_reviews_get_a_turn_each_and_a_node_is_served(
    port: Any, emulator: TokenReviewEmulator, tmp_path: Path
) -> None:
    """12 addresses, each with 4 forged tokens at once and 4 more a second later, at a port
    with 8 reviews at once that take 1 s each: reviews are handed out round robin by address,
    so node b's review comes after one turn of each (not after all 48 queued: 6 s), and an
    address refused once gets no more reviews for a while: those still queued go without one,
    and the second wave costs none."""
    emulator.delay = 1.0
    p = await port(timeout=10.0)
    crowd = addresses(10, 12, AUTHORISING_PER_PEER)

    async def wave(n: int) -> list[str]:
        tokens = [jwt({"aud": [audience(NODE)], "sub": ACCOUNT, "w": n, "i": i})
                  for i in range(len(crowd))]  # fmt: skip
        calls = [(a, p.endpoint, t) for a, t in zip(crowd, tokens, strict=True)]
        answers: list[str] = await in_threads(ask_from, calls)
        return answers

    first = asyncio.create_task(wave(1))
    await asyncio.sleep(0.5)
    own = emulator.issue(audience(NODE), RECEIVER)
    data = await copy(p, tmp_path, own)
    answers = await first
    after_first = len(emulator.reviewed) - 1  # node b's own
    second = await wave(2)
    assert data == p.source.read_bytes()
    # node b's review came after one turn of each address (12, with the 8 at once in flight),
    # not after all 48 queued; counted, not timed (a loaded host stretches every second)
    assert emulator.reviewed.index(own) <= len(crowd) + 8, emulator.reviewed.index(own)
    assert set(answers) <= {"unauthenticated", "busy"}
    # the addresses refused first lose their queued reviews; the second wave costs none
    assert after_first < len(crowd), after_first
    assert second == ["busy"] * len(second) and len(emulator.reviewed) - 1 == after_first


async def test_refusals_before_authentication_are_logged_once_per_address_and_reason(
    port: Any, emulator: TokenReviewEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    p = await port()
    caplog.set_level(logging.WARNING, logger="topolvm.transfer")
    for i in range(10):
        for address in ("127.0.0.2", "127.0.0.3"):
            token = emulator.issue(audience("node-c"), RECEIVER) if i % 2 else f"junk-{i}"
            assert await asyncio.to_thread(ask_from, address, p.endpoint, token) == (
                "unauthenticated"
            )
    early = [r for r in caplog.records if "before the receiver was authenticated" in r.message]
    assert sorted(r.peer for r in early) == ["127.0.0.2", "127.0.0.3"]  # type: ignore[attr-defined]
    assert p.refusals("unauthenticated") == 20


async def test_another_protocol_version_is_refused_before_it_is_authorised(
    port: Any, emulator: TokenReviewEmulator
) -> None:
    """Nothing about the job is looked at (no review, no cut of the source) for a HELLO the
    port cannot answer."""
    p = await port()
    good = emulator.issue(audience(NODE), RECEIVER)
    answer = await asyncio.to_thread(ask_from, "127.0.0.2", p.endpoint, good, 7)
    assert answer == "invalid"
    assert emulator.reviewed == []

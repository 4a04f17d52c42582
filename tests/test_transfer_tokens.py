"""The tokens a receiver shows (docs/security.md, "The transfer port"): one per source node, made
with TokenRequest for that node's audience alone, bound as asked, kept until four fifths of
their life are gone, made again once a source refused one; a token made for one port is
accepted there and refused at another; a TokenRequest that hangs delays its own source
alone; the receiver tells an older sender's refusal (upgrade it) from a bad token's. The real
TransferTokens and TokenReviewer talk HTTP to the API emulator (tests/transfer_port_helpers.py);
tests/test_cluster_transfer_faults.py does it with the real API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from lightkube import AsyncClient
from lightkube.models.authentication_v1 import TokenReviewSpec
from lightkube.resources.authentication_v1 import TokenReview

from tests import transfer_port_helpers as fixtures
from tests.transfer_port_helpers import ACCOUNT, TokenReviewEmulator, jwt
from topolvm.k8s import api as kube_api
from topolvm.transfer.auth import LEGACY_AUDIENCE, TokenReviewer, audience, older_sender
from topolvm.transfer.errors import NoToken, Refused
from topolvm.transfer.tokens import Bearer, TransferTokens

POD = Bearer("topolvm-system", "topolvm-node", "Pod", "topolvm-node-x1", "u-1")


@pytest.fixture
async def emulator() -> AsyncIterator[TokenReviewEmulator]:
    emu = TokenReviewEmulator()
    emu.pod_nodes["topolvm-node-x1"] = "node-b"
    await emu.start()
    try:
        yield emu
    finally:
        await emu.stop()


api = fixtures.api  # a client of this module's ``emulator`` (the one below knows a pod)


async def test_each_source_gets_a_token_good_at_its_port_alone(
    api: AsyncClient, emulator: TokenReviewEmulator
) -> None:
    tokens = TransferTokens(api, POD, seconds=600)
    for_a = await tokens.token("node-a")
    assert await tokens.token("node-a") == for_a  # kept
    for_c = await tokens.token("node-c")
    asked = [r["spec"] for r in emulator.token_requests]
    assert [s["audiences"] for s in asked] == [[audience("node-a")], [audience("node-c")]]
    assert all(s["expirationSeconds"] == 600 for s in asked)
    assert asked[0]["boundObjectRef"] == {"apiVersion": "v1", "kind": "Pod",
                                          "name": "topolvm-node-x1", "uid": "u-1"}  # fmt: skip
    port_a = TokenReviewer(api, {ACCOUNT}, audience("node-a"))
    assert (await port_a.peer(for_a)).node == "node-b"
    with pytest.raises(Refused, match="made for another node's transfer port"):
        await port_a.peer(for_c)  # what node c was shown, replayed at node a


async def test_a_token_is_made_again_late_in_its_life_or_once_refused(
    api: AsyncClient, emulator: TokenReviewEmulator
) -> None:
    emulator.max_seconds = 2  # the API server shortens what is asked
    tokens = TransferTokens(api, Bearer("ns", "acct", "Node", "node-b"))
    first = await tokens.token("node-a")
    await asyncio.sleep(0.5)
    assert await tokens.token("node-a") == first
    await asyncio.sleep(1.3)  # past four fifths of its (at most) 2 s
    second = await tokens.token("node-a")
    assert second != first
    tokens.forget("node-a")  # the source refused it
    assert await tokens.token("node-a") not in (first, second)
    assert len(emulator.token_requests) == 3
    assert emulator.token_requests[0]["spec"]["boundObjectRef"]["kind"] == "Node"


async def test_no_right_to_make_tokens_is_a_clear_transient_error(
    api: AsyncClient, emulator: TokenReviewEmulator
) -> None:
    emulator.forbid_tokens = True
    with pytest.raises(NoToken, match="needs create on serviceaccounts/token") as no:
        await TransferTokens(api, POD).token("node-a")
    assert no.value.transient and "node node-a's transfer port" in str(no.value)
    with pytest.raises(NoToken, match="--transfer-service-account"):
        await TransferTokens(api, None).token("node-a")


async def test_a_hung_token_request_delays_only_its_own_source(
    api: AsyncClient, emulator: TokenReviewEmulator
) -> None:
    """TokenRequests for node c hang: node a's token comes at once meanwhile, and node c's
    copies get a clear, transient error after the timeout."""
    emulator.hang.add(audience("node-c"))
    tokens = TransferTokens(api, POD, timeout=1.0)
    hung = asyncio.create_task(tokens.token("node-c"))
    await asyncio.sleep(0.1)
    for_a = await asyncio.wait_for(tokens.token("node-a"), 0.5)
    assert (await TokenReviewer(api, {ACCOUNT}, audience("node-a")).peer(for_a)).node == "node-b"
    with pytest.raises(NoToken, match="took more than 1s") as no:
        await hung
    assert no.value.transient and "node node-c's transfer port" in str(no.value)


async def test_the_receiver_says_upgrade_only_when_the_sender_reviewed_for_the_shared_audience(
    api: AsyncClient, emulator: TokenReviewEmulator
) -> None:
    """What an older sender answers this release's token (its TokenReview asks for the audience
    every node shared) is told apart from an expired or forged token's refusal."""
    token = await TransferTokens(api, POD).token("node-a")
    spec = TokenReviewSpec(token=token, audiences=[LEGACY_AUDIENCE])  # as an older sender asks
    said = await kube_api.create(api, TokenReview(spec=spec))
    for older in (f"the token is not valid: {said['status']['error']}",
                  f"the token is not meant for the audience {LEGACY_AUDIENCE!r}"):  # fmt: skip
        assert older_sender(older), older
    reviewer = TokenReviewer(api, {ACCOUNT}, audience("node-a"))
    expired = jwt({"aud": [audience("node-a")], "sub": ACCOUNT, "exp": 1})
    for token in (expired, jwt({"aud": [audience("node-a")], "sub": ACCOUNT}),
                  await TransferTokens(api, POD).token("node-c")):  # fmt: skip
        with pytest.raises(Refused) as refused:
            await reviewer.peer(token)
        assert refused.value.reason == "unauthenticated"
        assert not older_sender(refused.value.message), refused.value.message

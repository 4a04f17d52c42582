"""Who is asking: a receiver proves it is topolvm-node on a given node with the cluster's own
credentials, a ServiceAccount token for the audience of this very sender,
``topolvm-transfer:<sender's node>`` (:func:`audience`; the receiver obtains one per source with
TokenRequest, :mod:`.tokens`), which the sender checks with a TokenReview.

A token shown to one node is good at that node's port only: a node that was shown one cannot
replay it at another (docs/security.md). The audience ``topolvm-transfer`` that every node
shared before is refused, saying so (:func:`precheck`): a node of an older release must be
upgraded to copy from this one.

:func:`check_review` is the rule (pure): the API server authenticated the token, for this
node's audience, as one of the accepted ServiceAccounts, and the token is bound to a pod (or a
Node) on a node, whose name the API server puts in ``user.extra``. The job's target node must be
that node (the sender's authoriser checks it).

:class:`TokenReviewer` bounds what HELLOs cost the API server (docs/security.md):

- a token that is no token for this node is refused without a review (:func:`precheck`: longer
  than ``MAX_TOKEN``, no JWT, expired, or for another audience);
- an answer is cached ``CACHE_SECONDS`` and a refusal ``REFUSED_SECONDS``, apart: refusals
  (which anyone can make by the thousand) never push answers out;
- an address whose token a review refused gets no review for ``BACKOFF_SECONDS`` (its HELLOs
  are refused ``busy``, but for a token whose answer is cached): one TokenReview per address
  and while, however many forged tokens it has;
- at most ``REVIEWS`` reviews run at once and ``REVIEW_RATE`` start a second, handed out round
  robin by address (:class:`~.turns.FairTurns`); a HELLO waits ``REVIEW_WAIT`` seconds for its
  turn, then is refused ``busy``; one review serves every HELLO with the same token.

The address is the one the port sets in :data:`CALLER` while it authorises a HELLO (none: no
back-off, one queue).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import time
from collections import OrderedDict
from collections.abc import Collection
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from lightkube import AsyncClient
from lightkube.models.authentication_v1 import TokenReviewSpec
from lightkube.resources.authentication_v1 import TokenReview

from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.transfer.errors import EarlyRefusal, Refused
from topolvm.transfer.metrics import TransferMetrics
from topolvm.transfer.turns import FairTurns

AUDIENCE_PREFIX = "topolvm-transfer"
LEGACY_AUDIENCE = AUDIENCE_PREFIX  # shared by all nodes: what releases before did show
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
MAX_TOKEN = 8192  # bytes; a ServiceAccount token has 1 to 2 KiB
EXPIRY_LEEWAY = 60.0  # seconds of clock skew allowed before a token is taken as expired
CACHE_SECONDS = 60.0  # a bound token dies with its pod; a minute of trust after that at most
CACHE_SIZE = 1024  # answers
REFUSED_SECONDS = 10.0  # a refused token is refused again without a review for this long
REFUSED_SIZE = 4096  # refusals, kept apart from the answers
BACKOFF_SECONDS = 10.0  # an address whose token a review refused gets no review for this long
BACKOFF_SIZE = 4096  # addresses
REVIEWS = 8  # TokenReviews in flight at once
REVIEW_RATE = 25.0  # TokenReviews started a second (after REVIEWS at once)
REVIEW_WAIT = 10.0  # seconds a HELLO waits for one before it is refused busy
CALLER: ContextVar[str] = ContextVar("topolvm_transfer_caller", default="")
"""The address of the peer whose HELLO is being authorised (set by the port)."""


def audience(node: str) -> str:
    """The audience of the tokens ``node``'s transfer port accepts."""
    return f"{AUDIENCE_PREFIX}:{node}"


@dataclass(frozen=True)
class Peer:
    username: str
    node: str


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def claims(token: str) -> dict[str, Any] | None:
    """A JWT's claims, not verified (the API server does that); None if it is no JWT (or one
    longer than :data:`MAX_TOKEN`)."""
    parts = token.split(".") if len(token) <= MAX_TOKEN else []
    if len(parts) != 3:
        return None
    try:
        raw = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        decoded = json.loads(raw)
    except (ValueError, TypeError, RecursionError):  # RecursionError: nested too deep
        return None
    return decoded if isinstance(decoded, dict) else None


def precheck(token: str, wanted: str, now: float | None = None) -> None:
    """Refuse, without asking the API server, a token that is not a ServiceAccount token for
    ``wanted``: too long, garbage, expired (``exp`` before ``now``, the Unix time, by more than
    :data:`EXPIRY_LEEWAY`), another node's, or one of the shared audience of older releases."""
    if len(token) > MAX_TOKEN:
        raise EarlyRefusal("unauthenticated", f"the token has {len(token)} characters, more "
                           f"than {MAX_TOKEN}: it is no ServiceAccount token")  # fmt: skip
    found = claims(token)
    if found is None:
        raise EarlyRefusal("unauthenticated", "the token is no ServiceAccount token (not a JWT)")
    exp = found.get("exp")
    now = time.time() if now is None else now
    if isinstance(exp, int | float) and not isinstance(exp, bool) and exp < now - EXPIRY_LEEWAY:
        raise EarlyRefusal("unauthenticated", f"the token expired {now - exp:.0f}s ago: the "
                           "receiver obtains a new one")  # fmt: skip
    aud = found.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if wanted in audiences:
        return
    shown = ", ".join(repr(str(a)[:80]) for a in audiences[:4]) or "none"
    if LEGACY_AUDIENCE in audiences:
        raise EarlyRefusal(
            "unauthenticated",
            f"the token is for the audience {LEGACY_AUDIENCE!r} that every node shared before "
            f"(a topolvm-node of an older release shows it); this port accepts only tokens for "
            f"{wanted!r}, which the receiver obtains for it: upgrade the receiving node",
        )
    others = [a for a in audiences if isinstance(a, str) and a.startswith(AUDIENCE_PREFIX + ":")]
    if others:
        raise EarlyRefusal(
            "unauthenticated",
            f"the token was made for another node's transfer port ({shown}), not for this "
            f"one ({wanted!r}): a token shown to one node is not accepted by another",
        )
    raise EarlyRefusal("unauthenticated", f"the token is for the audiences {shown}, not {wanted!r}")


def check_review(review: dict[str, Any], audience: str, accounts: Collection[str]) -> Peer:
    status = _mapping(review.get("status"))
    if status.get("authenticated") is not True:
        why = status.get("error") or "the API server did not authenticate it"
        raise EarlyRefusal("unauthenticated", f"the token is not valid: {why}")
    audiences = status.get("audiences")
    if not isinstance(audiences, list) or audience not in audiences:
        raise EarlyRefusal(
            "unauthenticated", f"the token is not meant for the audience {audience!r}"
        )
    user = _mapping(status.get("user"))
    username = user.get("username")
    username = username if isinstance(username, str) else ""
    if username not in accounts:
        raise EarlyRefusal(
            "forbidden",
            f"{username or 'an anonymous user'} is not topolvm-node's ServiceAccount "
            f"({', '.join(sorted(accounts))})",
        )
    nodes = _mapping(user.get("extra")).get(NODE_NAME_KEY)
    node = nodes[0] if isinstance(nodes, list) and nodes and isinstance(nodes[0], str) else ""
    if not node:
        raise EarlyRefusal(
            "forbidden",
            "the token is bound to no node: topolvm-node must present a token bound to its "
            "pod (or to its Node)",
        )
    return Peer(username, node)


def older_sender(message: str) -> bool:
    """Whether a sender's refusal says it reviewed the token for the audience every node
    shared before (:data:`LEGACY_AUDIENCE`, a topolvm-node of an older release), not for its
    own: the API server's or its own words quote that audience alone."""
    return _SHARED.search(message) is not None


_SHARED = re.compile(rf"(?<![\w:/.-]){re.escape(LEGACY_AUDIENCE)}(?![\w:/.-])")


class TokenReviewer:
    """TokenReview for the port of ``audience``, bounded and cached (see the module)."""

    def __init__(
        self, client: AsyncClient, accounts: Collection[str], audience: str,
        metrics: TransferMetrics | None = None, *, reviews: int = REVIEWS,
        rate: float = REVIEW_RATE, wait: float = REVIEW_WAIT,
        refused_seconds: float = REFUSED_SECONDS, backoff: float = BACKOFF_SECONDS,
    ) -> None:  # fmt: skip
        self.client = client
        self.accounts = frozenset(accounts)
        self.audience = audience
        self.metrics = metrics
        self.wait = wait
        self.refused_seconds = refused_seconds
        self.backoff = backoff
        self._turns = FairTurns(slots=reviews, rate=rate, burst=reviews)
        self._answers: OrderedDict[str, tuple[float, Peer]] = OrderedDict()
        self._refusals: OrderedDict[str, tuple[float, Refused]] = OrderedDict()
        self._backoff: OrderedDict[str, float] = OrderedDict()  # address -> until
        self._running: dict[str, asyncio.Task[Peer]] = {}

    async def peer(self, token: str) -> Peer:
        now = time.monotonic()
        address = CALLER.get()
        key = hashlib.sha256(token.encode(errors="replace")).hexdigest()
        answer = self._answers.get(key)
        if answer is not None and answer[0] > now:
            return answer[1]
        refusal = self._refusals.get(key)
        if refusal is not None and refusal[0] > now:
            self._back_off(address, now)
            raise EarlyRefusal(refusal[1].reason, refusal[1].message)
        precheck(token, self.audience)
        self._check_backoff(address, now)
        task = self._running.get(key)
        if task is None:
            task = asyncio.create_task(self._review(token, key, address), name="token-review")
            self._running[key] = task
            task.add_done_callback(lambda done: self._done(key, done))
        try:  # shielded: a HELLO that gives up (its connection went) leaves the others' review
            return await asyncio.shield(task)
        except Refused as r:
            if r.reason in ("unauthenticated", "forbidden"):  # a review said no
                self._back_off(address, time.monotonic())
            raise

    async def _review(self, token: str, key: str, address: str) -> Peer:
        try:
            async with asyncio.timeout(self.wait):
                await self._turns.take(address)
        except TimeoutError:
            raise EarlyRefusal(
                "busy", f"{self.wait:g}s without a turn for a TokenReview: the port is flooded"
            ) from None
        try:
            self._check_backoff(address, time.monotonic())  # refused while this one waited
            review = TokenReview(spec=TokenReviewSpec(token=token, audiences=[self.audience]))
            try:
                answer = await api.create(self.client, review)
            except kube.KubeError as e:
                self._count("failed")
                raise EarlyRefusal("unavailable", f"TokenReview failed: {kube.describe(e)}") from e
        finally:
            self._turns.give_back()
        try:
            peer = check_review(answer, self.audience, self.accounts)
        except Refused as r:
            self._count("refused")
            _remember(self._refusals, key, (time.monotonic() + self.refused_seconds, r),
                      REFUSED_SIZE)  # fmt: skip
            raise
        self._count("authenticated")
        _remember(self._answers, key, (time.monotonic() + CACHE_SECONDS, peer), CACHE_SIZE)
        return peer

    def _check_backoff(self, address: str, now: float) -> None:
        until = self._backoff.get(address, 0.0)
        if until > now:
            raise EarlyRefusal(
                "busy", f"a token shown from {address} was refused by a TokenReview: its HELLOs "
                f"get no review for {until - now:.0f}s more"
            )  # fmt: skip

    def _back_off(self, address: str, now: float) -> None:
        if not address or self.backoff <= 0:
            return
        if address not in self._backoff and len(self._backoff) >= BACKOFF_SIZE:
            for gone in [a for a, until in self._backoff.items() if until <= now]:
                del self._backoff[gone]
        _remember(self._backoff, address, now + self.backoff, BACKOFF_SIZE)

    def _done(self, key: str, task: asyncio.Task[Peer]) -> None:
        self._running.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: every HELLO that waited for it may have gone

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.token_reviews.labels(self.metrics.node, result).inc()


V = TypeVar("V")


def _remember(cache: OrderedDict[str, V], key: str, value: V, size: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > size:
        cache.popitem(last=False)

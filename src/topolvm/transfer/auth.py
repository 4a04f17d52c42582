"""Who is asking: a receiver proves it is topolvm-node on a given node with the cluster's own
credentials, a projected ServiceAccount token for the transfer's audience (kubelet mounts and
rotates it), which the sender checks with a TokenReview.

:func:`check_review` is the rule (pure): the API server authenticated the token, for our
audience, as one of the accepted ServiceAccounts, and the token is bound to a pod (or a Node)
on a node, whose name the API server puts in ``user.extra``. The job's target node must be that
node (the sender's authoriser checks it).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient
from lightkube.models.authentication_v1 import TokenReviewSpec
from lightkube.resources.authentication_v1 import TokenReview

from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.transfer.errors import Refused

AUDIENCE = "topolvm-transfer"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
CACHE_SECONDS = 60.0  # a bound token dies with its pod; a minute of trust after that at most
CACHE_SIZE = 1024


@dataclass(frozen=True)
class Peer:
    username: str
    node: str


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def check_review(review: dict[str, Any], audience: str, accounts: Collection[str]) -> Peer:
    status = _mapping(review.get("status"))
    if status.get("authenticated") is not True:
        why = status.get("error") or "the API server did not authenticate it"
        raise Refused("unauthenticated", f"the token is not valid: {why}")
    audiences = status.get("audiences")
    if not isinstance(audiences, list) or audience not in audiences:
        raise Refused("unauthenticated", f"the token is not meant for the audience {audience!r}")
    user = _mapping(status.get("user"))
    username = user.get("username")
    username = username if isinstance(username, str) else ""
    if username not in accounts:
        raise Refused(
            "forbidden",
            f"{username or 'an anonymous user'} is not topolvm-node's ServiceAccount "
            f"({', '.join(sorted(accounts))})",
        )
    nodes = _mapping(user.get("extra")).get(NODE_NAME_KEY)
    node = nodes[0] if isinstance(nodes, list) and nodes and isinstance(nodes[0], str) else ""
    if not node:
        raise Refused(
            "forbidden",
            "the token is bound to no node: topolvm-node must present a projected token of "
            "its pod (or one bound to its Node)",
        )
    return Peer(username, node)


class TokenReviewer:
    """TokenReview with a short cache (tokens are reused for every connection of a copy)."""

    def __init__(
        self, client: AsyncClient, accounts: Collection[str], audience: str = AUDIENCE
    ) -> None:
        self.client = client
        self.accounts = frozenset(accounts)
        self.audience = audience
        self._cache: dict[str, tuple[float, Peer]] = {}

    async def peer(self, token: str) -> Peer:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        review = TokenReview(spec=TokenReviewSpec(token=token, audiences=[self.audience]))
        try:
            answer = await api.create(self.client, review)
        except kube.KubeError as e:
            raise Refused("unavailable", f"TokenReview failed: {kube.describe(e)}") from e
        peer = check_review(answer, self.audience, self.accounts)
        if len(self._cache) >= CACHE_SIZE:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        self._cache[key] = (now + CACHE_SECONDS, peer)
        return peer

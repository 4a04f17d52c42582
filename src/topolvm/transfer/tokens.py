"""The receiver's tokens: one per source node, for that node's audience only
(``topolvm-transfer:<node>``, :func:`~.auth.audience`), obtained with the TokenRequest API for
topolvm-node's own ServiceAccount and bound to its own pod (or, outside a pod, to its Node): the
API server then names this node in every review of it, and the token dies with the pod.

A token is kept for its source until four fifths of its life are gone, then a new one is
obtained; :meth:`TransferTokens.forget` drops one the sender refused. Tokens never reach a disk.
One TokenRequest per source at once (a lock per source: a TokenRequest that hangs delays that
source's copies alone), each given up after ``REQUEST_TIMEOUT`` seconds.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from dataclasses import dataclass

from lightkube import AsyncClient
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ServiceAccountToken

from topolvm.k8s import errors as kube
from topolvm.transfer.auth import audience
from topolvm.transfer.errors import NoToken

log = logging.getLogger(__name__)
TOKEN_SECONDS = 600  # the API server's least: a token shown is good for 10 minutes at most
RENEW_SHARE = 0.8  # of a token's life, after which a new one is obtained
KEPT = 256  # sources
REQUEST_TIMEOUT = 30.0  # seconds a TokenRequest may take


@dataclass(frozen=True)
class Bearer:
    """Whose tokens this node shows: ``namespace``/``account``, bound to the object ``kind``
    (``Pod`` or ``Node``) ``name`` (its ``uid``, when known)."""

    namespace: str
    account: str
    kind: str
    name: str
    uid: str = ""

    def describe(self) -> str:
        return f"{self.namespace}/{self.account} (bound to {self.kind} {self.name})"


class TransferTokens:
    def __init__(
        self, client: AsyncClient, bearer: Bearer | None, seconds: int = TOKEN_SECONDS,
        timeout: float = REQUEST_TIMEOUT,
    ) -> None:  # fmt: skip
        """``bearer`` None: no account is known (not in a pod, none given); every copy from
        another node then waits, saying so."""
        self.client = client
        self.bearer = bearer
        self.seconds = seconds
        self.timeout = timeout
        self._tokens: dict[str, tuple[float, str]] = {}  # source node -> (renew at, token)
        self._locks: dict[str, asyncio.Lock] = {}  # source node -> its TokenRequest's
        self._users: dict[str, int] = {}  # source node -> callers holding or awaiting its lock

    async def token(self, node: str) -> str:
        """A token for ``node``'s transfer port (:class:`NoToken` if none can be obtained)."""
        lock = self._locks.get(node)
        if lock is None:
            if len(self._locks) >= KEPT:  # those no one holds or waits for go
                self._locks = {n: k for n, k in self._locks.items() if self._users.get(n)}
            lock = self._locks[node] = asyncio.Lock()
        self._users[node] = self._users.get(node, 0) + 1
        try:
            async with lock:  # one TokenRequest per source at once; they are rare
                return await self._kept_or_new(node)
        finally:
            self._users[node] -= 1
            if not self._users[node]:
                del self._users[node]

    async def _kept_or_new(self, node: str) -> str:
        kept = self._tokens.get(node)
        now = time.monotonic()
        if kept is not None and kept[0] > now:
            return kept[1]
        token, life = await self._request(node)
        now = time.monotonic()
        self._tokens = {n: t for n, t in self._tokens.items() if t[0] > now}
        if len(self._tokens) >= KEPT:
            self._tokens.pop(next(iter(self._tokens)))
        self._tokens[node] = (now + life * RENEW_SHARE, token)
        return token

    def forget(self, node: str) -> None:
        """The sender refused the token: the next attempt obtains a new one."""
        self._tokens.pop(node, None)

    async def _request(self, node: str) -> tuple[str, float]:
        b = self.bearer
        if b is None:
            raise NoToken(
                f"no token for node {node}'s transfer port: no ServiceAccount to obtain one as "
                "(topolvm-node runs outside a pod: give --transfer-service-account)"
            )
        bound = BoundObjectReference(apiVersion="v1", kind=b.kind, name=b.name, uid=b.uid or None)
        spec = TokenRequestSpec(audiences=[audience(node)], expirationSeconds=self.seconds,
                                boundObjectRef=bound)  # fmt: skip
        try:
            async with asyncio.timeout(self.timeout):
                with kube.translated():
                    request = ServiceAccountToken(
                        metadata=ObjectMeta(name=b.account, namespace=b.namespace), spec=spec
                    )
                    made = await self.client.create(request, name=b.account,
                                                    namespace=b.namespace)  # fmt: skip
        except TimeoutError:
            raise NoToken(
                f"no token for node {node}'s transfer port: TokenRequest as {b.describe()} "
                f"took more than {self.timeout:g}s"
            ) from None
        except kube.KubeError as e:
            hint = ""
            if isinstance(e, kube.Forbidden):
                hint = (
                    f" (topolvm-node's ServiceAccount needs create on serviceaccounts/token of "
                    f"{b.account} in {b.namespace}: the chart's Role with node.transfer.enabled; "
                    "and the chart's admission policy lets it make tokens only with credentials "
                    "that name its node: its pod's token, or outside a pod a token bound to its "
                    "Node)"
                )
            raise NoToken(
                f"no token for node {node}'s transfer port: TokenRequest as {b.describe()} "
                f"failed: {kube.describe(e)}{hint}"
            ) from e
        status = made.status
        if status is None or not status.token:
            raise NoToken(f"no token for node {node}'s transfer port: TokenRequest gave none")
        life = float(self.seconds)
        expires = status.expirationTimestamp
        if isinstance(expires, datetime.datetime):  # the API server may shorten it
            left = (expires - datetime.datetime.now(datetime.UTC)).total_seconds()
            life = max(0.0, min(life, left))
        log.debug("transfer token obtained", extra={"source_node": node, "seconds": life})
        return status.token, life

"""Lease-based leader election (coordination.k8s.io/v1), like client-go's leaderelection.

One :class:`LeaderElector` per replica competes for a ``Lease``. The holder renews it every
``retry_period``; the others take it over once the record has not changed for the lease
duration, judged by the local clock from the moment this elector last *observed* a change
(as client-go does, so clock skew between replicas does not matter). Every write is an
optimistic-concurrency replace carrying the ``resourceVersion`` that was read: a 409 means
another replica wrote first. A leader that cannot renew within ``renew_deadline`` (or that
observes another holder) steps down: its work is cancelled and :meth:`LeaderElector.run`
raises :class:`LeadershipLost`. A clean shutdown (:meth:`LeaderElector.release` or
cancelling ``run``) releases the lease so another replica takes over at once.

Durations should satisfy ``lease_duration > renew_deadline > retry_period``; the lease
records ``leaseDurationSeconds`` as a whole number of seconds (at least 1).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from lightkube import AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from topolvm.k8s.errors import Conflict, KubeError, NotFound, translated

logger = logging.getLogger(__name__)

_JITTER = 1.2  # acquire retries wait retry_period * [1, 1.2), like client-go's JitterFactor


class LeadershipLost(Exception):
    """Raised by :meth:`LeaderElector.run` when the lease could not be kept."""


def _micro_now() -> datetime:
    # A MicroTime always has six fraction digits on the wire; the JSON encoder drops a zero
    # fraction, which the apiserver's RFC3339Micro parser would reject.
    now = datetime.now(UTC)
    return now if now.microsecond else now.replace(microsecond=1)


_Record = tuple[str, int | None, datetime | None, datetime | None, int | None]


def _record(spec: LeaseSpec | None) -> _Record:
    s = spec or LeaseSpec()
    return (
        s.holderIdentity or "",
        s.leaseDurationSeconds,
        s.acquireTime,
        s.renewTime,
        s.leaseTransitions,
    )


class LeaderElector:
    """Competes for the ``Lease`` ``namespace/name`` under ``identity``."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
    ) -> None:
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError("need lease_duration > renew_deadline > retry_period > 0")
        self._client = client
        self._name = name
        self._namespace = namespace
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._lease: Lease | None = None  # as last read or written (carries resourceVersion)
        self._observed: _Record | None = None
        self._observed_at = 0.0  # loop.time() when _observed last changed
        self._leading = False
        self._running = False
        self._stopping = asyncio.Event()
        self._finished = asyncio.Event()

    @property
    def is_leader(self) -> bool:
        """True while this elector holds the lease and has not lost it."""
        return self._leading

    @property
    def _ctx(self) -> dict[str, str]:
        return {"lease": f"{self._namespace}/{self._name}", "identity": self.identity}

    # -- public API ------------------------------------------------------------

    async def run(self, on_started_leading: Callable[[], Awaitable[None]]) -> None:
        """Acquire the lease, then run ``on_started_leading()`` as a task while leading.

        Returns after :meth:`release` or when the callback returns (the lease is released);
        re-raises the callback's exception (after releasing); raises :class:`LeadershipLost`
        (after cancelling the callback) when the lease could not be renewed. Cancelling
        ``run`` cancels the callback and releases the lease.
        """
        if self._running:
            raise RuntimeError("LeaderElector.run is already running")
        self._running = True
        self._stopping.clear()
        self._finished.clear()
        task: asyncio.Future[None] | None = None
        try:
            if not await self._acquire():
                return
            task = asyncio.ensure_future(on_started_leading())
            await self._renew_loop(task)
            if task.done():
                task.result()  # re-raise the callback's failure
        finally:
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            try:
                await self._release_lease()
            finally:
                self._running = False
                self._finished.set()

    async def release(self) -> None:
        """Stop leading (cancelling the callback of a running :meth:`run`) and release."""
        self._stopping.set()
        if self._running:
            await self._finished.wait()
        else:
            await self._release_lease()

    # -- loops -------------------------------------------------------------------

    async def _wait_stopping(
        self, timeout: float, task: asyncio.Future[None] | None = None
    ) -> None:
        waiters: set[asyncio.Future[Any]] = {asyncio.ensure_future(self._stopping.wait())}
        if task is not None:
            waiters.add(task)
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                if w is not task:
                    w.cancel()

    async def _acquire(self) -> bool:
        logger.info("waiting to acquire the leader lease", extra=self._ctx)
        while not self._stopping.is_set():
            if await self._attempt(self.renew_deadline):
                self._leading = True
                logger.info("acquired the leader lease", extra=self._ctx)
                return True
            await self._wait_stopping(self.retry_period * random.uniform(1.0, _JITTER))
        return False

    async def _renew_loop(self, task: asyncio.Future[None]) -> None:
        loop = asyncio.get_running_loop()
        last_renew = loop.time()
        while True:
            await self._wait_stopping(self.retry_period, task)
            if self._stopping.is_set() or task.done():
                return
            remaining = last_renew + self.renew_deadline - loop.time()
            if remaining > 0 and await self._attempt(remaining):
                last_renew = loop.time()
                continue
            holder = self._observed[0] if self._observed else ""
            if holder and holder != self.identity:
                self._lose(f"the lease is now held by {holder!r}")
            if loop.time() - last_renew >= self.renew_deadline:
                self._lose(f"failed to renew the lease within {self.renew_deadline}s")

    def _lose(self, why: str) -> None:
        self._leading = False
        logger.warning("lost the leader lease: %s", why, extra=self._ctx)
        raise LeadershipLost(f"{self._namespace}/{self._name}: {why}")

    # -- one attempt -------------------------------------------------------------

    async def _attempt(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                return await self._try_acquire_or_renew()
        except TimeoutError:
            logger.warning("leader lease request timed out", extra=self._ctx)
        except Conflict as e:
            logger.info("leader lease write conflicted: %s", e.message, extra=self._ctx)
        except KubeError as e:
            logger.warning("leader lease request failed: %s", e, extra=self._ctx)
        except Exception as e:  # any client failure only fails this attempt
            logger.warning("leader lease request failed: %r", e, extra=self._ctx)
        return False

    def _observe(self, lease: Lease) -> None:
        self._lease = lease
        record = _record(lease.spec)
        if record != self._observed:
            self._observed = record
            self._observed_at = asyncio.get_running_loop().time()

    def _valid(self) -> bool:
        duration = (self._observed[1] if self._observed else None) or self.lease_duration
        return self._observed_at + duration > asyncio.get_running_loop().time()

    def _spec(self, now: datetime, acquired: datetime, transitions: int) -> LeaseSpec:
        return LeaseSpec(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, math.ceil(self.lease_duration)),
            acquireTime=acquired,
            renewTime=now,
            leaseTransitions=transitions,
        )

    async def _try_acquire_or_renew(self) -> bool:
        now = _micro_now()
        try:
            with translated():
                lease = await self._client.get(Lease, self._name, namespace=self._namespace)
        except NotFound:
            new = Lease(
                metadata=ObjectMeta(name=self._name, namespace=self._namespace),
                spec=self._spec(now, now, 0),
            )
            with translated():
                self._observe(await self._client.create(new))
            return True
        self._observe(lease)
        spec = lease.spec or LeaseSpec()
        holder = spec.holderIdentity or ""
        if holder and holder != self.identity and self._valid():
            return False
        if holder == self.identity:
            acquired, transitions = spec.acquireTime or now, spec.leaseTransitions or 0
        else:
            acquired, transitions = now, (spec.leaseTransitions or 0) + 1
            logger.info("taking over the leader lease from %r", holder, extra=self._ctx)
        lease.spec = self._spec(now, acquired, transitions)
        with translated():
            self._observe(await self._client.replace(lease))
        return True

    async def _release_lease(self) -> None:
        if not self._leading or self._lease is None:
            return
        self._leading = False
        lease, now = self._lease, _micro_now()
        lease.spec = LeaseSpec(
            holderIdentity="",
            leaseDurationSeconds=1,
            acquireTime=now,
            renewTime=now,
            leaseTransitions=(self._observed[4] if self._observed else None) or 0,
        )
        try:
            async with asyncio.timeout(self.renew_deadline):
                self._observe(await self._client.replace(lease))
            logger.info("released the leader lease", extra=self._ctx)
        except Exception as e:
            logger.warning("could not release the leader lease: %r", e, extra=self._ctx)

"""topolvm-node's sending side of the node-to-node copy (docs/mobility.md): its transfer port,
the check of every job asked for there, and the cuts it makes for them.

The port's address and its certificate's fingerprint go on this node's Node object
(``<plugin>/transfer-endpoint``, ``<plugin>/transfer-cert-sha256``), where receivers find and
pin them. A job is the target LogicalVolume a receiver names; it is served only if:

- its token is topolvm-node's ServiceAccount, for this node's transfer audience
  (``topolvm-transfer:<node>``: a token shown to another node is refused), bound to a node
  (TokenReview), and the target is on that very node;
- the target exists with the UID the receiver gave, is a copy (``spec.copy.source``) not done
  yet and not being deleted (else: unknown or replayed);
- its source LogicalVolume is on this node and holds its data.

A snapshot (``accessType: ro``) is read as it is; a live volume through a cut made for the job.
A move's copy (``spec.copy.keepCut``) keeps its cut after round 1; its round 2 reads a second
cut and sends only what differs from the first; both go when round 2 is done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Coroutine
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from topolvm.constants import Names
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import InvalidQuantity, LogicalVolumeObject
from topolvm.k8s.runtime import Informer
from topolvm.node.finalcut import MOVE_COW_SHARE, FinalCuts
from topolvm.node.orphans import copy_running
from topolvm.node.volumes import (
    CutOverflowed,
    Cuts,
    LvmdVolumes,
    NoRoomForCut,
    job_of_round,
)
from topolvm.transfer import messages
from topolvm.transfer.auth import TokenReviewer, audience
from topolvm.transfer.errors import Refused, TransferError
from topolvm.transfer.jobs import Job, Limits
from topolvm.transfer.metrics import TransferMetrics
from topolvm.transfer.server import TransferServer

log = logging.getLogger(__name__)
DROP_ATTEMPTS, DROP_RETRY_FIRST, DROP_RETRY_MAX = 8, 1.0, 30.0  # a cut lvmd cannot remove yet
QUIET_MOST, QUIET_POLL = 60.0, 0.2  # an ended job's cuts wait for the node's copies this long


class TransferService:
    def __init__(
        self, client: AsyncClient, names: Names, node: str, volumes: LvmdVolumes, cuts: Cuts,
        limits: Limits, metrics: TransferMetrics, accounts: Collection[str],
    ) -> None:  # fmt: skip
        self.client = client
        self.names = names
        self.node = node
        self.cuts = cuts
        self.resource = api.logicalvolume_resource(names)
        self.final = FinalCuts(cuts, volumes, node, self._spawn)
        # tokens made for this node's port alone: one shown elsewhere is refused here
        self.reviewer = TokenReviewer(client, accounts, audience(node), metrics)
        self.server = TransferServer(node, self.authorise, volumes, limits, metrics)
        self._cleanups: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int, advertise: str) -> None:
        await self.server.start(host, port)
        endpoint = f"{advertise}:{self.server.port}"
        if ":" in advertise:
            endpoint = f"[{advertise}]:{self.server.port}"
        features = [messages.SENDER_CPU, messages.STREAMS]
        if self.server.limits.compress:
            features.append(messages.COMPRESS)
        ann = {self.names.transfer_endpoint_annotation: endpoint,
               self.names.transfer_cert_annotation: self.server.fingerprint,
               self.names.transfer_features_annotation:
                   messages.publish_features(self.server.fingerprint, features)}  # fmt: skip
        patch = {"metadata": {"annotations": ann}}
        # transient API trouble at start-up is waited out, not a reason to fail the daemon
        what = f"publishing the transfer endpoint on Node {self.node}"
        await api.retry_transient(
            lambda: api.patch_merge(self.client, Node, self.node, patch), what
        )
        log.info("transfer port serving", extra={"endpoint": endpoint, "node": self.node})

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """``work`` in the background, cancelled at :meth:`stop`."""
        task = asyncio.create_task(work)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def stop(self) -> None:
        await self.server.stop()
        for task in list(self._cleanups):
            task.cancel()
        await asyncio.gather(*self._cleanups, return_exceptions=True)

    # -- authorisation ------------------------------------------------------------------

    async def _lv(self, name: str) -> LogicalVolumeObject | None:
        try:
            obj = await api.get(self.client, self.resource, name)
        except kube.KubeError as e:
            raise Refused("unavailable", f"cannot read LogicalVolume {name}: {e}") from e
        try:
            return None if obj is None else LogicalVolumeObject.from_dict(obj)
        except (InvalidQuantity, KeyError, TypeError, ValueError) as e:
            raise Refused("unknown-job", f"LogicalVolume {name} is malformed: {e}") from e

    async def authorise(self, hello: messages.Hello) -> Job:
        peer = await self.reviewer.peer(hello.token)
        target = await self._lv(hello.job)
        if target is None or target.uid != hello.job_uid:
            raise Refused("unknown-job", f"no LogicalVolume {hello.job} of UID {hello.job_uid}")
        if not target.copy_source:
            raise Refused("unknown-job", f"LogicalVolume {hello.job} is not filled by a copy")
        if target.deleting or target.copy_done:
            done = "is being deleted" if target.deleting else "is filled already"
            raise Refused("replayed", f"LogicalVolume {hello.job} {done}")
        if target.node_name != peer.node:
            raise Refused(
                "forbidden",
                f"LogicalVolume {hello.job} is filled on node {target.node_name}; the token "
                f"belongs to node {peer.node}",
            )
        source = await self._lv(target.copy_source)
        if source is None or source.node_name != self.node:
            where = "gone" if source is None else f"on node {source.node_name}"
            raise Refused("unknown-job", f"the source {target.copy_source} is {where}, not here")
        if not source.ready:
            raise Refused("unavailable", f"the source {source.name} holds no data yet")
        volume, base = source.volume_id, ""
        if source.access_type != "ro":  # a live volume: read a cut of it, made for this job
            try:
                volume, base = await self._cut(target, source)
            except Refused:
                raise
            except TransferError as e:
                raise Refused("unavailable", str(e)) from e
        return Job(target.uid, target.name, target.node_name, volume, source.device_class,
                   source.name, base=base)  # fmt: skip

    async def _cut(
        self, target: LogicalVolumeObject, source: LogicalVolumeObject
    ) -> tuple[str, str]:
        """The cut to read, and the base of a delta: a move's round 2 reads a second cut and
        sends what differs from the first (kept since round 1). Round 2 is always a delta: the
        target holds round 1's data, so a whole copy (which skips zeros) would leave some of it;
        without the first cut the job is refused for good, its copy fails and the move rolls
        back (its original untouched)."""
        dc = source.device_class
        try:
            return await self._cuts(target, source, dc)
        except (NoRoomForCut, CutOverflowed) as e:
            if not target.copy_keep_cut:
                raise  # a restore or clone waits for room
            # a move fails its copy now and rolls back, rather than keep its pod down waiting
            raise Refused("invalid", f"{e}: the move rolls back") from e

    async def _cuts(
        self, target: LogicalVolumeObject, source: LogicalVolumeObject, dc: str
    ) -> tuple[str, str]:
        """A move's thick cuts may be smaller than their origin on a node without room for
        whole ones (:data:`MOVE_COW_SHARE`); one that overflowed fails the copy."""
        size = source.current_size or source.size
        keep = target.copy_keep_cut
        if target.copy_round < 2:
            first = await self.cuts.ensure(target.uid, source.volume_id, dc,
                                           size // MOVE_COW_SHARE[0] if keep else 0)  # fmt: skip
            if keep:
                await self.cuts.check(target.uid, dc)  # a job resumed after its reads failed
            return first, ""
        return await self.final.for_copy(target, source)

    # -- cuts -----------------------------------------------------------------------------

    def watch(self, informer: Informer) -> None:
        """Remove a cut once its job's target is filled, failed or gone: at once, and again
        after a while if lvmd cannot yet (the sending thread still has it open). A cut made
        for the job after that (its receiver asked just before) goes at once too
        (:meth:`Cuts.end`). Only the cuts this process made or found are known here; others
        (made before a restart) go with the next sweep."""

        def on_event(event: str, obj: api.Obj) -> None:
            spec = obj.get("spec") or {}
            if not (spec.get("copy") or {}).get("source") and not (obj.get("status") or {}).get(
                "copy"
            ):  # fmt: skip
                return
            try:
                target = LogicalVolumeObject.from_dict(obj)
            except (InvalidQuantity, KeyError, TypeError, ValueError):
                return
            if event != "DELETED" and copy_running(target):
                return
            jobs = self.cuts.end(target.uid)  # no cut is made for it any more
            self.final.forget(target.uid)
            if jobs or not self.cuts.learnt(target.device_class):
                self._spawn(self._drop_cuts(target))

        informer.add_handler(on_event)

    async def _quiet(self) -> None:
        """Until this node sends nothing and makes no final cut (for :data:`QUIET_MOST` s at
        most): lvmd runs one command at a time, and a cut's removal there held up the final
        copy of a claim moved with the one whose copy ended (0.5 s in the test bed)."""
        for _ in range(int(QUIET_MOST / QUIET_POLL)):
            if not (self.server.sending or self.final.working):
                return
            await asyncio.sleep(QUIET_POLL)

    async def _drop_cuts(self, target: LogicalVolumeObject) -> None:
        """Remove the cuts of ``target``'s ended job that this node holds (learning first, once
        per device class, those made before it started), trying again while lvmd cannot."""
        if not self.cuts.learnt(target.device_class):
            try:
                await self.cuts.learn(target.device_class)
            except TransferError as e:
                ctx = {"device_class": target.device_class, "error": str(e)}
                log.warning("cannot list this node's cuts; the sweep removes them later", extra=ctx)
        jobs = self.cuts.end(target.uid)
        if not jobs:
            return
        await self._quiet()
        delay = DROP_RETRY_FIRST
        for attempt in range(1, DROP_ATTEMPTS + 1):
            failed = []
            for job, dc in jobs:
                try:
                    await self.cuts.remove(job, dc)
                except TransferError as e:
                    failed.append((job, dc))
                    log.warning("a copy's cut cannot be removed yet", extra={
                        "target": target.name, "job": job, "device_class": dc, "error": str(e),
                        "attempt": attempt, "retry_in": delay})  # fmt: skip
            if not failed:
                if attempt > 1:
                    log.info("a copy's cut removed at last", extra={
                        "target": target.name, "attempt": attempt})  # fmt: skip
                return
            jobs = failed
            await asyncio.sleep(delay)
            delay = min(delay * 2, DROP_RETRY_MAX)
        log.error("a copy's cut stays after every attempt; the sweep tries again",
                  extra={"target": target.name, "jobs": [j for j, _ in jobs]})  # fmt: skip

    async def sweep(self, device_classes: Collection[str]) -> None:
        """Remove cuts whose job is over (its target filled, failed or gone): what a node that
        was down when the job ended left. The cuts are listed first: a job that starts after the
        list of LogicalVolumes would otherwise lose the cut it just made."""
        cuts = {dc: await self.cuts.listed(dc) for dc in device_classes}
        try:
            items, _ = await api.list_all(self.client, self.resource)
        except kube.KubeError as e:
            log.warning("cut sweep skipped", extra={"error": kube.describe(e)})
            return
        running = set()
        for obj in items:
            try:
                lv = LogicalVolumeObject.from_dict(obj)
            except (InvalidQuantity, KeyError, TypeError, ValueError):
                # unreadable here: its cuts are kept (what cannot be judged is not removed)
                running.add(str((obj.get("metadata") or {}).get("uid") or ""))
                continue
            if copy_running(lv):
                running.add(lv.uid)
        for dc, jobs in cuts.items():
            for job in jobs:
                if job_of_round(job) in running:
                    continue
                self.cuts.end(job_of_round(job))
                try:
                    await self.cuts.remove(job, dc)
                except TransferError as e:
                    log.warning("the sweep cannot remove a cut whose job ended", extra={
                        "job": job, "device_class": dc, "error": str(e)})  # fmt: skip

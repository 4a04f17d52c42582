"""topolvm-node's receiving side of a copy (docs/mobility.md): it fills this node's
LogicalVolumes that a copy fills, from another node's transfer port or from a volume here.

One job per target: it waits for a free slot (``limits.concurrency`` per node), reads the
source (its node, or this one), copies from the target's last checkpoint, and reports in the
target's ``status.copy``: phase, bytes, rate, the checkpoint after every sync, and at the end
the verified digest with phase Done (then the controller hands the volume out). Progress also
goes to Events on the claim (or VolumeSnapshot) that waits, and to metrics. A source that
cannot be reached is tried again with backoff, saying which node and why; a copy whose data
does not verify, or whose source is gone, fails: ``status.code`` tells the controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from topolvm.constants import Names
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import CopyPhase, CopyStatus, LogicalVolumeObject
from topolvm.k8s.stamps import now
from topolvm.node.copyreport import CopyReporter, Run, SourceGone, connecting
from topolvm.node.volumes import Cuts, LvmdVolumes
from topolvm.transfer import client, messages, pipeline, plan, streams
from topolvm.transfer.auth import older_sender
from topolvm.transfer.blockio import Volume
from topolvm.transfer.errors import (
    CopyImpossible,
    Refused,
    SourceFailed,
    TransferError,
    Unreachable,
)
from topolvm.transfer.jobs import Limits, VolumeInfo
from topolvm.transfer.metrics import TransferMetrics
from topolvm.transfer.tokens import TransferTokens
from topolvm.units import human

log = logging.getLogger(__name__)
GiB = 1 << 30


@dataclass(frozen=True)
class CopyOptions:
    limits: Limits
    retry_first: float = 2.0
    retry_max: float = 60.0


class CopyJobs:
    def __init__(
        self, client: AsyncClient, names: Names, node: str, volumes: LvmdVolumes, cuts: Cuts,
        options: CopyOptions, metrics: TransferMetrics, tokens: TransferTokens,
    ) -> None:  # fmt: skip
        self.client = client
        self.names = names
        self.node = node
        self.volumes = volumes
        self.cuts = cuts
        self.options = options
        self.metrics = metrics
        self.tokens = tokens  # what this node shows each source's transfer port
        self.resource = api.logicalvolume_resource(names)
        self.report = CopyReporter(client, names, node, metrics)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(options.limits.concurrency)
        self._pool = ThreadPoolExecutor(
            max_workers=options.limits.concurrency + 1, thread_name_prefix="transfer-recv"
        )

    # -- the reconciler's side ----------------------------------------------------------

    def ensure(self, lv: LogicalVolumeObject) -> None:
        """A job fills ``lv`` (started now unless one runs)."""
        task = self._tasks.get(lv.name)
        if task is not None and not task.done():
            return
        self._tasks[lv.name] = asyncio.create_task(self._job(lv.name), name=f"copy-{lv.name}")

    async def cancel(self, name: str) -> None:
        """Stop the job of ``name`` and wait until its thread no longer writes."""
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def drop_cut(self, lv: LogicalVolumeObject) -> None:
        """The cut a copy on this node made for ``lv`` (if any), which is going."""
        with contextlib.suppress(TransferError):
            await self.cuts.remove(lv.uid, lv.device_class)

    async def stop(self) -> None:
        for name in list(self._tasks):
            await self.cancel(name)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- one job --------------------------------------------------------------------------

    async def _job(self, name: str) -> None:
        delay = self.options.retry_first
        while True:
            try:
                lv = await self.report.read(name)
            except kube.KubeError as e:
                log.warning(
                    "copy: cannot read its LogicalVolume", extra={"lv": name, "error": str(e)}
                )
                await asyncio.sleep(delay)
                continue
            if lv is None or lv.deleting or lv.copy_done or lv.code or not lv.volume_id:
                return
            try:
                await self._attempt(lv)
                return
            except TransferError as e:
                if await self._report_error(lv, e, delay):
                    return
            except kube.KubeError as e:
                log.warning("copy: API error", extra={"lv": name, "error": kube.describe(e)})
            except Exception:  # a defect: logged with its traceback, and the job goes on
                log.exception("copy: unexpected error", extra={"lv": name})
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.options.retry_max)

    async def _report_error(self, lv: LogicalVolumeObject, e: TransferError, delay: float) -> bool:
        """Report a failed attempt; True if the job is over (it failed for good)."""
        try:
            if not e.transient:
                await self.report.failed(lv, e)
                return True
            await self.report.waiting(lv, e, delay)
        except kube.KubeError as k:
            log.warning("copy: cannot report", extra={"lv": lv.name, "error": kube.describe(k),
                                                      "copy_error": str(e)})  # fmt: skip
        return False

    async def _attempt(self, lv: LogicalVolumeObject) -> None:
        source_name = lv.copy_source or lv.source
        source = await self.report.read(source_name)
        if source is None:
            raise SourceGone(f"the source LogicalVolume {source_name} is gone")
        if not source.ready:
            raise SourceFailed(f"the source {source_name} holds no data yet")
        target = await self.volumes.describe(lv.volume_id, lv.device_class)
        prior = lv.copy or CopyStatus()
        if LogicalVolumeObject.copy_round_of(prior) != lv.copy_round:  # a move's final copy
            prior = CopyStatus(round=lv.copy_round, source_node=prior.source_node)
        waiting = self._slots.locked()
        if waiting:
            await self.report.write(
                lv,
                replace(
                    prior,
                    message=f"queued: node {self.node} runs "
                    f"{self.options.limits.concurrency} copies already",
                ),
            )
        async with self._slots:
            if source.node_name == self.node:
                await self._local(lv, source, target, prior)
            else:
                await self._remote(lv, source, target, prior)

    def _resume(self, prior: CopyStatus) -> client.Checkpoint | None:
        if not prior.checkpoint_digest or not prior.source_id or not prior.checkpoint_offset:
            return None
        try:
            return client.Checkpoint(
                prior.checkpoint_offset, bytes.fromhex(prior.checkpoint_digest), prior.source_id
            )
        except ValueError:
            return None

    def _parts(
        self, lv: LogicalVolumeObject, source: LogicalVolumeObject, target: VolumeInfo,
        prior: CopyStatus, endpoint: client.Endpoint,
    ) -> streams.Parts | None:  # fmt: skip
        """The streams a copy is received in (None: one): a large volume's first copy from a
        sender that serves parts, split as its earlier attempt was (its checkpoints hold)."""
        unit = plan.part_unit(target.chunk)
        if (messages.STREAMS not in endpoint.features or lv.copy_round >= 2 or not unit
                or (prior.checkpoint_digest and not prior.part_count)):  # fmt: skip
            return None
        if prior.part_count > 1 and prior.part_unit == unit:
            return streams.Parts(prior.part_count, unit)
        size = source.current_size or source.size
        count = plan.parts_for(size, self.options.limits.streams, unit)
        return streams.Parts(count, unit) if count > 1 else None

    async def _remote(
        self, lv: LogicalVolumeObject, source: LogicalVolumeObject, target: VolumeInfo,
        prior: CopyStatus,
    ) -> None:  # fmt: skip
        endpoint = await self._endpoint(source.node_name)
        token = await self.tokens.token(source.node_name)
        parts = self._parts(lv, source, target, prior, endpoint)
        resume = self._resume(prior) if parts is None else None
        hello = messages.Hello(
            version=messages.VERSION,
            token=token,
            job=lv.name,
            job_uid=lv.uid,
            resume=None
            if resume is None
            else messages.Resume(
                offset=resume.offset, digest=resume.digest.hex(), source_id=resume.source_id
            ),
            features=tuple(sorted(endpoint.features)),
        )
        split = (prior.part_count, prior.part_unit)
        kept = prior.part_checkpoints if parts and split == (parts.count, parts.unit) else ()
        status = replace(
            prior,
            phase=CopyPhase.COPYING,
            source_node=source.node_name,
            attempts=prior.attempts + 1,
            start_time=prior.start_time or now(),
            message=connecting(prior, source.node_name),
            part_count=0 if parts is None else parts.count,
            part_unit=0 if parts is None else parts.unit,
            part_checkpoints=kept,
        )
        await self.report.write(lv, status)
        run = Run(lv, status, time.monotonic(), prior.transferred_bytes,
                  base_wire=prior.wire_bytes)  # fmt: skip
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        timeout = self.options.limits.io_timeout

        def accepted(accept: messages.Accept) -> None:
            self.report.accepted_soon(run, accept, loop)

        # a move's final copy writes over round 1's data: a whole copy (no delta) discards that
        # first
        fresh = prior.attempts == 0 and lv.copy_round < 2

        def work() -> client.Outcome:
            if parts is not None:
                resumes = {p.index: streams.PartPoint(p.begin, p.end, client.Checkpoint(
                               p.offset, bytes.fromhex(p.digest), p.source_id))
                           for p in kept if p.source_id and _hex256(p.digest)
                           and 0 <= p.index < parts.count}  # fmt: skip
                return streams.receive_parts(
                    endpoint, hello, target, parts, resumes,
                    self.report.part_persister(run, loop), self.report.progress(run), stop,
                    timeout, accepted, fresh=fresh,
                )  # fmt: skip
            return client.receive(
                endpoint,
                hello,
                target,
                self.report.persister(run, loop),
                self.report.progress(run),
                stop,
                timeout,
                accepted,
                fresh=fresh,
            )

        try:
            outcome = await self._in_thread(work, stop)
        except Refused as r:
            if r.reason != "unauthenticated":
                raise
            self.tokens.forget(source.node_name)  # the next attempt obtains a new one
            if not older_sender(r.message):  # expired, invalid: the new token will do
                raise
            raise Refused(r.reason, f"{r.message} (this node showed a token for node "
                          f"{source.node_name}'s transfer port alone; a topolvm-node of an older "
                          "release there accepts only the audience topolvm-transfer that nodes "
                          "used to share: upgrade it)") from r  # fmt: skip
        finally:
            await self.report.settle(run)  # what comes next (done, waiting) is written after it
        await self.report.done(run, outcome.digest, outcome.accept.source, outcome)

    async def _local(
        self, lv: LogicalVolumeObject, source: LogicalVolumeObject, target: VolumeInfo,
        prior: CopyStatus,
    ) -> None:  # fmt: skip
        volume = source.volume_id
        if source.access_type != "ro":
            volume = await self.cuts.ensure(lv.uid, source.volume_id, source.device_class)
        info = await self.volumes.describe(volume, source.device_class, with_uuid=True)
        mapped = await self.volumes.mapped(volume, source.device_class) if info.thin else None
        resume = self._resume(prior)
        if resume is not None and (resume.source_id != info.uuid or resume.offset > info.size):
            resume = None
        start = resume.offset if resume is not None else 0
        kind = "its mapped blocks" if mapped is not None else "read whole"
        status = replace(
            prior,
            phase=CopyPhase.COPYING,
            source_node=self.node,
            source_id=info.uuid,
            total_bytes=info.size,
            attempts=prior.attempts + 1,
            resumed_from=start,
            start_time=prior.start_time or now(),
            message=f"copying {source.name} on this node ({kind})",
        )
        await self.report.write(lv, status)
        await self.report.event(
            lv,
            "CopyStarted",
            f"copying {human(info.size)} from {source.name} "
            f"on this node ({kind}), from offset {start}",
        )
        run = Run(lv, status, time.monotonic(), prior.transferred_bytes, position=start)
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        persist = self.report.persister(run, loop)
        progress = self.report.progress(run)
        limits = self.options.limits

        def work() -> bytes:
            if target.size < info.size:
                raise CopyImpossible(f"the target ({target.size} bytes) is smaller than the source")
            reader = Volume(info.path, writable=False)
            writer: Volume | None = None
            try:
                writer = Volume(target.path, writable=True)
                pieces = (
                    plan.mapped(info.size, mapped, start)
                    if mapped is not None
                    else plan.full(info.size, start)
                )
                src = pipeline.RecordSource(
                    reader, info.size, pieces, start, resume.digest if resume else None
                )

                def checkpoint(offset: int, digest: bytes) -> None:
                    persist(client.Checkpoint(offset, digest, info.uuid))

                sink = pipeline.RecordSink(
                    writer,
                    info.size,
                    target.size,
                    target.chunk,
                    checkpoint,
                    start,
                    resume.digest if resume else None,
                    fresh=prior.attempts == 0,
                )
                counts = sink.counts
                sink.on_progress = lambda pos: progress(pos, info.size, counts.data_bytes, 0)
                return pipeline.copy_local(src, sink, stop, pipeline.Throttle(limits.bandwidth))
            finally:
                reader.close()
                if writer is not None:
                    writer.close()

        digest = await self._in_thread(work, stop)
        if source.access_type != "ro":  # the data is synced: the cut goes before Done says so
            # (a volume handed out leaves nothing behind; the sweep takes one lvmd kept)
            with contextlib.suppress(TransferError):
                await self.cuts.remove(lv.uid, source.device_class)
        await self.report.done(run, digest, f"{source.name} on this node")

    async def _in_thread(self, work: Any, stop: threading.Event) -> Any:
        """``work`` in a worker thread; cancelled, it is told to stop and waited for: it
        writes the target, which the next attempt writes too."""
        future = asyncio.get_running_loop().run_in_executor(self._pool, work)
        self.metrics.active.labels(self.node, "receiver").inc()
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            stop.set()  # the thread stops at its next record; wait for it, it writes the LV
            with contextlib.suppress(Exception):
                await asyncio.wait_for(future, self.options.limits.io_timeout + 10)
            raise
        finally:
            self.metrics.active.labels(self.node, "receiver").dec()

    # -- where from -----------------------------------------------------------------------

    async def _endpoint(self, node: str) -> client.Endpoint:
        obj = await api.get(self.client, Node, node)
        if obj is None:
            raise Unreachable(f"the source node {node} is gone (no Node object)")
        ann = obj.get("metadata", {}).get("annotations") or {}
        address = ann.get(self.names.transfer_endpoint_annotation, "")
        fingerprint = ann.get(self.names.transfer_cert_annotation, "")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not fingerprint:
            raise Unreachable(
                f"node {node} publishes no transfer endpoint: its topolvm-node does not run, "
                "or runs without the transfer port"
            )
        published = ann.get(self.names.transfer_features_annotation, "")
        offered = messages.honoured(published, fingerprint)
        return client.Endpoint(node, host.strip("[]"), int(port), fingerprint, offered)


def _hex256(text: str) -> bool:
    """A digest chain's value as status keeps it: 64 hex digits."""
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)

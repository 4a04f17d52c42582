"""topolvm-node's receiving side of a copy (docs/transfer.md): it fills this node's
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
import datetime
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from grpclib.const import Status
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from topolvm.constants import Names
from topolvm.k8s import api, events
from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import CopyPhase, CopyStatus, InvalidQuantity, LogicalVolumeObject
from topolvm.node.volumes import Cuts, LvmdVolumes
from topolvm.transfer import client, messages, pipeline, plan
from topolvm.transfer.blockio import Volume
from topolvm.transfer.errors import DigestMismatch, SourceFailed, TransferError, Unreachable
from topolvm.transfer.jobs import Limits, VolumeInfo
from topolvm.transfer.metrics import TransferMetrics

log = logging.getLogger(__name__)
GiB = 1 << 30


class CopyImpossible(TransferError):
    """What no retry mends: the copy fails, and its target with it."""

    transient = False


class SourceGone(CopyImpossible):
    pass


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


@dataclass(frozen=True)
class CopyOptions:
    limits: Limits
    token_file: str
    retry_first: float = 2.0
    retry_max: float = 60.0


@dataclass
class _Run:
    """What the worker thread reports while one attempt runs."""

    lv: LogicalVolumeObject
    status: CopyStatus
    started: float
    base_transferred: int
    position: int = 0
    data: int = 0
    last_event_quarter: int = 0


class CopyJobs:
    def __init__(
        self, client: AsyncClient, names: Names, node: str, volumes: LvmdVolumes, cuts: Cuts,
        options: CopyOptions, metrics: TransferMetrics,
    ) -> None:  # fmt: skip
        self.client = client
        self.names = names
        self.node = node
        self.volumes = volumes
        self.cuts = cuts
        self.options = options
        self.metrics = metrics
        self.resource = api.logicalvolume_resource(names)
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

    async def _read(self, name: str) -> LogicalVolumeObject | None:
        obj = await api.get(self.client, self.resource, name)
        try:
            return None if obj is None else LogicalVolumeObject.from_dict(obj)
        except (InvalidQuantity, KeyError, TypeError, ValueError):
            return None

    async def _job(self, name: str) -> None:
        delay = self.options.retry_first
        while True:
            try:
                lv = await self._read(name)
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
                if not e.transient:
                    await self._failed(lv, e)
                    return
                await self._waiting(lv, e, delay)
            except kube.KubeError as e:
                log.warning("copy: API error", extra={"lv": name, "error": kube.describe(e)})
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.options.retry_max)

    async def _attempt(self, lv: LogicalVolumeObject) -> None:
        source_name = lv.copy_source or lv.source
        source = await self._read(source_name)
        if source is None:
            raise SourceGone(f"the source LogicalVolume {source_name} is gone")
        if not source.ready:
            raise SourceFailed(f"the source {source_name} holds no data yet")
        target = await self.volumes.describe(lv.volume_id, lv.device_class)
        prior = lv.copy or CopyStatus()
        waiting = self._slots.locked()
        if waiting:
            await self._write(
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

    async def _remote(
        self, lv: LogicalVolumeObject, source: LogicalVolumeObject, target: VolumeInfo,
        prior: CopyStatus,
    ) -> None:  # fmt: skip
        endpoint = await self._endpoint(source.node_name)
        token = self._token()
        resume = self._resume(prior)
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
        )
        status = replace(
            prior,
            phase=CopyPhase.COPYING,
            source_node=source.node_name,
            attempts=prior.attempts + 1,
            start_time=prior.start_time or _now(),
            message=f"connecting to node {source.node_name}",
        )
        await self._write(lv, status)
        run = _Run(lv, status, time.monotonic(), prior.transferred_bytes)
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        timeout = self.options.limits.io_timeout

        def accepted(accept: messages.Accept) -> None:
            asyncio.run_coroutine_threadsafe(self._accepted(run, accept), loop).result(timeout=60)

        def work() -> client.Outcome:
            return client.receive(
                endpoint,
                hello,
                target,
                self._persister(run, loop),
                self._progress(run),
                stop,
                timeout,
                accepted,
            )

        outcome = await self._in_thread(work, stop)
        await self._done(run, outcome.digest, outcome.accept.source)

    async def _local(
        self, lv: LogicalVolumeObject, source: LogicalVolumeObject, target: VolumeInfo,
        prior: CopyStatus,
    ) -> None:  # fmt: skip
        volume = source.volume_id
        if source.access_type != "ro":
            volume = await self.cuts.ensure(lv.uid, source.volume_id, source.device_class)
        info = await self.volumes.describe(volume, source.device_class)
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
            start_time=prior.start_time or _now(),
            message=f"copying {source.name} on this node ({kind})",
        )
        await self._write(lv, status)
        await self._event(
            lv,
            "CopyStarted",
            f"copying {human(info.size)} from {source.name} "
            f"on this node ({kind}), from offset {start}",
        )
        run = _Run(lv, status, time.monotonic(), prior.transferred_bytes, position=start)
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        persist = self._persister(run, loop)
        progress = self._progress(run)
        limits = self.options.limits

        def work() -> bytes:
            if target.size < info.size:
                raise CopyImpossible(f"the target ({target.size} bytes) is smaller than the source")
            reader, writer = Volume(info.path, writable=False), Volume(target.path, writable=True)
            try:
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
                )
                sink.on_progress = lambda pos: progress(pos, info.size, sink.counts.data_bytes)
                return pipeline.copy_local(src, sink, stop, pipeline.Throttle(limits.bandwidth))
            finally:
                reader.close()
                writer.close()

        digest = await self._in_thread(work, stop)
        await self._done(run, digest, f"{source.name} on this node")
        if source.access_type != "ro":
            with contextlib.suppress(TransferError):
                await self.cuts.remove(lv.uid, source.device_class)

    async def _in_thread(self, work: Any, stop: threading.Event) -> Any:
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

    # -- reports --------------------------------------------------------------------------

    async def _accepted(self, run: _Run, accept: messages.Accept) -> None:
        run.position = accept.offset
        run.started = time.monotonic()
        run.status = replace(
            run.status,
            total_bytes=accept.size,
            resumed_from=accept.offset,
            source_id=accept.source_id,
            message=f"copying {accept.source}",
        )
        if accept.offset == 0:  # started over: the old checkpoint is void
            run.status = replace(run.status, checkpoint_offset=0, checkpoint_digest="")
        await self._write(run.lv, run.status)
        start = f"from offset {accept.offset}" if accept.offset else "from the start"
        note = f" ({accept.note})" if accept.note else ""
        await self._event(
            run.lv,
            "CopyStarted",
            f"copying {human(accept.size)} from {accept.source}, {start}{note}",
        )

    def _persister(self, run: _Run, loop: asyncio.AbstractEventLoop) -> client.Persist:
        """A checkpoint from the worker thread: written to status before the sender hears."""

        def persist(cp: client.Checkpoint) -> None:
            future = asyncio.run_coroutine_threadsafe(self._checkpoint(run, cp), loop)
            future.result(timeout=60)

        return persist

    async def _checkpoint(self, run: _Run, cp: client.Checkpoint) -> None:
        elapsed = max(time.monotonic() - run.started, 0.001)
        rate = int((cp.offset - run.status.resumed_from) / elapsed)
        run.status = replace(
            run.status,
            checkpoint_offset=cp.offset,
            checkpoint_digest=cp.digest.hex(),
            source_id=cp.source_id,
            done_bytes=cp.offset,
            bytes_per_second=max(rate, 0),
            transferred_bytes=run.base_transferred + run.data,
        )
        await self._write(run.lv, run.status)
        total = run.status.total_bytes or 1
        quarter = cp.offset * 4 // total
        if quarter > run.last_event_quarter:
            run.last_event_quarter = quarter
            await self._event(
                run.lv,
                "CopyProgress",
                f"{cp.offset * 100 // total}% copied "
                f"({human(cp.offset)} of {human(total)}, {human(rate)}/s)",
            )

    def _progress(self, run: _Run) -> client.Progress:
        last = [0.0]

        def progress(position: int, size: int, data: int) -> None:
            run.position, run.data = position, data
            now = time.monotonic()
            if now - last[0] >= 1.0:
                last[0] = now
                rate = (position - run.status.resumed_from) / max(now - run.started, 0.001)
                self.metrics.job(run.lv.name, position, size, rate)
                if run.status.total_bytes != size:
                    run.status = replace(run.status, total_bytes=size)

        return progress

    async def _done(self, run: _Run, digest: bytes, source: str) -> None:
        elapsed = time.monotonic() - run.started
        total = run.status.total_bytes or run.position
        status = replace(
            run.status,
            phase=CopyPhase.DONE,
            digest=digest.hex(),
            done_bytes=total,
            completion_time=_now(),
            transferred_bytes=run.base_transferred + run.data,
            message=f"copied from {source} and verified",
        )
        await self._write(run.lv, status)
        self.metrics.job_ended(run.lv.name)
        self.metrics.finished.labels(self.node, "receiver", "succeeded").inc()
        log.info(
            "copy done",
            extra={
                "lv": run.lv.name,
                "bytes": total,
                "secs": round(elapsed, 1),
                "data_bytes": run.data,
            },
        )
        await self._event(
            run.lv,
            "CopyDone",
            f"{human(total)} copied from {source} and "
            f"verified in {elapsed:.0f}s ({human(run.data)} of data moved)",
        )

    async def _waiting(self, lv: LogicalVolumeObject, e: TransferError, delay: float) -> None:
        current = (await self._read(lv.name)) or lv
        prior = current.copy or CopyStatus()
        message = f"waiting: {e}; next try in {delay:.0f}s"
        log.warning("copy interrupted", extra={"lv": lv.name, "error": str(e), "retry_in": delay})
        if prior.message.split("; next try")[0] != message.split("; next try", maxsplit=1)[0]:
            await self._event(lv, "CopyWaiting", message, warning=True)
        await self._write(
            current, replace(prior, phase=CopyPhase.PENDING, message=message, bytes_per_second=0)
        )

    async def _failed(self, lv: LogicalVolumeObject, e: TransferError) -> None:
        code = Status.DATA_LOSS if isinstance(e, DigestMismatch) else Status.FAILED_PRECONDITION
        if isinstance(e, SourceGone):
            code = Status.NOT_FOUND
        current = (await self._read(lv.name)) or lv
        prior = current.copy or CopyStatus()
        message = f"copy failed: {e}"
        log.error("copy failed", extra={"lv": lv.name, "error": str(e)})
        await self._write(
            current,
            replace(prior, phase=CopyPhase.FAILED, message=message),
            code=code.value,
            failure=message,
        )
        self.metrics.job_ended(lv.name)
        self.metrics.finished.labels(self.node, "receiver", "failed").inc()
        await self._event(lv, "CopyFailed", message, warning=True)

    async def _write(
        self, lv: LogicalVolumeObject, copy: CopyStatus, *, code: int = 0, failure: str = ""
    ) -> None:
        body: dict[str, Any] = {"copy": copy_patch(copy)}
        if code:
            body.update(code=code, message=failure)
        with contextlib.suppress(kube.NotFound):
            await api.patch_merge(self.client, self.resource.Status, lv.name, {"status": body})

    async def _event(self, lv: LogicalVolumeObject, reason: str, message: str,
                     warning: bool = False) -> None:  # fmt: skip
        for key, kind, version in (
            (self.names.claim_annotation, "PersistentVolumeClaim", "v1"),
            (self.names.snapshot_annotation, "VolumeSnapshot", "snapshot.storage.k8s.io/v1"),
        ):  # fmt: skip
            about = events.ObjectRef.parse(kind, lv.annotations.get(key, ""), version)
            if about is not None:
                await events.post(
                    self.client, about, reason, message, warning=warning, component="topolvm-node"
                )

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
        return client.Endpoint(node, host.strip("[]"), int(port), fingerprint)

    def _token(self) -> str:
        path = Path(self.options.token_file)
        try:
            token = path.read_text().strip()
        except OSError as e:
            raise Unreachable(
                f"no transfer token at {path}: {e.strerror} (the chart mounts a projected "
                "ServiceAccount token there)"
            ) from e
        if not token:
            raise Unreachable(f"the transfer token file {path} is empty")
        return token


def copy_patch(copy: CopyStatus) -> dict[str, Any]:
    """``status.copy`` as a merge patch: every field, the empty ones removed."""
    full = copy.to_dict()
    for _, key in CopyStatus._KEYS:
        full.setdefault(key, None)
    full.setdefault("checkpoint", None)
    return full


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

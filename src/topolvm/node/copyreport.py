"""How a copy reports (docs/mobility.md): its target's ``status.copy`` (phase, bytes, rate,
the checkpoint after every sync, the digest at the end), Events on the claim or VolumeSnapshot
that waits for it, and the node's metrics."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from grpclib.const import Status
from lightkube import AsyncClient

from topolvm.constants import Names
from topolvm.k8s import api, events
from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import (
    CopyPhase,
    CopyStatus,
    InvalidQuantity,
    LogicalVolumeObject,
    PartCheckpoint,
)
from topolvm.k8s.stamps import now
from topolvm.transfer import client, messages, plan
from topolvm.transfer.errors import CopyImpossible, DigestMismatch, TransferError
from topolvm.transfer.metrics import TransferMetrics
from topolvm.transfer.streams import PartPersist, PartPoint
from topolvm.units import human

log = logging.getLogger(__name__)


CPU_FIGURE_BYTES = 64 << 20  # the least data of an attempt whose CPU per GiB is reported
CPU_FIGURE_MAX = 10**7  # ms per GiB: a figure above (about 3 hours) is shown as this


class CheckpointFailed(TransferError):
    """A checkpoint could not be written to status (the API server did not answer)."""


class SourceGone(CopyImpossible):
    """The source LogicalVolume is gone."""


@dataclass
class Run:
    """What the worker thread reports while one attempt runs."""

    lv: LogicalVolumeObject
    status: CopyStatus
    started: float
    base_transferred: int
    position: int = 0
    data: int = 0
    last_event_quarter: int = 0
    base_wire: int = 0  # the wire bytes of earlier attempts, and of this one (remote copies)
    wire: int = 0
    # reports the worker thread started and the loop still writes (CopyReporter.settle)
    in_flight: list[concurrent.futures.Future[None]] = field(default_factory=list)
    # held while run.status is changed and written (the parts of a copy in several streams)
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)


def connecting(prior: CopyStatus, source_node: str) -> str:
    """The message while an attempt connects: a retry keeps what it waited for, so a reader
    between two attempts (topolvm doctor, a test) still sees why the copy waits, until the
    source accepts and the message says it copies."""
    if prior.message.startswith("waiting: "):
        return prior.message.split("; next try")[0] + "; trying again now"
    return f"connecting to node {source_node}"


def cpu_per_gib(outcome: client.Outcome) -> tuple[int, int]:
    """``status.copy``'s CPU figures of an attempt, sender's and receiver's: milliseconds per
    GiB of data, 0 when unknown or when too little data travelled for the figure to mean
    anything."""
    if outcome.data_bytes < CPU_FIGURE_BYTES:
        return 0, 0
    gib = outcome.data_bytes / (1 << 30)
    sender = outcome.sender_cpu_seconds

    def figure(seconds: float) -> int:  # a sender's word is bounded: the field is an int64
        return min(round(seconds * 1000 / gib), CPU_FIGURE_MAX)

    return 0 if sender is None else figure(sender), figure(outcome.cpu_seconds)


class CopyReporter:
    def __init__(
        self, client: AsyncClient, names: Names, node: str, metrics: TransferMetrics
    ) -> None:
        self.client = client
        self.names = names
        self.node = node
        self.metrics = metrics
        self.resource = api.logicalvolume_resource(names)

    async def read(self, name: str) -> LogicalVolumeObject | None:
        obj = await api.get(self.client, self.resource, name)
        try:
            return None if obj is None else LogicalVolumeObject.from_dict(obj)
        except (InvalidQuantity, KeyError, TypeError, ValueError):
            return None

    def accepted_soon(
        self, run: Run, accept: messages.Accept, loop: asyncio.AbstractEventLoop
    ) -> None:
        """From the worker thread: the source's ACCEPT reported while the data flows (the
        stream does not wait for the API). :meth:`settle` waits for that write."""
        future = asyncio.run_coroutine_threadsafe(self.accepted(run, accept), loop)
        future.add_done_callback(_log_failure)
        run.in_flight.append(future)

    async def settle(self, run: Run) -> None:
        """Wait for the reports still being written. A copy of a few MiB (a move's final copy)
        ends within milliseconds of its ACCEPT: its Done written beside a late "copying" patch
        could be overtaken by it, and a verified copy would read as one still running."""
        pending = [asyncio.wrap_future(f) for f in run.in_flight]
        run.in_flight.clear()
        if pending:
            await asyncio.wait(pending)  # their failures are logged by _log_failure

    async def accepted(self, run: Run, accept: messages.Accept) -> None:
        """The source's ACCEPT (a copy in several streams: its first part's)."""
        count = run.status.part_count
        async with run.writing:
            done = accept.offset if not count else resumed(run.status, accept)
            run.position = done
            run.started = time.monotonic()
            streams = f" in {count} streams" if count else ""
            run.status = replace(
                run.status,
                total_bytes=accept.size,
                resumed_from=done,
                source_id=accept.source_id,
                message=f"copying {accept.source}{streams}",
            )
            if accept.offset == 0:  # started over: the old checkpoint is void
                run.status = replace(run.status, checkpoint_offset=0, checkpoint_digest="")
            await self.write(run.lv, run.status)
        start = f"from offset {done}" if done else "from the start"
        if count and done:
            start = f"{human(done)} done already"
        note = f" ({accept.note})" if accept.note else ""
        await self.event(
            run.lv,
            "CopyStarted",
            f"copying {human(accept.size)} from {accept.source}{streams}, {start}{note}",
        )

    def persister(self, run: Run, loop: asyncio.AbstractEventLoop) -> client.Persist:
        """A checkpoint from the worker thread: written to status before the sender hears."""

        def persist(cp: client.Checkpoint) -> None:
            future = asyncio.run_coroutine_threadsafe(self.checkpoint(run, cp), loop)
            try:
                future.result(timeout=60)
            except (TimeoutError, kube.KubeError) as e:
                future.cancel()
                # not acknowledged: the sender goes on from the last checkpoint that was
                raise CheckpointFailed(f"checkpoint at {cp.offset} not written: {e}") from e

        return persist

    def part_persister(self, run: Run, loop: asyncio.AbstractEventLoop) -> PartPersist:
        """A part's checkpoint (a copy in several streams), as :meth:`persister` writes one."""

        def persist(index: int, point: PartPoint | None) -> None:
            future = asyncio.run_coroutine_threadsafe(self.part_checkpoint(run, index, point),
                                                      loop)  # fmt: skip
            try:
                future.result(timeout=60)
            except (TimeoutError, kube.KubeError) as e:
                future.cancel()
                at = "void" if point is None else f"at {point.point.offset}"
                raise CheckpointFailed(f"checkpoint of part {index + 1} {at} not written: "
                                       f"{e}") from e  # fmt: skip

        return persist

    async def part_checkpoint(self, run: Run, index: int, at: PartPoint | None) -> None:
        """One part's checkpoint into the status, the others' kept: the parts' writes go one
        at a time, each with every part's latest (writes in flight together could land out
        of order and bring back a checkpoint made void)."""
        async with run.writing:
            points = [p for p in run.status.part_checkpoints if p.index != index]
            if at is not None:
                cp = at.point
                points.append(PartCheckpoint(index, at.begin, at.end, cp.offset, cp.digest.hex(),
                                             cp.source_id))  # fmt: skip
            elapsed = max(time.monotonic() - run.started, 0.001)
            run.status = replace(
                run.status,
                part_checkpoints=tuple(sorted(points, key=lambda p: p.index)),
                done_bytes=run.position,
                bytes_per_second=max(int((run.position - run.status.resumed_from) / elapsed), 0),
                transferred_bytes=run.base_transferred + run.data,
                wire_bytes=run.base_wire + run.wire,
            )
            await self.write(run.lv, run.status)
        await self._progress_event(run, run.position)

    async def checkpoint(self, run: Run, cp: client.Checkpoint) -> None:
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
            wire_bytes=run.base_wire + run.wire,
        )
        await self.write(run.lv, run.status)
        await self._progress_event(run, cp.offset)

    async def _progress_event(self, run: Run, done: int) -> None:
        """An Event on the waiting claim at each quarter of the volume."""
        total = run.status.total_bytes or 1
        quarter = done * 4 // total
        if quarter > run.last_event_quarter:
            run.last_event_quarter = quarter
            rate = run.status.bytes_per_second
            await self.event(
                run.lv,
                "CopyProgress",
                f"{done * 100 // total}% copied ({human(done)} of {human(total)}, {human(rate)}/s)",
            )

    def progress(self, run: Run) -> client.Progress:
        last = [0.0]

        def progress(position: int, size: int, data: int, wire: int) -> None:
            run.position, run.data, run.wire = position, data, wire
            now = time.monotonic()
            if now - last[0] >= 1.0:
                last[0] = now
                rate = (position - run.status.resumed_from) / max(now - run.started, 0.001)
                self.metrics.job(run.lv.name, position, size, rate)

        return progress

    async def done(
        self, run: Run, digest: bytes, source: str, outcome: client.Outcome | None = None
    ) -> None:
        """``outcome``: a remote copy's, with what travelled on the wire and the CPU spent."""
        await self.settle(run)
        elapsed = time.monotonic() - run.started
        total = run.status.total_bytes or run.position
        status = replace(
            run.status,
            phase=CopyPhase.DONE,
            digest=digest.hex(),
            done_bytes=total,
            completion_time=now(),
            transferred_bytes=run.base_transferred + run.data,
            message=f"copied from {source} and verified",
        )
        if outcome is not None:
            sender, receiver = cpu_per_gib(outcome)
            status = replace(status, wire_bytes=run.base_wire + outcome.wire_bytes,
                             sender_cpu_ms_per_gib=sender,
                             receiver_cpu_ms_per_gib=receiver)  # fmt: skip
            self.metrics.cpu("receiver", outcome.cpu_seconds)
            self.metrics.moved("receiver", outcome.data_bytes, outcome.zero_bytes,
                               outcome.keep_bytes, wire=outcome.wire_bytes)  # fmt: skip
        await self.write(run.lv, status)
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
        await self.event(
            run.lv,
            "CopyDone",
            f"{human(total)} copied from {source} and "
            f"verified in {elapsed:.0f}s ({human(run.data)} of data moved)",
        )

    async def waiting(self, lv: LogicalVolumeObject, e: TransferError, delay: float) -> None:
        current = (await self.read(lv.name)) or lv
        prior = current.copy or CopyStatus()
        message = f"waiting: {e}; next try in {delay:.0f}s"
        log.warning("copy interrupted", extra={"lv": lv.name, "error": str(e), "retry_in": delay})
        if prior.message.split("; next try")[0] != message.split("; next try", maxsplit=1)[0]:
            await self.event(lv, "CopyWaiting", message, warning=True)
        await self.write(
            current, replace(prior, phase=CopyPhase.PENDING, message=message, bytes_per_second=0)
        )

    async def failed(self, lv: LogicalVolumeObject, e: TransferError) -> None:
        code = Status.DATA_LOSS if isinstance(e, DigestMismatch) else Status.FAILED_PRECONDITION
        if isinstance(e, SourceGone):
            code = Status.NOT_FOUND
        current = (await self.read(lv.name)) or lv
        prior = current.copy or CopyStatus()
        message = f"copy failed: {e}"
        log.error("copy failed", extra={"lv": lv.name, "error": str(e)})
        await self.write(
            current,
            replace(prior, phase=CopyPhase.FAILED, message=message),
            code=code.value,
            failure=message,
        )
        self.metrics.job_ended(lv.name)
        self.metrics.finished.labels(self.node, "receiver", "failed").inc()
        await self.event(lv, "CopyFailed", message, warning=True)

    async def write(
        self, lv: LogicalVolumeObject, copy: CopyStatus, *, code: int = 0, failure: str = ""
    ) -> None:
        body: dict[str, Any] = {"copy": copy_patch(copy)}
        if code:
            body.update(code=code, message=failure)
        with contextlib.suppress(kube.NotFound):
            await api.patch_merge(self.client, self.resource.Status, lv.name, {"status": body})

    async def event(self, lv: LogicalVolumeObject, reason: str, message: str,
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


def resumed(status: CopyStatus, accept: messages.Accept) -> int:
    """The bytes of a copy in several streams that its parts' checkpoints of this source hold
    already: where its progress starts."""
    done = 0
    for p in status.part_checkpoints:
        if p.source_id != accept.source_id or not 0 <= p.index < status.part_count:
            continue
        try:
            span = plan.part(accept.size, p.index, status.part_count, status.part_unit)
        except ValueError:
            return 0
        if span == (p.begin, p.end):
            done += max(0, min(p.offset, p.end) - p.begin)
    return done


def copy_patch(copy: CopyStatus) -> dict[str, Any]:
    """``status.copy`` as a merge patch: every field, the empty ones removed."""
    full = copy.to_dict()
    for _, key in CopyStatus._KEYS:
        full.setdefault(key, None)
    full.setdefault("checkpoint", None)
    full.setdefault("streams", None)
    return full


def _log_failure(future: concurrent.futures.Future[None]) -> None:
    if not future.cancelled() and (e := future.exception()) is not None:
        log.warning("copy: a report could not be written", extra={"error": str(e)})

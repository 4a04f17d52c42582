"""The sender: topolvm-node's transfer port (docs/mobility.md).

A connection is TLS from its first byte. The receiver's HELLO names the job (the target
LogicalVolume) and carries its ServiceAccount token; the node's ``authorise`` checks both
(TokenReview, the job's objects) before anything about a volume is read or said. Then the
source is streamed from the start, or from the receiver's checkpoint: a resume is checked
against the job the sender authorised (the same source, a segment boundary inside the volume,
and, while this process remembers the job, no further than it sent and with the digest chain it
computed there); one that fails a check starts over from zero rather than trusting it.

A job with a base (a delta copy, :class:`~.jobs.Job`) reads the base too: a thin source only
where lvmd says its blocks differ from the base's, a thick cut only the chunks written since the
older cut (lvmd reads the snapshots' exception tables), anything else wholly, compared with
the base; what is equal travels as KEEP records (:mod:`.pipeline`).

The stream and the receiver's acknowledgements run in worker threads on blocking sockets (no
event-loop hop per record). The loop accepts, does the TLS handshake and reads the HELLO within
the port's limits (:mod:`.door`, :class:`~.door.PortLimits`: what a connection not yet
authorised may cost is bounded; docs/security.md); then the HELLO's version is checked, at most
``authorising_per_peer`` HELLOs of one address are authorised at once (more are refused
``busy``), and ``authorise`` runs, knowing the peer's address (:data:`~.auth.CALLER`: the
TokenReviews are bounded by :class:`~.auth.TokenReviewer`). Refusals made before a receiver is
authenticated (:class:`~.errors.EarlyRefusal`) are logged once per address and reason in a
while, like dropped connections; the others each time. At most ``limits.concurrency`` jobs
stream at once; more are refused as ``busy`` and the receivers come back later. A job
connecting again (after a cut link) replaces its earlier stream.

A receiver may copy a large volume in several streams (``Hello.part``): each reads its part of
the source, resumes from its own checkpoint and ends with its part's digest; the streams of
one job count as one of ``limits.concurrency``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgspec

from topolvm.transfer import messages, plan, wire
from topolvm.transfer.auth import CALLER
from topolvm.transfer.blockio import Volume
from topolvm.transfer.compress import Compressor
from topolvm.transfer.conn import Conn
from topolvm.transfer.door import Door, PortLimits
from topolvm.transfer.errors import (
    ConnectionLost,
    EarlyRefusal,
    Refused,
    SourceFailed,
    TransferError,
)
from topolvm.transfer.jobs import Authorise, Job, Limits, VolumeInfo, Volumes
from topolvm.transfer.metrics import TransferMetrics
from topolvm.transfer.pipeline import RecordSource, Throttle
from topolvm.transfer.resume import JobMemory
from topolvm.transfer.resume import checked as _checked
from topolvm.transfer.tls import server_context

log = logging.getLogger(__name__)
HANDSHAKE_TIMEOUT = PortLimits().deadline
AUTHORISING_PER_PEER = PortLimits().authorising_per_peer
REMEMBERED_JOBS = 256


@dataclass(frozen=True)
class Reading:
    """What a stream reads: ``source``, along ``ranges`` (a thin source's mapped ranges, or
    with a ``base`` those that differ from it; None: every range), compared with ``base``."""

    source: VolumeInfo
    ranges: list[tuple[int, int]] | None = None
    base: VolumeInfo | None = None

    def pieces(self, start: int, end: int, step: int = wire.SEGMENT) -> Iterator[plan.Piece]:
        """From ``start`` up to ``end`` (the volume's size, or the end of a stream's part), in
        READ pieces of ``step`` bytes at most."""
        if self.ranges is None:
            return plan.full(end, start, step)
        split = plan.delta if self.base is not None else plan.mapped
        return split(end, self.ranges, start, step)

    def kind(self) -> str:
        if not self.source.thin:
            if self.base is None:
                return "thick"
            return (
                "thick, compared block by block"
                if self.ranges is None
                else "thick, its changed chunks"
            )
        if self.ranges is None:
            return "thin, whole" if self.base is None else "thin, compared block by block"
        return "thin, its mapped blocks" if self.base is None else "thin, its changed blocks"


class TransferServer:
    def __init__(
        self, node: str, authorise: Authorise, volumes: Volumes, limits: Limits,
        metrics: TransferMetrics, *, port: PortLimits | None = None,
    ) -> None:  # fmt: skip
        """``port``: what a connection may take before it is authorised (:mod:`.door`)."""
        self.node = node
        self.authorise = authorise
        self.volumes = volumes
        self.limits = limits
        self.metrics = metrics
        self.port_limits = port or PortLimits()
        self.ssl: ssl.SSLContext | None = None  # made at start, with a fresh key
        self.fingerprint = ""
        # a stream holds a thread: every part of each copy may run at once (made as needed)
        self._pool = ThreadPoolExecutor(max_workers=limits.concurrency * (plan.MAX_PARTS + 1) + 2,
                                        thread_name_prefix="transfer-send")  # fmt: skip
        self._door = Door(node, self.port_limits, metrics, self._arrived,
                          lambda: self.limits.io_timeout)  # fmt: skip
        self._authorising: dict[str, int] = {}
        # a job's stream (key: the job's UID, and its part's index for a copy in several
        # streams): its stop flag, its end, its connection
        self._streams: dict[str, tuple[threading.Event, asyncio.Future[Any], Conn]] = {}
        self._memory: OrderedDict[str, JobMemory] = OrderedDict()
        self._throttles: dict[str, Throttle] = {}  # a copy's, shared by its streams
        # the thin source's mapped ranges (and its LVM uuid) of the copies that streamed last,
        # as many as may stream at once: a cut or a snapshot never changes, and each stream of
        # a copy in several would have lvmd read the pool's metadata again
        self._mapped: OrderedDict[str, tuple[str, list[tuple[int, int]] | None]] = OrderedDict()

    @property
    def port(self) -> int:
        return self._door.port

    @property
    def handshake_timeout(self) -> float:
        """Seconds from accept for the TLS handshake and the HELLO."""
        return self._door.deadline

    @handshake_timeout.setter
    def handshake_timeout(self, seconds: float) -> None:
        self._door.deadline = seconds

    async def start(self, host: str, port: int) -> None:
        ctx, self.fingerprint = await asyncio.to_thread(server_context, self.node)
        self.ssl = ctx
        self._door.open(host, port, ctx)

    async def stop(self) -> None:
        for stop, _, conn in self._streams.values():
            stop.set()
            conn.abort()
        await self._door.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    @property
    def sending(self) -> int:
        """The streams this node sends now."""
        return len(self._streams)

    async def _arrived(self, conn: Conn, hello: messages.Hello, address: str) -> None:
        """A connection past its HELLO (:class:`~.door.Door`): answered, then closed."""
        try:
            await self._answer(conn, hello, address)
        except Refused as r:
            self.metrics.refusals.labels(self.node, r.reason).inc()
            ctx = {"job": hello.job[:253], "error": r.message}
            if isinstance(r, EarlyRefusal):  # anyone may cause these: not each one logged
                self._door.note(address, r.reason, "transfer refused before the receiver "
                                "was authenticated", ctx)  # fmt: skip
            else:
                log.warning("transfer refused", extra={"peer": conn.peer, "reason": r.reason,
                                                       **ctx})  # fmt: skip
            refusal = messages.Refuse(reason=r.reason, message=r.message[:4000])  # type: ignore[arg-type]
            with contextlib.suppress(TransferError):
                await self._run(conn.send_message, refusal)
        except Exception:  # a defect: logged; the peer sees the connection close
            log.exception("transfer connection failed",
                          extra={"peer": conn.peer, "job": hello.job[:253]})  # fmt: skip
        finally:
            conn.close()

    async def _answer(self, conn: Conn, hello: messages.Hello, address: str) -> None:
        if hello.version != messages.VERSION:  # before authorise looks at (or cuts) anything
            raise EarlyRefusal(
                "invalid", f"protocol version {hello.version}, this node speaks {messages.VERSION}"
            )
        most = self.port_limits.authorising_per_peer
        if self._authorising.get(address, 0) >= most:
            raise EarlyRefusal("busy", f"{most} HELLOs from {address} are being authorised "
                                       "already")  # fmt: skip
        self._authorising[address] = self._authorising.get(address, 0) + 1
        caller = CALLER.set(address)
        try:
            job = await self.authorise(hello)
        finally:
            CALLER.reset(caller)
            self._authorising[address] -= 1
            if not self._authorising[address]:
                del self._authorising[address]
        ctx = {
            "peer": conn.peer,
            "job": job.target,
            "source": job.source,
            "target_node": job.target_node,
        }
        part = hello.part
        key = job.uid if part is None else f"{job.uid}/{part.index}"
        if part is not None:
            ctx["part"] = f"{part.index + 1}/{part.count}"
        earlier = self._streams.get(key)
        if earlier is not None:  # the same job again: its old connection is gone (a cut link)
            earlier[0].set()
            earlier[2].abort()  # a send blocked on a peer that left returns now, not at timeout
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(earlier[1]), self.limits.io_timeout + 5)
        jobs = {k.partition("/")[0] for k in self._streams}
        if (len(jobs) >= self.limits.concurrency and job.uid not in jobs) or key in self._streams:
            raise Refused("busy", f"node {self.node} sends {len(jobs)} copies already")
        # the slot is taken before anything else awaits: two HELLOs at once never both pass
        stop = threading.Event()
        slot: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._streams[key] = (stop, slot, conn)
        throttle = self._throttles.setdefault(job.uid, Throttle(self.limits.bandwidth))
        try:
            await self._send(conn, job, hello, stop, ctx, throttle)
        finally:
            stop.set()
            slot.set_result(None)
            if self._streams.get(key, (None,))[0] is stop:
                del self._streams[key]
            if not any(k.partition("/")[0] == job.uid for k in self._streams):
                self._throttles.pop(job.uid, None)

    async def _send(
        self, conn: Conn, job: Job, hello: messages.Hello, stop: threading.Event,
        ctx: dict[str, Any], throttle: Throttle,
    ) -> None:  # fmt: skip
        resume, part = hello.resume, hello.part
        reading = await self._reading(job)
        info = reading.source
        span = None
        if part is not None:
            try:
                span = plan.part(info.size, part.index, part.count, part.unit)
            except ValueError as e:
                raise Refused("invalid", f"HELLO asks for {e}") from e
        # one memory per part of a job (at most MAX_PARTS): another split forgets the old one
        remembered = job.uid if part is None else f"{job.uid}/{part.index}"
        split = (0, 0) if part is None else (part.count, part.unit)
        memory = self._memory.get(remembered)
        if memory is not None and (memory.source_id != info.uuid or memory.split != split):
            memory = None
        start, _ = (0, info.size) if span is None else span
        state: bytes | None = None
        note = ""
        if resume is not None:
            if resume.source_id != info.uuid:
                note = "the source changed since the copy began: starting over"
            else:
                start, state, note = _checked(resume, info.size, memory, span)
        if memory is None:
            memory = JobMemory(info.uuid, split=split)
        self._memory[remembered] = memory
        self._memory.move_to_end(remembered)
        while len(self._memory) > REMEMBERED_JOBS:
            self._memory.popitem(last=False)
        delta = f", delta against {job.base}" if job.base else ""
        described = f"{job.source} on {self.node}{delta} ({reading.kind()})"
        accept = messages.Accept(size=info.size, offset=start, source_id=info.uuid,
                                 source=described, note=note, delta=bool(job.base))  # fmt: skip
        log.info(
            "transfer accepted", extra={**ctx, "offset": start, "size": info.size, "note": note}
        )
        future = asyncio.get_running_loop().run_in_executor(
            self._pool,
            self._stream,
            conn,
            reading,
            accept,
            state,
            memory,
            stop,
            frozenset(hello.features),
            span,
            throttle,
            1 if part is None else part.count,
        )
        self.metrics.active.labels(self.node, "sender").inc()
        result = "failed"
        try:
            await asyncio.shield(future)
            result = "succeeded"
            log.info("transfer sent", extra={**ctx, "bytes": conn.sent})
        except TransferError as e:
            log.warning("transfer stream ended", extra={**ctx, "error": str(e)})
        finally:
            stop.set()
            self.metrics.active.labels(self.node, "sender").dec()
            self.metrics.finished.labels(self.node, "sender", result).inc()

    async def _reading(self, job: Job) -> Reading:
        dc = job.device_class
        try:
            info = await self.volumes.describe(job.volume, dc, with_uuid=True)
            base = await self.volumes.describe(job.base, dc) if job.base else None
        except TransferError as e:
            raise Refused("unavailable", f"the source cannot be read now: {e}") from e
        if base is not None and base.size != info.size:
            raise Refused("invalid", f"the delta's base {job.base} has {base.size} bytes, "
                                     f"the source {job.volume} {info.size}")  # fmt: skip
        try:
            if base is None:
                return Reading(info, await self._mapped_of(job, info) if info.thin else None)
            alike = info.thin == base.thin
            changed = (
                await self.volumes.changed(job.volume, job.base, dc, thin=info.thin)
                if alike
                else None
            )
        except TransferError as e:
            raise Refused("unavailable", f"the source cannot be read now: {e}") from e
        return Reading(info, changed, base)

    async def _mapped_of(self, job: Job, info: VolumeInfo) -> list[tuple[int, int]] | None:
        uuid, known = self._mapped.get(job.uid, ("", None))
        if uuid and uuid == info.uuid:
            self._mapped.move_to_end(job.uid)
            return known
        mapped = await self.volumes.mapped(job.volume, job.device_class)
        if info.uuid:
            self._mapped[job.uid] = (info.uuid, mapped)
            while len(self._mapped) > self.limits.concurrency:
                self._mapped.popitem(last=False)
        return mapped

    def _stream(
        self, conn: Conn, reading: Reading, accept: messages.Accept, state: bytes | None,
        memory: JobMemory, stop: threading.Event, features: frozenset[str] = frozenset(),
        span: tuple[int, int] | None = None, throttle: Throttle | None = None, streams: int = 1,
    ) -> None:  # fmt: skip
        """Stream the source (or its part ``span``); ``features``: what the receiver's HELLO
        asked for (ZDATA records when this node compresses too, its CPU time in END);
        ``throttle``: the copy's, shared by its ``streams``."""
        began = time.thread_time()
        info = reading.source
        compressor = (
            Compressor() if self.limits.compress and messages.COMPRESS in features else None
        )
        volume: Volume | None = None
        base: Volume | None = None
        try:
            volume = Volume(info.path, writable=False)
            if reading.base is not None:
                base = Volume(reading.base.path, writable=False)
            start, until = accept.offset, info.size if span is None else span[1]
            step = plan.capped_step(self.limits.bandwidth, streams, self.limits.io_timeout)
            source = RecordSource(volume, info.size, reading.pieces(start, until, step), start,
                                  state, base=base, span=span)  # fmt: skip
            source.digest.on_boundary = memory.passed
            conn.send_message(accept)
            throttle = throttle or Throttle(self.limits.bandwidth)
            scratch = memoryview(bytearray(wire.MAX_CONTROL))
            for kind, offset, length, payload in source.records():
                if stop.is_set():
                    raise TransferError("stopped: the job connected again, or the node stops")
                if kind is wire.Kind.DATA:
                    packed = compressor.compress(payload) if compressor is not None else None
                    sent = payload if packed is None else memoryview(packed)
                    kind = wire.Kind.DATA if packed is None else wire.Kind.ZDATA  # noqa: PLW2901
                    throttle.take(len(sent), stop)
                    conn.send_frame(wire.pack_header(kind, offset, length, sent), sent)
                    self.metrics.moved("sender", length, 0, wire=len(sent))
                else:
                    conn.send(wire.pack_header(kind, offset, length, b""))
                    keep = kind is wire.Kind.KEEP
                    self.metrics.moved("sender", 0, 0 if keep else length, length if keep else 0)
                while conn.readable():
                    self._acknowledged(conn, memory, scratch)
            end = source.end()
            if messages.SENDER_CPU in features:
                spent = int((time.thread_time() - began) * 1000)
                end = msgspec.structs.replace(end, sender_cpu_ms=spent)
            conn.send_message(end)
            # the receiver's last word: its acknowledgement of the volume's end (checkpoints
            # still on their way come first), or a FAIL
            while self._acknowledged(conn, memory, scratch) < until:
                pass
        except (TransferError, ValueError, OSError) as e:
            # ValueError: mappings lvmd reported out of order; OSError: the volume's device.
            # A lost connection hears nothing more (a FAIL would only wait out its timeout).
            if not isinstance(e, ConnectionLost):
                with contextlib.suppress(TransferError):
                    conn.send_message(messages.Fail(message=str(e)[:4000]))
            if isinstance(e, TransferError):
                raise
            raise SourceFailed(f"reading {info.path}: {e}") from e
        finally:
            self.metrics.cpu("sender", time.thread_time() - began)
            for opened in (volume, base):
                if opened is not None:
                    opened.close()

    @staticmethod
    def _acknowledged(conn: Conn, memory: JobMemory, scratch: memoryview) -> int:
        ack = conn.recv_message(messages.Ack, scratch)
        memory.confirmed(ack.offset, bytes.fromhex(ack.digest))
        return ack.offset

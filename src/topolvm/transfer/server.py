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

The handshake, the stream and the receiver's acknowledgements run in worker threads on
blocking sockets (no event-loop hop per record); the loop only accepts, authorises and keeps
count. Handshakes have threads of their own and one deadline for the TLS handshake and the
HELLO together, and at most ``PENDING`` connections wait for theirs: peers that connect and
stall cannot hold up a stream. At most ``limits.concurrency`` jobs stream at once; more are
refused as ``busy`` and the receivers come back later. A job connecting again (after a cut
link) replaces its earlier stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from topolvm.transfer import messages, plan, wire
from topolvm.transfer.blockio import Volume
from topolvm.transfer.conn import Conn
from topolvm.transfer.errors import DigestMismatch, Refused, SourceFailed, TransferError
from topolvm.transfer.jobs import Authorise, Job, Limits, VolumeInfo, Volumes
from topolvm.transfer.metrics import TransferMetrics
from topolvm.transfer.pipeline import RecordSource, Throttle
from topolvm.transfer.tls import server_context

log = logging.getLogger(__name__)
HANDSHAKE_TIMEOUT = 10.0  # for the TLS handshake and the HELLO together
HANDSHAKES = 8  # at once, in threads of their own: slow or silent peers never hold a stream's
PENDING = 64  # connections not yet authorised; more are closed at once
REMEMBERED_JOBS = 256
REMEMBERED_BOUNDARIES = 4096  # per job: about 4 GiB of stream past its last acknowledgement


@dataclass
class JobMemory:
    """What this process knows of a job's stream: the source it read, how far it sent, the
    digest chain at the segment boundaries past the last checkpoint the receiver confirmed."""

    source_id: str
    sent_until: int = 0
    boundaries: OrderedDict[int, bytes] = field(default_factory=OrderedDict)

    def passed(self, offset: int, state: bytes) -> None:
        self.boundaries[offset] = state
        self.sent_until = max(self.sent_until, offset)
        while len(self.boundaries) > REMEMBERED_BOUNDARIES:
            self.boundaries.popitem(last=False)

    def confirmed(self, offset: int, state: bytes) -> None:
        """The receiver's checkpoint: it must match the chain sent there."""
        known = self.boundaries.get(offset)
        if known is not None and known != state:
            raise DigestMismatch(
                f"the receiver's checkpoint at {offset} differs from what was sent"
            )
        for old in [k for k in self.boundaries if k < offset]:
            del self.boundaries[old]


def _checked(
    resume: messages.Resume, size: int, memory: JobMemory | None
) -> tuple[int, bytes | None, str]:
    offset, state = resume.offset, bytes.fromhex(resume.digest)
    if offset == 0:
        return 0, None, ""  # the start: the chain starts from its own initial value
    if offset % wire.SEGMENT or offset > size:
        return 0, None, f"checkpoint {offset} is not a segment boundary of the volume"
    if memory is not None:
        if offset > memory.sent_until:
            return 0, None, f"checkpoint {offset} is past what was sent ({memory.sent_until})"
        known = memory.boundaries.get(offset)
        if known is not None and known != state:
            return 0, None, f"checkpoint {offset} does not match what was sent there"
    return offset, state, ""


@dataclass(frozen=True)
class Reading:
    """What a stream reads: ``source``, along ``ranges`` (a thin source's mapped ranges, or
    with a ``base`` those that differ from it; None: every range), compared with ``base``."""

    source: VolumeInfo
    ranges: list[tuple[int, int]] | None = None
    base: VolumeInfo | None = None

    def pieces(self, start: int) -> Iterator[plan.Piece]:
        size = self.source.size
        if self.ranges is None:
            return plan.full(size, start)
        split = plan.delta if self.base is not None else plan.mapped
        return split(size, self.ranges, start)

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


def _shut(raw: socket.socket) -> None:
    with contextlib.suppress(OSError):
        raw.shutdown(socket.SHUT_RDWR)


class TransferServer:
    def __init__(
        self, node: str, authorise: Authorise, volumes: Volumes, limits: Limits,
        metrics: TransferMetrics,
    ) -> None:  # fmt: skip
        self.node = node
        self.authorise = authorise
        self.volumes = volumes
        self.limits = limits
        self.metrics = metrics
        self.ssl: ssl.SSLContext | None = None  # made at start, with a fresh key
        self.fingerprint = ""
        self._pool = ThreadPoolExecutor(max_workers=2 * limits.concurrency + 2,
                                        thread_name_prefix="transfer-send")  # fmt: skip
        self._handshakes = ThreadPoolExecutor(max_workers=HANDSHAKES,
                                              thread_name_prefix="transfer-hello")  # fmt: skip
        self._pending = 0
        self.handshake_timeout = HANDSHAKE_TIMEOUT
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._streams: dict[str, tuple[threading.Event, asyncio.Future[Any]]] = {}
        self._memory: OrderedDict[str, JobMemory] = OrderedDict()

    @property
    def port(self) -> int:
        assert self._listener is not None
        return int(self._listener.getsockname()[1])

    async def start(self, host: str, port: int) -> None:
        self.ssl, self.fingerprint = await asyncio.to_thread(server_context, self.node)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
        sock.setblocking(False)
        self._listener = sock
        self._accepting = asyncio.create_task(self._accept_loop(), name="transfer-accept")

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        if self._listener is not None:
            self._listener.close()
        for stop, _ in self._streams.values():
            stop.set()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._handshakes.shutdown(wait=False, cancel_futures=True)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            raw, addr = await loop.sock_accept(self._listener)
            if self._pending >= PENDING:
                log.warning("transfer connection closed: too many not yet authorised",
                            extra={"peer": addr[0], "pending": self._pending})  # fmt: skip
                raw.close()
                continue
            task = asyncio.create_task(self._serve(raw, f"{addr[0]}:{addr[1]}"))
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _handshake(self, raw: socket.socket, peer: str) -> tuple[Conn, messages.Hello]:
        raw.setblocking(True)
        raw.settimeout(self.handshake_timeout)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        assert self.ssl is not None
        # one deadline for the whole handshake: a peer trickling a byte now and then is cut off
        deadline = threading.Timer(self.handshake_timeout, _shut, (raw,))
        deadline.start()
        try:
            conn = Conn.tls(raw, self.ssl, peer, server=True)
            try:
                hello = conn.recv_message(messages.Hello)
            except BaseException:
                conn.close()
                raise
        except BaseException:
            raw.close()
            raise
        finally:
            deadline.cancel()
        raw.settimeout(self.limits.io_timeout)
        return conn, hello

    async def _serve(self, raw: socket.socket, peer: str) -> None:
        loop = asyncio.get_running_loop()
        self._pending += 1
        try:
            conn, hello = await loop.run_in_executor(self._handshakes, self._handshake, raw, peer)
        except TransferError as e:
            log.warning("transfer connection dropped", extra={"peer": peer, "error": str(e)})
            return
        finally:
            self._pending -= 1
        try:
            await self._answer(conn, hello)
        except Refused as r:
            self.metrics.refusals.labels(self.node, r.reason).inc()
            ctx = {"peer": peer, "job": hello.job, "reason": r.reason, "error": r.message}
            log.warning("transfer refused", extra=ctx)
            refusal = messages.Refuse(reason=r.reason, message=r.message[:4000])  # type: ignore[arg-type]
            with contextlib.suppress(TransferError):
                await self._run(conn.send_message, refusal)
        except Exception:  # a defect: logged; the peer sees the connection close
            log.exception("transfer connection failed", extra={"peer": peer, "job": hello.job})
        finally:
            conn.close()

    async def _answer(self, conn: Conn, hello: messages.Hello) -> None:
        job = await self.authorise(hello)
        ctx = {
            "peer": conn.peer,
            "job": job.target,
            "source": job.source,
            "target_node": job.target_node,
        }
        if hello.version != messages.VERSION:
            raise Refused(
                "invalid", f"protocol version {hello.version}, this node speaks {messages.VERSION}"
            )
        earlier = self._streams.get(job.uid)
        if earlier is not None:  # the same job again: its old connection is gone (a cut link)
            earlier[0].set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(earlier[1]), self.limits.io_timeout + 5)
        if len(self._streams) >= self.limits.concurrency or job.uid in self._streams:
            raise Refused("busy", f"node {self.node} sends {len(self._streams)} copies already")
        # the slot is taken before anything else awaits: two HELLOs at once never both pass
        stop = threading.Event()
        slot: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._streams[job.uid] = (stop, slot)
        try:
            await self._send(conn, job, hello.resume, stop, ctx)
        finally:
            stop.set()
            slot.set_result(None)
            if self._streams.get(job.uid, (None,))[0] is stop:
                del self._streams[job.uid]

    async def _send(
        self, conn: Conn, job: Job, resume: messages.Resume | None, stop: threading.Event,
        ctx: dict[str, Any],
    ) -> None:  # fmt: skip
        reading = await self._reading(job)
        info = reading.source
        memory = self._memory.get(job.uid)
        if memory is not None and memory.source_id != info.uuid:
            memory = None
        start, state, note = 0, None, ""
        if resume is not None:
            if resume.source_id != info.uuid:
                note = "the source changed since the copy began: starting over"
            else:
                start, state, note = _checked(resume, info.size, memory)
        if memory is None:
            memory = JobMemory(info.uuid)
        self._memory[job.uid] = memory
        self._memory.move_to_end(job.uid)
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
            self._pool, self._stream, conn, reading, accept, state, memory, stop
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
                mapped = await self.volumes.mapped(job.volume, dc) if info.thin else None
                return Reading(info, mapped)
            alike = info.thin == base.thin
            changed = (
                await self.volumes.changed(job.volume, job.base, dc, thin=info.thin)
                if alike
                else None
            )
        except TransferError as e:
            raise Refused("unavailable", f"the source cannot be read now: {e}") from e
        return Reading(info, changed, base)

    def _stream(
        self, conn: Conn, reading: Reading, accept: messages.Accept, state: bytes | None,
        memory: JobMemory, stop: threading.Event,
    ) -> None:  # fmt: skip
        info = reading.source
        volume: Volume | None = None
        base: Volume | None = None
        try:
            volume = Volume(info.path, writable=False)
            if reading.base is not None:
                base = Volume(reading.base.path, writable=False)
            start = accept.offset
            source = RecordSource(volume, info.size, reading.pieces(start), start, state,
                                  base=base)  # fmt: skip
            source.digest.on_boundary = memory.passed
            conn.send_message(accept)
            throttle = Throttle(self.limits.bandwidth)
            scratch = memoryview(bytearray(wire.MAX_CONTROL))
            for kind, offset, length, payload in source.records():
                if stop.is_set():
                    raise TransferError("stopped: the job connected again, or the node stops")
                if kind is wire.Kind.DATA:
                    throttle.take(length, stop)
                    conn.send_frame(wire.pack_header(kind, offset, length, payload), payload)
                    self.metrics.moved("sender", length, 0)
                else:
                    conn.send(wire.pack_header(kind, offset, length, b""))
                    keep = kind is wire.Kind.KEEP
                    self.metrics.moved("sender", 0, 0 if keep else length, length if keep else 0)
                while conn.readable():
                    self._acknowledged(conn, memory, scratch)
            conn.send_message(source.end())
            # the receiver's last word: its acknowledgement of the volume's end (checkpoints
            # still on their way come first), or a FAIL
            while self._acknowledged(conn, memory, scratch) < info.size:
                pass
        except (TransferError, ValueError, OSError) as e:
            # ValueError: mappings lvmd reported out of order; OSError: the volume's device
            with contextlib.suppress(TransferError):
                conn.send_message(messages.Fail(message=str(e)[:4000]))
            if isinstance(e, TransferError):
                raise
            raise SourceFailed(f"reading {info.path}: {e}") from e
        finally:
            for opened in (volume, base):
                if opened is not None:
                    opened.close()

    @staticmethod
    def _acknowledged(conn: Conn, memory: JobMemory, scratch: memoryview) -> int:
        ack = conn.recv_message(messages.Ack, scratch)
        memory.confirmed(ack.offset, bytes.fromhex(ack.digest))
        return ack.offset

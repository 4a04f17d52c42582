"""The receiver: fills a target volume from a sender's transfer port (blocking; run in a
worker thread by the node's copy jobs).

It connects, checks the sender's certificate against the fingerprint the sender's Node
publishes before it says anything, sends its HELLO (token, job, checkpoint), and writes what
comes. At each checkpoint the target is synced and ``persist`` records the point (the node
writes it to the LogicalVolume's status) before the sender hears of it: a checkpoint the
sender knows is always durable. After END the counts and the whole-volume digest are checked;
the final acknowledgement tells the sender the copy is complete.

A HELLO whose ``features`` ask for compression gets ZDATA records as well as DATA: each is
decompressed and checked to fill exactly its range before it is written (:mod:`.compress`).

An ACCEPT that says ``delta`` streams only what differs from a base the target holds already
(the job's earlier copy): KEEP records leave the target's bytes, zeros are all written, and
the target is never discarded.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from topolvm.transfer import messages, plan, wire
from topolvm.transfer.blockio import Volume, aligned
from topolvm.transfer.compress import Decompressor
from topolvm.transfer.conn import Conn, raise_if_refused
from topolvm.transfer.errors import ConnectionLost, CopyImpossible, ProtocolError, Unreachable
from topolvm.transfer.jobs import VolumeInfo
from topolvm.transfer.pipeline import RecordSink
from topolvm.transfer.tls import check_peer, client_context


@dataclass(frozen=True)
class Checkpoint:
    """A durable point of a copy: everything before ``offset`` is written and synced, the
    digest chain there is ``digest``, read from the source LV of LVM uuid ``source_id``."""

    offset: int
    digest: bytes
    source_id: str


@dataclass(frozen=True)
class Endpoint:
    node: str
    host: str
    port: int
    fingerprint: str
    features: frozenset[str] = frozenset()  # the HELLO features the sender honours


@dataclass
class Outcome:
    accept: messages.Accept
    digest: bytes
    data_bytes: int  # DATA payload received in this connection
    zero_bytes: int
    keep_bytes: int = 0  # a delta's ranges the target held already
    wire_bytes: int = 0  # DATA and ZDATA payload received (below data_bytes when compressed)
    cpu_seconds: float = 0.0  # this side's, for the stream
    sender_cpu_seconds: float | None = None  # the sender's, when its END said


Persist = Callable[[Checkpoint], None]
# position, size, data bytes received so far, and their bytes on the wire (less if compressed)
Progress = Callable[[int, int, int, int], None]
Accepted = Callable[[messages.Accept], None]


def connect(endpoint: Endpoint, timeout: float) -> Conn:
    try:
        raw = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except OSError as e:
        raise Unreachable(
            f"node {endpoint.node}'s transfer port {endpoint.host}:{endpoint.port}: {e}"
        ) from e
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    peer = f"{endpoint.node} ({endpoint.host}:{endpoint.port})"
    conn = Conn.tls(raw, client_context(), peer, server=False)
    try:
        check_peer(conn.peer_certificate(), endpoint.fingerprint, endpoint.node)
    except BaseException:
        conn.close()
        raise
    return conn


def accept_wait(timeout: float) -> float:
    """How long a receiver waits for ACCEPT: longer than for any byte of the stream. Before it,
    the source reviews the token, reads the API, makes and checks its cut and asks lvmd for
    the delta behind lvmd's lock, and (a reconnect) waits for the job's earlier stream to end
    (``io_timeout`` + 5 s). A receiver that gave up after ``timeout`` only retried into the
    same wait: on a loaded host, a move's final copy retried for 10 minutes."""
    return max(4 * timeout, 120.0)


def receive(
    endpoint: Endpoint, hello: messages.Hello, target: VolumeInfo, persist: Persist,
    progress: Progress, stop: threading.Event, timeout: float,
    accepted: Accepted = lambda accept: None, *, fresh: bool = True,
) -> Outcome:  # fmt: skip
    """Receive the job of ``hello`` into ``target``; ``fresh``: no earlier attempt wrote into
    it (see :class:`~topolvm.transfer.pipeline.RecordSink`)."""
    conn = connect(endpoint, timeout)
    try:
        conn.send_message(hello)
        conn.wait(stop, accept_wait(timeout))  # a stop ends the wait, not only the ACCEPT
        accept = conn.recv_message(messages.Accept)
        accepted(accept)
        return _fill(conn, hello, accept, target, persist, progress, stop, fresh)
    finally:
        conn.close()


def _fill(
    conn: Conn, hello: messages.Hello, accept: messages.Accept, target: VolumeInfo,
    persist: Persist, progress: Progress, stop: threading.Event, fresh: bool,
) -> Outcome:  # fmt: skip
    if accept.size > target.size:
        raise CopyImpossible(f"the source has {accept.size} bytes, the target only {target.size}")
    resume, part = hello.resume, hello.part
    span = None if part is None else plan.part(accept.size, part.index, part.count, part.unit)
    begin, until = (0, accept.size) if span is None else span
    if accept.offset != begin and (resume is None or accept.offset != resume.offset):
        raise ProtocolError(f"ACCEPT at {accept.offset}, which was not asked for")
    state = bytes.fromhex(resume.digest) if resume is not None and accept.offset != begin else None
    if stop.is_set():  # before the target is touched (a part starting over clears its range)
        raise ConnectionLost("the copy was stopped")

    def checkpoint(offset: int, digest: bytes) -> None:
        persist(Checkpoint(offset, digest, accept.source_id))
        conn.send_message(messages.Ack(offset=offset, digest=digest.hex()))

    began = time.thread_time()
    compressed = messages.COMPRESS in hello.features
    unpack = Decompressor() if compressed else None
    plain = aligned(wire.SEGMENT) if compressed else None
    volume = Volume(target.path, writable=True)
    try:
        sink = RecordSink(volume, accept.size, target.size, target.chunk, checkpoint,
                          accept.offset, state, fresh=fresh, delta=accept.delta,
                          span=span)  # fmt: skip
        counts = sink.counts
        sink.on_progress = lambda position: progress(position, accept.size, counts.data_bytes,
                                                     counts.wire_bytes)  # fmt: skip
        # page-aligned: written with O_DIRECT
        payload = aligned(wire.SEGMENT)
        while True:
            if stop.is_set():
                raise ConnectionLost("the copy was stopped")
            header, body = conn.recv(payload)
            if header.kind is wire.Kind.DATA:
                counts.wire_bytes += len(body)
                sink.data(header.offset, body)
            elif header.kind is wire.Kind.ZDATA and unpack is not None and plain is not None:
                counts.wire_bytes += len(body)
                sink.data(header.offset, unpack.decompress(body, header.length, plain))
            elif header.kind is wire.Kind.ZERO:
                sink.zero(header.offset, header.length)
            elif header.kind is wire.Kind.KEEP:
                sink.keep(header.offset, header.length)
            elif header.kind is wire.Kind.END:
                end = messages.decode(header.kind, body, messages.End)
                digest = sink.end(end, sink.counts)  # synced: the copy is complete
                conn.send_message(messages.Ack(offset=until, digest=digest.hex()))
                return Outcome(accept, digest, counts.data_bytes, counts.zero_bytes,
                               counts.keep_bytes, counts.wire_bytes, time.thread_time() - began,
                               end.sender_cpu_ms / 1000 if end.sender_cpu_ms else None)  # fmt: skip
            else:
                raise_if_refused(header, body)
                raise ProtocolError(f"unexpected {header.kind.name} in the stream")
    finally:
        volume.close()

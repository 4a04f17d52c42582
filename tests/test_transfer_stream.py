"""The transfer's sender and receiver over real TLS on loopback, with files standing in for
the volumes (real LVM and real nodes: tests/test_cluster_transfer*.py). What a user of the
copy relies on: the target ends equal to the source, a thin source sends only its mapped
blocks, a stopped copy resumes from its checkpoint (not from zero), a resume the sender
cannot vouch for starts over, refusals and a wrong certificate stop the copy before any data
moves, and a digest that differs fails it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from topolvm.transfer import messages, pipeline, plan, wire
from topolvm.transfer.blockio import Volume
from topolvm.transfer.client import Checkpoint, Endpoint, Outcome, receive
from topolvm.transfer.errors import (
    ConnectionLost,
    DigestMismatch,
    PeerMismatch,
    Refused,
    TransferError,
)
from topolvm.transfer.jobs import Job, Limits, VolumeInfo
from topolvm.transfer.metrics import TransferMetrics
from topolvm.transfer.server import TransferServer
from topolvm.transfer.tls import client_context

MiB = 1 << 20
UID = "0b4f5c7e-1111-4222-8333-123456789abc"
SOURCE_ID = "Zr3pQe-1AbC-9xYz-2DeF-3GhI-4JkL-5MnOpQ"  # LVM's lv_uuid form


def _write_volume(path: Path, size: int, seed: int, data_every: int = 3) -> list[tuple[int, int]]:
    """A file of ``size`` bytes with random data in every ``data_every``-th 64 KiB chunk (the
    rest zeros); returns the chunks written, as a thin pool would map them."""
    rng = random.Random(seed)
    chunk = 64 << 10
    mapped = []
    with path.open("wb") as f:
        f.truncate(size)
        for off in range(0, size, chunk):
            if (off // chunk) % data_every == 0:
                f.seek(off)
                f.write(rng.randbytes(chunk))
                mapped.append((off, chunk))
    return plan.merge(mapped)


class FakeVolumes:
    def __init__(self, volumes: dict[str, tuple[Path, list[tuple[int, int]] | None]]) -> None:
        self.volumes = volumes
        self.mapped_reads = 0  # lvmd reads a thin pool's metadata for each

    async def describe(self, name: str, device_class: str, with_uuid: bool = False) -> VolumeInfo:
        path, mapped = self.volumes[name]
        return VolumeInfo(str(path), path.stat().st_size, mapped is not None, 65536, SOURCE_ID)

    async def mapped(self, name: str, device_class: str) -> list[tuple[int, int]] | None:
        self.mapped_reads += 1
        return self.volumes[name][1]

    async def changed(
        self, name: str, base: str, device_class: str, thin: bool = True
    ) -> list[tuple[int, int]] | None:
        return None


def _job() -> Job:
    return Job(UID, "pvc-target", "node-b", "src", "ssd", "snapshot-1")


class Server:
    def __init__(
        self, tmp: Path, mapped: bool, bandwidth: int = 0, refuse: str = "", data_every: int = 3,
        slow: float = 0.0,
    ) -> None:  # fmt: skip
        self.source = tmp / "source"
        self.mapped = _write_volume(self.source, 24 * MiB + 65536, seed=1, data_every=data_every)
        self.volumes = volumes = FakeVolumes(
            {"src": (self.source, self.mapped if mapped else None)}
        )
        self.refuse = refuse

        async def authorise(hello: messages.Hello) -> Job:
            await asyncio.sleep(slow)  # a TokenReview, API reads, a cut: before ACCEPT
            if self.refuse:
                raise Refused(self.refuse, "no")
            return _job()

        self.metrics = TransferMetrics(None, "node-a")
        limits = Limits(bandwidth=bandwidth, io_timeout=5)
        self.server = TransferServer("node-a", authorise, volumes, limits, self.metrics)

    def sent(self, kind: str) -> float:
        counter = self.metrics.data_bytes if kind == "data" else self.metrics.zero_bytes
        return float(counter.labels("node-a", "sender")._value.get())


MakeServer = Callable[..., Awaitable[Server]]


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[MakeServer]:
    servers: list[Server] = []

    async def make(**kw: object) -> Server:
        s = Server(tmp_path, **kw)  # type: ignore[arg-type]
        await s.server.start("127.0.0.1", 0)
        servers.append(s)
        return s

    yield make
    for s in servers:
        await s.server.stop()


def _hello(resume: Checkpoint | None = None, features: tuple[str, ...] = ()) -> messages.Hello:
    r = None
    if resume is not None:
        r = messages.Resume(offset=resume.offset, digest=resume.digest.hex(),
                            source_id=resume.source_id)  # fmt: skip
    return messages.Hello(version=1, token="t", job="pvc-target", job_uid=UID, resume=r,
                          features=features)  # fmt: skip


def _target(tmp: Path, size: int, chunk: int = 0) -> VolumeInfo:
    path = tmp / "target"
    with path.open("wb") as f:
        if chunk:  # a fresh thin volume reads zeros
            f.truncate(size)
        else:  # a thick one holds an earlier tenant's bytes: skipped zeros must be zeroed
            f.write(b"\xee" * size)
    return VolumeInfo(str(path), size, chunk > 0, chunk, "t-uuid")


async def _receive(
    s: Server, target: VolumeInfo, resume: Checkpoint | None = None,
    stop: threading.Event | None = None, fingerprint: str = "",
    checkpoints: list[Checkpoint] | None = None, fresh: bool = True, timeout: float = 5.0,
) -> Outcome:  # fmt: skip
    endpoint = Endpoint("node-a", "127.0.0.1", s.server.port, fingerprint or s.server.fingerprint)
    seen = checkpoints if checkpoints is not None else []
    return await asyncio.to_thread(
        lambda: receive(endpoint, _hello(resume), target, seen.append, lambda *a: None,
                        stop or threading.Event(), timeout, fresh=fresh)
    )  # fmt: skip


async def test_a_thin_source_sends_only_its_mapped_blocks_and_the_target_equals_it(
    server: MakeServer, tmp_path: Path
) -> None:
    s = await server(mapped=True)
    size = s.source.stat().st_size
    target = _target(tmp_path, size + 4 * MiB)
    outcome = await _receive(s, target)
    assert Path(target.path).read_bytes()[:size] == s.source.read_bytes()
    mapped = sum(n for _, n in s.mapped)
    assert outcome.data_bytes == mapped == s.sent("data")
    assert s.sent("zero") == size - mapped


async def test_a_receiver_waits_for_accept_longer_than_for_a_byte_of_the_stream(
    server: MakeServer, tmp_path: Path
) -> None:
    """The source takes longer before ACCEPT than the receiver's I/O timeout (a loaded host, a
    final round's cut and delta): the receiver waits for it instead of retrying into it."""
    s = await server(mapped=True, slow=2.0)
    size = s.source.stat().st_size
    target = _target(tmp_path, size + 4 * MiB)
    await _receive(s, target, timeout=1.0)
    assert Path(target.path).read_bytes()[:size] == s.source.read_bytes()


async def test_a_copy_stopped_while_it_waits_for_accept_ends_at_once_and_writes_nothing(
    server: MakeServer, tmp_path: Path
) -> None:
    """The source takes a minute before ACCEPT; the copy is stopped (its LogicalVolume deleted,
    say) a moment into that wait: the receiver ends within a second, its target untouched,
    instead of sitting out the wait."""
    s = await server(mapped=True, slow=60.0)
    size = s.source.stat().st_size
    target = _target(tmp_path, size)
    before = Path(target.path).read_bytes()
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    began = time.monotonic()
    with pytest.raises(ConnectionLost, match="stopped"):
        await _receive(s, target, stop=stop, timeout=30.0)
    assert time.monotonic() - began < 5.0  # the wait for ACCEPT alone would be 120 s
    assert Path(target.path).read_bytes() == before


async def test_a_job_connecting_again_ends_its_stalled_earlier_stream_at_once(
    server: MakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receiver of a stream stops reading (its node froze, its link was cut without a
    reset): when the job connects again, the sender ends the stalled stream at once and serves
    the new one, instead of waiting out its own I/O timeout (10 minutes here) with the
    copy's slot held, a move's workload down meanwhile."""
    monkeypatch.setattr(pipeline, "CHECKPOINT_BYTES", 2 * MiB)
    s = await server(mapped=False)
    s.server.limits = Limits(io_timeout=600)
    size = s.source.stat().st_size
    frozen, thawed = threading.Event(), threading.Event()

    def freeze(point: Checkpoint) -> None:  # the first receiver stops reading here
        frozen.set()
        thawed.wait(120)

    first = asyncio.create_task(_receive(s, _target(tmp_path, size), timeout=600,
                                         checkpoints=_Frozen(freeze)))  # fmt: skip
    try:
        assert await asyncio.to_thread(frozen.wait, 30)
        again = tmp_path / "again"
        again.mkdir()
        target = _target(again, size)
        await asyncio.wait_for(_receive(s, target, timeout=5), 60)
        assert Path(target.path).read_bytes() == s.source.read_bytes()
    finally:
        thawed.set()
        with pytest.raises(TransferError):
            await first  # its stream was ended


class _Frozen(list[Checkpoint]):
    """Checkpoints whose recording runs ``hook`` (it blocks: a receiver that stops reading)."""

    def __init__(self, hook: Callable[[Checkpoint], None]) -> None:
        super().__init__()
        self.hook = hook

    def append(self, point: Checkpoint) -> None:
        self.hook(point)
        super().append(point)


async def test_a_thick_source_is_read_whole_and_its_zeros_travel_as_markers(
    server: MakeServer, tmp_path: Path
) -> None:
    s = await server(mapped=False, data_every=48)  # 64 KiB of data every 3 MiB
    size = s.source.stat().st_size
    target = _target(tmp_path, size, chunk=65536)
    await _receive(s, target)
    assert Path(target.path).read_bytes() == s.source.read_bytes()
    # the segments with data (the last one is 64 KiB long); the zero ones did not travel
    assert s.sent("data") == 8 * MiB + 65536


async def test_a_stopped_copy_resumes_from_its_checkpoint(
    server: MakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline, "CHECKPOINT_BYTES", 2 * MiB)
    s = await server(mapped=False, bandwidth=8 * MiB)
    size = s.source.stat().st_size
    target = _target(tmp_path, size)
    stop, checkpoints = threading.Event(), []  # type: ignore[var-annotated]
    task = asyncio.create_task(_receive(s, target, stop=stop, checkpoints=checkpoints))
    await asyncio.sleep(1.0)
    stop.set()
    with pytest.raises(TransferError, match="stopped"):
        await task
    first = s.sent("data")
    assert checkpoints and 0 < checkpoints[-1].offset < size
    last = checkpoints[-1]
    s.server.limits = Limits(io_timeout=5)
    outcome = await _receive(s, target, resume=last)
    assert outcome.accept.offset == last.offset
    assert Path(target.path).read_bytes() == s.source.read_bytes()
    # what travelled again is at most what the first run sent past its last checkpoint
    assert s.sent("data") - first <= size - last.offset


async def test_a_resume_the_sender_cannot_vouch_for_starts_over(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = await server(mapped=True)
    size = s.source.stat().st_size
    target = _target(tmp_path, size)
    bogus = Checkpoint(3 * MiB + 4096, bytes(32), SOURCE_ID)  # not a segment boundary
    outcome = await _receive(s, target, resume=bogus)
    assert outcome.accept.offset == 0 and "not a segment boundary" in outcome.accept.note
    assert Path(target.path).read_bytes() == s.source.read_bytes()
    other = Checkpoint(2 * MiB, bytes(32), "another-lv-uuid")
    outcome = await _receive(s, target, resume=other)
    assert outcome.accept.offset == 0 and "source changed" in outcome.accept.note


async def test_a_refusal_or_a_wrong_certificate_stops_before_any_data(
    server: MakeServer, tmp_path: Path
) -> None:
    s = await server(mapped=True, refuse="forbidden")
    target = _target(tmp_path, s.source.stat().st_size)
    with pytest.raises(Refused, match="forbidden"):
        await _receive(s, target)
    with pytest.raises(PeerMismatch, match="other than the one its Node object publishes"):
        await _receive(s, target, fingerprint="ab" * 32)
    assert s.sent("data") == 0
    assert Path(target.path).read_bytes() == b"\xee" * len(Path(target.path).read_bytes())


def test_a_local_copy_checks_its_digest(tmp_path: Path) -> None:
    src = tmp_path / "source"
    mapped = _write_volume(src, 8 * MiB, seed=3)
    size = src.stat().st_size
    target = _target(tmp_path, size, chunk=65536)
    volume, out = Volume(str(src), writable=False), Volume(target.path, writable=True)
    source = pipeline.RecordSource(volume, size, plan.mapped(size, mapped))
    sink = pipeline.RecordSink(out, size, size, 65536, lambda o, d: None)
    pipeline.copy_local(source, sink, threading.Event(), pipeline.Throttle(0))
    assert Path(target.path).read_bytes() == src.read_bytes()
    # a sender whose END digest is another volume's: the copy fails, clearly
    source = pipeline.RecordSource(volume, size, plan.mapped(size, mapped))
    sink = pipeline.RecordSink(out, size, size, 65536, lambda o, d: None)
    for kind, offset, length, payload in source.records():
        if kind is wire.Kind.DATA:
            sink.data(offset, payload)
        else:
            sink.zero(offset, length)
    end = source.end()
    forged = messages.End(data_records=end.data_records, zero_records=end.zero_records,
                          data_bytes=end.data_bytes, zero_bytes=end.zero_bytes,
                          digest=os.urandom(32).hex())  # fmt: skip
    with pytest.raises(DigestMismatch, match="not the data read"):
        sink.end(forged, sink.counts)
    volume.close()
    out.close()


async def test_a_thin_target_an_earlier_attempt_wrote_into_is_cleared_before_it_starts_over(
    server: MakeServer, tmp_path: Path
) -> None:
    """A thin target skips the source's zeros: right for a new volume, wrong for one an
    earlier attempt wrote into (its source was made again since). Such a copy clears it."""
    s = await server(mapped=True)
    size = s.source.stat().st_size
    target = _target(tmp_path, size, chunk=65536)
    Path(target.path).write_bytes(b"\xaa" * size)  # an earlier attempt's data
    await _receive(s, target, fresh=False)
    assert Path(target.path).read_bytes() == s.source.read_bytes()


class _Recorded(Volume):
    def __init__(self, path: str) -> None:
        super().__init__(path, writable=True)
        self.zeroed: list[int] = []

    def zero(self, offset: int, length: int) -> None:
        self.zeroed.append(length)
        super().zero(offset, length)


def test_a_long_run_of_zeros_moves_in_bounded_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mostly empty thick volume: the sender reads many GiB of zeros. It sends a ZERO record
    at least every ``ZERO_RUN`` bytes read (so the receiver's I/O timeout never fires), and
    the receiver zeroes at most that much per call."""
    monkeypatch.setattr(pipeline, "ZERO_RUN", 4 * MiB)
    src = tmp_path / "source"
    with src.open("wb") as f:
        f.truncate(24 * MiB)
    target = _target(tmp_path, 24 * MiB)  # thick: every zero is written
    volume = Volume(str(src), writable=False)
    records = list(pipeline.RecordSource(volume, 24 * MiB, plan.full(24 * MiB)).records())
    assert [(k, length) for k, _, length, _ in records] == [(wire.Kind.ZERO, 4 * MiB)] * 6
    out = _Recorded(target.path)
    sink = pipeline.RecordSink(out, 24 * MiB, 24 * MiB, 0, lambda o, d: None)
    sink.zero(0, 24 * MiB)  # one record as long as the volume (an older sender)
    assert out.zeroed == [4 * MiB] * 6
    assert Path(target.path).read_bytes() == bytes(24 * MiB)
    volume.close()
    out.close()


async def test_a_peer_that_stalls_its_handshake_is_cut_off(server: MakeServer) -> None:
    """One deadline for the TLS handshake and the HELLO: a peer sending a byte now and then
    never holds a handshake thread for long."""
    s = await server(mapped=True)
    s.server.handshake_timeout = 1.0
    reader, writer = await asyncio.open_connection("127.0.0.1", s.server.port)

    async def trickle() -> bytes:
        while True:
            writer.write(b"\x16")  # a TLS record's first byte, then nothing useful
            await writer.drain()
            try:
                return await asyncio.wait_for(reader.read(1), 0.3)
            except TimeoutError:
                continue

    closed = await asyncio.wait_for(trickle(), 30)
    assert closed == b""  # the server closed the connection
    writer.close()


async def test_a_peer_that_ends_its_tls_session_before_hello_holds_nothing(
    server: MakeServer, tmp_path: Path
) -> None:
    """A peer completes the TLS handshake (no credential needed for that) and sends a
    close_notify instead of its HELLO: the sender drops it, and a copy started right after
    still runs (the read of a HELLO that will never come does not spin)."""
    s = await server(mapped=True)

    def close_at_once() -> None:
        raw = socket.create_connection(("127.0.0.1", s.server.port), timeout=5)
        with client_context().wrap_socket(raw) as tls, contextlib.suppress(OSError, ssl.SSLError):
            tls.unwrap()  # close_notify; the sender's own one, or its close, answers

    await asyncio.to_thread(close_at_once)
    size = s.source.stat().st_size
    target = _target(tmp_path, size)
    await asyncio.wait_for(_receive(s, target), 30)
    assert Path(target.path).read_bytes() == s.source.read_bytes()

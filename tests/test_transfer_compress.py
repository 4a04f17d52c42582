"""A copy's optional compression (``--transfer-compression zstd``), over real TLS on loopback
with files standing in for the volumes: what compresses travels smaller and the target still
equals the source (also across a resume), a receiver that did not ask (an older release) never
gets a ZDATA record, data that does not compress soon travels as it is, and a peer's word on
its features counts only for the start of the sender that said it."""

from __future__ import annotations

import asyncio
import os
import random
import threading
from pathlib import Path

import msgspec
import pytest
import zstandard

from tests import test_transfer_stream as stream
from tests.test_transfer_stream import MakeServer, Server, _target
from topolvm.k8s.lvobject import CopyStatus
from topolvm.node import copyreport
from topolvm.node.copyreport import cpu_per_gib
from topolvm.transfer import compress, messages, pipeline, wire
from topolvm.transfer.client import Checkpoint, Endpoint, Outcome, receive
from topolvm.transfer.compress import Compressor, Decompressor
from topolvm.transfer.errors import ProtocolError, TransferError
from topolvm.transfer.jobs import Limits, VolumeInfo

MiB = 1 << 20
GiB = 1 << 30
UID = "0b4f5c7e-1111-4222-8333-123456789abc"
ASK = (messages.COMPRESS, messages.SENDER_CPU)
server = stream.server  # the fixture: a sender on loopback


def _compressible(path: Path, size: int, seed: int = 7) -> None:
    """Log-like lines (compress several times over), with a random MiB every 8 MiB."""
    rng = random.Random(seed)
    words = [f"{w} " for w in ("INFO", "WARN", "insert", "row", "commit", "fsync", "table")]
    lines = bytearray()
    while len(lines) < 2 * MiB:
        lines += "".join(rng.choice(words) for _ in range(12)).encode() + b"\n"
    out = bytearray()
    while len(out) < size:
        i = len(out) // MiB
        out += rng.randbytes(MiB) if i % 8 == 5 else lines[i * 4099 % MiB :][:MiB]
    path.write_bytes(bytes(out[:size]))


async def _made(server: MakeServer, compress_on: bool = True, **kw: object) -> Server:
    s = await server(mapped=False, **kw)
    s.server.limits = Limits(io_timeout=5, compress=compress_on,
                             bandwidth=s.server.limits.bandwidth)  # fmt: skip
    return s


async def _receive(
    s: Server, target: VolumeInfo, features: tuple[str, ...] = ASK,
    resume: Checkpoint | None = None, stop: threading.Event | None = None,
    checkpoints: list[Checkpoint] | None = None,
) -> Outcome:  # fmt: skip
    endpoint = Endpoint("node-a", "127.0.0.1", s.server.port, s.server.fingerprint)
    hello = stream._hello(resume, features)
    seen = checkpoints if checkpoints is not None else []
    return await asyncio.to_thread(
        lambda: receive(endpoint, hello, target, seen.append, lambda *a: None,
                        stop or threading.Event(), 5.0)
    )  # fmt: skip


async def test_what_compresses_travels_smaller_and_the_target_equals_the_source(
    server: MakeServer, tmp_path: Path
) -> None:
    s = await _made(server)
    _compressible(s.source, s.source.stat().st_size)
    target = _target(tmp_path, s.source.stat().st_size)
    outcome = await _receive(s, target)
    assert Path(target.path).read_bytes() == s.source.read_bytes()
    assert outcome.data_bytes == s.source.stat().st_size
    # the log lines shrink several times; the random MiBs travel as they are
    assert outcome.wire_bytes < outcome.data_bytes / 2, (outcome.wire_bytes, outcome.data_bytes)
    wire_sent = s.metrics.wire_bytes.labels("node-a", "sender")._value.get()
    assert wire_sent == outcome.wire_bytes
    assert outcome.sender_cpu_seconds is not None and outcome.cpu_seconds > 0


async def test_a_receiver_that_does_not_ask_gets_plain_data_and_no_new_end_field(
    server: MakeServer, tmp_path: Path
) -> None:
    """An older receiver sends no features: the compressing sender sends it DATA only, and an
    END without the sender's CPU (a field it would refuse)."""
    s = await _made(server)
    _compressible(s.source, s.source.stat().st_size)
    target = _target(tmp_path, s.source.stat().st_size)
    outcome = await _receive(s, target, features=())
    assert Path(target.path).read_bytes() == s.source.read_bytes()
    assert outcome.wire_bytes == outcome.data_bytes
    assert outcome.sender_cpu_seconds is None


async def test_a_sender_that_does_not_compress_sends_plain_data_to_one_that_asks(
    server: MakeServer, tmp_path: Path
) -> None:
    s = await _made(server, compress_on=False)
    _compressible(s.source, s.source.stat().st_size)
    target = _target(tmp_path, s.source.stat().st_size)
    outcome = await _receive(s, target)
    assert outcome.wire_bytes == outcome.data_bytes
    assert Path(target.path).read_bytes() == s.source.read_bytes()


async def test_random_data_travels_as_it_is(server: MakeServer, tmp_path: Path) -> None:
    s = await _made(server)
    s.source.write_bytes(os.urandom(s.source.stat().st_size))
    target = _target(tmp_path, s.source.stat().st_size)
    outcome = await _receive(s, target)
    assert outcome.wire_bytes == outcome.data_bytes
    assert Path(target.path).read_bytes() == s.source.read_bytes()


async def test_a_compressed_copy_stopped_midway_resumes_from_its_checkpoint(
    server: MakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline, "CHECKPOINT_BYTES", 2 * MiB)
    s = await _made(server, bandwidth=2 * MiB)  # on the wire: the copy takes seconds
    _compressible(s.source, s.source.stat().st_size)
    size = s.source.stat().st_size
    target = _target(tmp_path, size)
    stop, checkpoints = threading.Event(), []  # type: ignore[var-annotated]
    task = asyncio.create_task(_receive(s, target, stop=stop, checkpoints=checkpoints))
    await asyncio.sleep(1.5)
    stop.set()
    with pytest.raises(TransferError, match="stopped"):
        await task
    assert checkpoints and 0 < checkpoints[-1].offset < size
    s.server.limits = Limits(io_timeout=5, compress=True)
    outcome = await _receive(s, target, resume=checkpoints[-1])
    assert outcome.accept.offset == checkpoints[-1].offset
    assert Path(target.path).read_bytes() == s.source.read_bytes()


def test_the_compressor_stops_trying_on_data_that_does_not_compress_and_tries_again() -> None:
    c = Compressor()
    noise = memoryview(os.urandom(MiB))
    text = memoryview(b"commit row fsync\n" * (MiB // 17))
    assert all(c.compress(noise) is None for _ in range(compress.MISSES))
    tried = c.tried_bytes
    for _ in range(compress.BACKOFF):  # backed off: not even compressed
        assert c.compress(text) is None
    assert c.tried_bytes == tried
    packed = c.compress(text)  # tried again: it compresses now
    assert packed is not None and len(packed) < len(text) / 10
    assert Decompressor().decompress(memoryview(packed), len(text), memoryview(
        bytearray(MiB)))  == text  # fmt: skip


def test_a_zdata_payload_must_fill_exactly_its_range() -> None:
    d, into = Decompressor(), memoryview(bytearray(MiB))
    packed = zstandard.ZstdCompressor().compress(b"x" * 4096)
    assert bytes(d.decompress(memoryview(packed), 4096, into)) == b"x" * 4096
    with pytest.raises(ProtocolError, match="holds 4096 bytes, its record 8192"):
        d.decompress(memoryview(packed), 8192, into)
    with pytest.raises(ProtocolError, match="does not decompress"):
        d.decompress(memoryview(packed[:-4] + b"\0\0\0\0"), 4096, into)
    with pytest.raises(ProtocolError, match="a segment is"):
        d.decompress(memoryview(packed), 2 * MiB, memoryview(bytearray(2 * MiB)))
    # bytes after the frame, or a second frame, are refused: one record, one frame
    with pytest.raises(ProtocolError, match="does not decompress"):
        d.decompress(memoryview(packed + b"junk"), 4096, into)
    with pytest.raises(ProtocolError, match="does not decompress"):
        d.decompress(memoryview(packed + packed), 4096, into)
    # a frame that does not say its size (a stream) is refused too
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 4096)
    with pytest.raises(ProtocolError, match="holds"):
        d.decompress(memoryview(unsized), 4096, into)


def test_a_zdata_header_is_bounded_like_a_data_one() -> None:
    body = b"z" * 100
    head = wire.pack_header(wire.Kind.ZDATA, 0, 4096, body)
    assert wire.Header(head).kind is wire.Kind.ZDATA
    with pytest.raises(ProtocolError, match="crosses a segment boundary"):
        wire.Header(wire.pack_header(wire.Kind.ZDATA, MiB - 4096, 8192, body))
    with pytest.raises(ProtocolError, match="of no bytes"):
        wire.Header(wire.pack_header(wire.Kind.ZDATA, 0, 4096, b""))
    with pytest.raises(ProtocolError, match="ZDATA covers 4096 bytes but carries 4096"):
        wire.Header(wire.pack_header(wire.Kind.ZDATA, 0, 4096, b"z" * 4096))  # not smaller
    with pytest.raises(ProtocolError, match="payload of"):
        wire.Header(wire.pack_header(wire.Kind.ZDATA, 0, MiB, b"z" * (MiB + 1)))


class _OldHello(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A HELLO as a release without features decodes it."""

    version: int
    token: str
    job: str
    job_uid: str
    resume: messages.Resume | None = None


def test_a_hello_without_features_is_one_an_older_sender_reads() -> None:
    hello = messages.Hello(version=1, token="t", job="pvc-target", job_uid=UID)
    assert msgspec.json.decode(messages.encode(hello), type=_OldHello).job == "pvc-target"
    asking = messages.Hello(version=1, token="t", job="j", job_uid=UID, features=ASK)
    with pytest.raises(msgspec.ValidationError, match="features"):
        msgspec.json.decode(messages.encode(asking), type=_OldHello)


def test_a_senders_features_count_only_for_its_own_start() -> None:
    fp = "AB" * 32
    published = messages.publish_features(fp, ["sender-cpu", "zstd"])
    assert messages.honoured(published, fp) == {"sender-cpu", "zstd"}
    # restarted (a new key), maybe as an older release that publishes no features
    assert messages.honoured(published, "cd" * 32) == frozenset()
    assert messages.honoured("", fp) == frozenset()
    assert messages.honoured(f"{fp[:16].lower()}:zstd,teleport", fp) == {"zstd"}


def test_status_copy_says_the_cpu_a_gib_cost_on_each_side_and_the_bytes_on_the_wire() -> None:
    accept = messages.Accept(size=GiB, offset=0, source_id="s", source="x")
    outcome = Outcome(accept, b"", data_bytes=512 * MiB, zero_bytes=0, wire_bytes=128 * MiB,
                      cpu_seconds=0.4, sender_cpu_seconds=0.3)  # fmt: skip
    assert cpu_per_gib(outcome) == (600, 800)
    older = Outcome(accept, b"", 512 * MiB, 0, cpu_seconds=0.4)  # its sender said nothing
    assert cpu_per_gib(older) == (0, 800)
    assert cpu_per_gib(Outcome(accept, b"", MiB, 0, cpu_seconds=0.4)) == (0, 0)  # too little
    # a sender's word is bounded (the field is an int64 the API server checks)
    liar = Outcome(accept, b"", 64 * MiB, 0, cpu_seconds=0.1, sender_cpu_seconds=10.0**7)
    assert cpu_per_gib(liar) == (copyreport.CPU_FIGURE_MAX, 1600)
    status = CopyStatus(wire_bytes=128 * MiB, sender_cpu_ms_per_gib=600,
                        receiver_cpu_ms_per_gib=800)  # fmt: skip
    raw = status.to_dict()
    assert raw["wireBytes"] == 128 * MiB and raw["senderCPUMillisPerGiB"] == 600
    assert CopyStatus.from_dict(raw) == status

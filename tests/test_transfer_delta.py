"""A delta copy over real TLS on loopback, files standing in for the volumes: the target holds
snapshot A of a source (an earlier full copy), the sender holds A (the base) and B (the new
source), and only what differs between them travels. What a user of the claim move relies on:
the target ends equal to B byte for byte (zeros written where B has zeros and A had data, on a
thin target too), only the differing ranges travel as DATA, a stopped delta copy resumes from
its checkpoint, and a base of another size is refused before any data moves."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from topolvm.node.lvmd_client import LvmdCallError
from topolvm.node.volumes import LvmdVolumes
from topolvm.rpc.transport import Status
from topolvm.transfer import messages, pipeline, plan, wire
from topolvm.transfer.blockio import Volume
from topolvm.transfer.client import Checkpoint, Endpoint, Outcome, receive
from topolvm.transfer.errors import ProtocolError, Refused, SourceFailed, TransferError
from topolvm.transfer.jobs import Job, Limits, VolumeInfo
from topolvm.transfer.metrics import TransferMetrics
from topolvm.transfer.server import TransferServer

MiB = 1 << 20
SEG = wire.SEGMENT
CHUNK = 64 << 10
SIZE = 24 * MiB + CHUNK
UID = "0b4f5c7e-1111-4222-8333-123456789abc"
SOURCE_ID = "Zr3pQe-1AbC-9xYz-2DeF-3GhI-4JkL-5MnOpQ"


class Volumes:
    """A source ``src`` (B) and its base ``base`` (A); ``changed`` is what lvmd says differs
    (None: it cannot say)."""

    def __init__(self, source: Path, base: Path, thin: bool, changed: list[tuple[int, int]] | None):
        self.paths = {"src": source, "base": base}
        self.thin = thin
        self.ranges = changed
        self.asked: list[tuple[str, str, bool]] = []  # (name, base, thin)

    async def describe(self, name: str, device_class: str, with_uuid: bool = False) -> VolumeInfo:
        path = self.paths[name]
        uuid = SOURCE_ID if name == "src" else "base-uuid"
        return VolumeInfo(
            str(path), path.stat().st_size, self.thin, CHUNK if self.thin else 0, uuid
        )

    async def mapped(self, name: str, device_class: str) -> list[tuple[int, int]] | None:
        raise AssertionError("a delta copy asks what changed, not what is mapped")

    async def changed(
        self, name: str, base: str, device_class: str, thin: bool = True
    ) -> list[tuple[int, int]] | None:
        self.asked.append((name, base, thin))
        return self.ranges


class Pair:
    """A: random data in every third chunk. B: A with some chunks rewritten (``new``), some
    zeroed where A had data (``cleared``), and one rewritten with the bytes it had (``same``,
    which a thin pool maps anew all the same); ``changed`` are those chunks, as lvmd says."""

    def __init__(self, tmp: Path, seed: int, every_segment: bool = False) -> None:
        rng = random.Random(seed)
        a = bytearray(SIZE)
        for off in range(0, SIZE, 3 * CHUNK):
            a[off : off + CHUNK] = rng.randbytes(CHUNK)
        b = bytearray(a)
        per_segment = SEG // CHUNK
        if every_segment:  # a chunk rewritten in every segment
            self.new, self.cleared, self.same = list(range(0, SIZE // CHUNK, per_segment)), [], []
        else:  # chunks never adjacent: each is a changed range of its own
            picked = rng.sample(range(0, SIZE // CHUNK, 2), 40)
            full = [c for c in picked if self._had_data(a, c)]
            self.cleared, self.same = full[:8], full[8:9]
            self.new = [c for c in picked if c not in full[:9]]
        for c in self.new:
            b[c * CHUNK : (c + 1) * CHUNK] = rng.randbytes(CHUNK)
        for c in self.cleared:
            b[c * CHUNK : (c + 1) * CHUNK] = bytes(CHUNK)
        self.a, self.b = bytes(a), bytes(b)
        self.base, self.source = tmp / "a", tmp / "b"
        self.base.write_bytes(self.a)
        self.source.write_bytes(self.b)
        self.changed = plan.merge((c * CHUNK, CHUNK) for c in self.new + self.cleared + self.same)

    @staticmethod
    def _had_data(a: bytearray, c: int) -> bool:
        return a[c * CHUNK : (c + 1) * CHUNK] != bytes(CHUNK)

    def target(self, tmp: Path, chunk: int) -> VolumeInfo:
        """A target that an earlier full copy filled with A."""
        path = tmp / "target"
        path.write_bytes(self.a)
        return VolumeInfo(str(path), SIZE, chunk > 0, chunk, "t-uuid")


class Sender:
    def __init__(self, volumes: Volumes, bandwidth: int = 0) -> None:
        self.volumes = volumes
        self.metrics = TransferMetrics(None, "node-a")

        async def authorise(hello: messages.Hello) -> Job:
            return Job(UID, "pvc-target", "node-b", "src", "ssd", "snapshot-b", base="base")

        limits = Limits(bandwidth=bandwidth, io_timeout=5)
        self.server = TransferServer("node-a", authorise, volumes, limits, self.metrics)

    def sent(self, counter: str) -> float:
        return float(getattr(self.metrics, counter).labels("node-a", "sender")._value.get())

    async def receive(
        self, target: VolumeInfo, resume: Checkpoint | None = None,
        stop: threading.Event | None = None, checkpoints: list[Checkpoint] | None = None,
    ) -> Outcome:  # fmt: skip
        endpoint = Endpoint("node-a", "127.0.0.1", self.server.port, self.server.fingerprint)
        r = None
        if resume is not None:
            r = messages.Resume(offset=resume.offset, digest=resume.digest.hex(),
                                source_id=resume.source_id)  # fmt: skip
        hello = messages.Hello(version=1, token="t", job="pvc-target", job_uid=UID, resume=r)
        seen = checkpoints if checkpoints is not None else []
        return await asyncio.to_thread(
            lambda: receive(endpoint, hello, target, seen.append, lambda *a: None,
                            stop or threading.Event(), 5.0, fresh=False)
        )  # fmt: skip


MakeSender = Callable[..., Awaitable[Sender]]


@pytest.fixture
async def sender() -> AsyncIterator[MakeSender]:
    made: list[Sender] = []

    async def make(volumes: Volumes, bandwidth: int = 0) -> Sender:
        s = Sender(volumes, bandwidth)
        await s.server.start("127.0.0.1", 0)
        made.append(s)
        return s

    yield make
    for s in made:
        await s.server.stop()


@pytest.mark.parametrize("chunk", [0, CHUNK], ids=["thick-target", "thin-target"])
async def test_a_thin_delta_sends_only_the_changed_chunks_and_the_target_becomes_b(
    sender: MakeSender, tmp_path: Path, chunk: int
) -> None:
    v = Pair(tmp_path, seed=1)
    assert v.new and v.cleared and v.same
    volumes = Volumes(v.source, v.base, thin=True, changed=v.changed)
    s = await sender(volumes)
    target = v.target(tmp_path, chunk)
    outcome = await s.receive(target)
    assert Path(target.path).read_bytes() == v.b
    assert volumes.asked == [("src", "base", True)]
    assert outcome.accept.delta and "delta against base" in outcome.accept.source
    # rewritten chunks travel as data, cleared ones as zeros (written: the target held A's
    # data there), the one rewritten with its old bytes and all the rest are kept
    assert outcome.data_bytes == len(v.new) * CHUNK == s.sent("data_bytes")
    assert outcome.zero_bytes == len(v.cleared) * CHUNK == s.sent("zero_bytes")
    assert outcome.keep_bytes == SIZE - (len(v.new) + len(v.cleared)) * CHUNK
    assert s.sent("keep_bytes") == outcome.keep_bytes


@pytest.mark.parametrize("chunk", [0, CHUNK], ids=["thick-target", "thin-target"])
async def test_a_thick_delta_compares_every_segment_and_sends_those_that_differ(
    sender: MakeSender, tmp_path: Path, chunk: int
) -> None:
    v = Pair(tmp_path, seed=2)
    b = bytearray(v.a)  # B: A with a chunk rewritten in two segments, and one segment cleared
    for c in (2 * SEG // CHUNK + 5, 7 * SEG // CHUNK + 1):
        b[c * CHUNK : (c + 1) * CHUNK] = random.Random(c).randbytes(CHUNK)
    assert v.a[11 * SEG : 12 * SEG] != bytes(SEG)
    b[11 * SEG : 12 * SEG] = bytes(SEG)
    v.b = bytes(b)
    v.source.write_bytes(v.b)
    volumes = Volumes(v.source, v.base, thin=False, changed=None)  # lvmd cannot say
    s = await sender(volumes)
    target = v.target(tmp_path, chunk)
    outcome = await s.receive(target)
    assert Path(target.path).read_bytes() == v.b
    assert volumes.asked == [("src", "base", False)]  # its cuts' exception tables, unknown
    assert "compared block by block" in outcome.accept.source
    # the two segments with a rewritten chunk travel whole; the cleared one as zeros
    assert (outcome.data_bytes, outcome.zero_bytes) == (2 * SEG, SEG)
    assert outcome.keep_bytes == SIZE - 3 * SEG


async def test_a_thick_delta_reads_only_the_chunks_its_cuts_list(
    sender: MakeSender, tmp_path: Path
) -> None:
    """Two thick cuts of one origin: lvmd lists the chunks written between them (the older
    cut's exception table, in its own chunk size), and only those are read and compared; one
    listed chunk was written with the bytes it had, and is kept."""
    v = Pair(tmp_path, seed=4)
    b = bytearray(v.a)
    written = [3, 40, 41, 200]  # chunks of the table (CHUNK bytes each)
    for c in written[:-1]:
        b[c * CHUNK : (c + 1) * CHUNK] = random.Random(c).randbytes(CHUNK)
    v.b = bytes(b)
    v.source.write_bytes(v.b)
    listed = [(3 * CHUNK, CHUNK), (40 * CHUNK, 2 * CHUNK), (200 * CHUNK, CHUNK)]
    volumes = Volumes(v.source, v.base, thin=False, changed=listed)
    s = await sender(volumes)
    target = v.target(tmp_path, 0)
    outcome = await s.receive(target)
    assert Path(target.path).read_bytes() == v.b
    assert volumes.asked == [("src", "base", False)]
    assert "thick, its changed chunks" in outcome.accept.source
    assert outcome.data_bytes == 3 * CHUNK  # chunk 200 was listed, but holds what it held
    assert outcome.keep_bytes == SIZE - 3 * CHUNK


async def test_a_stopped_delta_copy_resumes_from_its_checkpoint(
    sender: MakeSender, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline, "CHECKPOINT_BYTES", 2 * MiB)
    v = Pair(tmp_path, seed=3, every_segment=True)
    volumes = Volumes(v.source, v.base, thin=True, changed=v.changed)
    s = await sender(volumes, bandwidth=CHUNK * 3)  # about a segment a second
    target = v.target(tmp_path, CHUNK)
    stop, checkpoints = threading.Event(), []  # type: ignore[var-annotated]
    task = asyncio.create_task(s.receive(target, stop=stop, checkpoints=checkpoints))
    for _ in range(100):
        await asyncio.sleep(0.1)
        if checkpoints and checkpoints[-1].offset >= 3 * SEG:
            break
    stop.set()
    with pytest.raises(TransferError, match="stopped"):
        await task
    last = checkpoints[-1]
    assert 0 < last.offset < SIZE
    ended = s.metrics.finished.labels("node-a", "sender", "failed")
    for _ in range(100):  # the first stream's sender may send a record more before it ends
        if ended._value.get():
            break
        await asyncio.sleep(0.05)
    first = s.sent("data_bytes")
    s.server.limits = Limits(io_timeout=5)
    outcome = await s.receive(target, resume=last)
    assert outcome.accept.offset == last.offset and outcome.accept.delta
    assert Path(target.path).read_bytes() == v.b
    # only the changed chunks past the checkpoint travelled again
    again = s.sent("data_bytes") - first
    assert again == outcome.data_bytes == sum(1 for c in v.new if c * CHUNK >= last.offset) * CHUNK


async def test_a_base_of_another_size_is_refused_before_any_data(
    sender: MakeSender, tmp_path: Path
) -> None:
    v = Pair(tmp_path, seed=4)
    v.base.write_bytes(v.a + bytes(CHUNK))
    s = await sender(Volumes(v.source, v.base, thin=True, changed=v.changed))
    target = v.target(tmp_path, CHUNK)
    with pytest.raises(Refused, match="base base has"):
        await s.receive(target)
    assert s.sent("data_bytes") == 0
    assert Path(target.path).read_bytes() == v.a


def test_a_local_delta_copy_and_a_sink_that_is_not_one(tmp_path: Path) -> None:
    v = Pair(tmp_path, seed=5)
    target = v.target(tmp_path, CHUNK)
    src, base = Volume(str(v.source), writable=False), Volume(str(v.base), writable=False)
    out = Volume(target.path, writable=True)
    try:
        source = pipeline.RecordSource(src, SIZE, plan.delta(SIZE, v.changed), base=base)
        sink = pipeline.RecordSink(out, SIZE, SIZE, CHUNK, lambda o, d: None, delta=True)
        pipeline.copy_local(source, sink, threading.Event(), pipeline.Throttle(0))
        assert Path(target.path).read_bytes() == v.b
        assert sink.counts == source.counts and sink.counts.keep_records > 0
        # a KEEP record in a full copy is the peer's error, not a range left as it was
        full = pipeline.RecordSink(out, SIZE, SIZE, CHUNK, lambda o, d: None)
        with pytest.raises(ProtocolError, match="not a delta"):
            full.keep(0, CHUNK)
        # a delta plan without a base cannot be read
        with pytest.raises(ValueError, match="without a base"):
            list(pipeline.RecordSource(src, SIZE, plan.delta(SIZE, v.changed)).records())
    finally:
        for volume in (src, base, out):
            volume.close()


class _Lvmd:
    def __init__(self, code: Status | None) -> None:
        self.code = code

    async def thin_delta(
        self, name: str, base: str, device_class: str
    ) -> AsyncIterator[tuple[int, int]]:
        if self.code is not None:
            raise LvmdCallError(self.code, "no")
        yield (0, CHUNK)
        yield (4 * CHUNK, CHUNK)


async def test_the_node_asks_lvmd_what_changed_and_falls_back_to_comparing_all() -> None:
    def volumes(code: Status | None) -> LvmdVolumes:
        return LvmdVolumes(_Lvmd(code))  # type: ignore[arg-type]

    assert await volumes(None).changed("b", "a", "thin") == [(0, CHUNK), (4 * CHUNK, CHUNK)]
    # an lvmd without ThinDelta, or without thin_dump: unknown, so every range is compared
    assert await volumes(Status.UNIMPLEMENTED).changed("b", "a", "thin") is None
    assert await volumes(Status.FAILED_PRECONDITION).changed("b", "a", "thin") is None
    for code in (Status.NOT_FOUND, Status.UNAVAILABLE):
        with pytest.raises(SourceFailed, match="cannot compare LV b with a"):
            await volumes(code).changed("b", "a", "thin")

"""A copy in several streams, sender and receivers over real TLS on loopback, files standing
in for the volumes: the target ends equal to the source and sparse where the source is, in
every part; a copy stopped on the receiver's side, one whose sender restarts, and one whose
link is cut resume each part from its own checkpoint and end with the same digest."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from pathlib import Path

import msgspec
import pytest

from tests import test_transfer_stream as stream
from tests.test_transfer_stream import UID, MakeServer, Server, _target
from topolvm.transfer import digest, messages, pipeline, plan
from topolvm.transfer.client import Endpoint, Outcome, receive
from topolvm.transfer.errors import Refused, TransferError
from topolvm.transfer.jobs import Limits, VolumeInfo
from topolvm.transfer.streams import PartPoint, Parts, receive_parts

server = stream.server  # the fixture: a sender on loopback
MiB = 1 << 20
PARTS = Parts(4, MiB)  # a 24 MiB volume in four parts of 6 MiB


def _hello() -> messages.Hello:
    return messages.Hello(version=1, token="t", job="pvc-target", job_uid=UID,
                          features=(messages.STREAMS,))  # fmt: skip


def _expected(source: Path, parts: Parts) -> bytes:
    """The digest a copy of ``source`` in ``parts`` must end with, computed here."""
    data = source.read_bytes()
    size, chains = len(data), []
    for index in range(parts.count):
        begin, end = plan.part(size, index, parts.count, parts.unit)
        d = digest.VolumeDigest(size, begin, span=(begin, end))
        d.feed_data(begin, data[begin:end])
        chains.append(d.final())
    return digest.combined(size, chains)


class Points(dict[int, PartPoint]):
    """The parts' checkpoints, as the node's status keeps them."""

    def persist(self, index: int, point: PartPoint | None) -> None:
        if point is None:
            self.pop(index, None)
        else:
            self[index] = point


async def _receive_parts(
    s: Server, target: VolumeInfo, points: Points, stop: threading.Event | None = None,
    port: int = 0, parts: Parts = PARTS, fresh: bool = True,
) -> Outcome:  # fmt: skip
    endpoint = Endpoint("node-a", "127.0.0.1", port or s.server.port, s.server.fingerprint,
                        frozenset({messages.STREAMS}))  # fmt: skip
    resumes = dict(points)

    def work() -> Outcome:
        return receive_parts(endpoint, _hello(), target, parts, resumes, points.persist,
                             lambda *a: None, stop or threading.Event(), 5.0,
                             fresh=fresh)  # fmt: skip

    return await asyncio.to_thread(work)


async def _every_part_checkpointed(points: Points) -> None:
    for _ in range(300):  # the parts' threads fill it: polled
        if len(points) == PARTS.count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"only parts {sorted(points)} reached a checkpoint in 30 s")


def _holes(path: str, begin: int, end: int) -> bool:
    """No data is stored in ``[begin, end)`` of the file: it reads as zeros, unwritten."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, begin, os.SEEK_DATA) >= end
    except OSError:  # ENXIO: no data past begin at all
        return True
    finally:
        os.close(fd)


async def test_a_thin_copy_in_four_streams_equals_its_source_and_stays_sparse_in_every_part(
    server: MakeServer, tmp_path: Path
) -> None:
    s = await server(mapped=True, data_every=5)
    s.server.limits = Limits(concurrency=1, io_timeout=5)  # the four streams are one copy
    size = s.source.stat().st_size
    target = _target(tmp_path, size, chunk=65536)
    points = Points()
    outcome = await _receive_parts(s, target, points)
    assert Path(target.path).read_bytes() == s.source.read_bytes()
    assert outcome.digest == _expected(s.source, PARTS)
    mapped = sum(length for _, length in s.mapped)
    assert outcome.data_bytes == mapped and s.sent("data") == mapped
    assert s.volumes.mapped_reads == 1  # the four streams read one mapping of the pool
    assert outcome.zero_bytes == size - mapped
    # every part's range has holes in the source: the target has them too, unwritten
    for index in range(PARTS.count):
        begin, end = plan.part(size, index, PARTS.count, PARTS.unit)
        gaps = [(a + b, c) for (a, b), (c, _) in zip(s.mapped, s.mapped[1:], strict=False)
                if begin <= a + b and c <= end and c - (a + b) >= 65536]  # fmt: skip
        assert gaps, f"part {index} has no hole to check"
        assert all(_holes(target.path, a, c) for a, c in gaps)
        assert points[index].point.offset == end  # each part is checkpointed complete


async def test_a_copy_in_streams_stopped_midway_resumes_every_part_from_its_checkpoint(
    server: MakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline, "CHECKPOINT_BYTES", 2 * MiB)
    s = await server(mapped=False, bandwidth=4 * MiB)  # the copy's, shared by its streams
    size = s.source.stat().st_size
    target = _target(tmp_path, size)
    points, stop = Points(), threading.Event()
    task = asyncio.create_task(_receive_parts(s, target, points, stop=stop))
    await _every_part_checkpointed(points)
    stop.set()
    with pytest.raises(TransferError, match="stopped"):
        await task
    first = s.sent("data")
    held = dict(points)
    spans = {i: plan.part(size, i, 4, MiB) for i in held}
    assert all(spans[i][0] < p.point.offset <= spans[i][1] for i, p in held.items())
    assert any(p.point.offset < spans[i][1] for i, p in held.items())  # one stopped midway
    s.server.limits = Limits(io_timeout=5)
    outcome = await _receive_parts(s, target, points, fresh=False)
    assert Path(target.path).read_bytes() == s.source.read_bytes()
    assert outcome.digest == _expected(s.source, PARTS)
    # what travelled again is at most what each part had left past its checkpoint
    left = sum(plan.part(size, i, 4, MiB)[1] - p.point.offset for i, p in held.items())
    assert s.sent("data") - first <= left


async def test_a_copy_in_streams_resumes_after_its_sender_restarts(
    server: MakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sender's process goes (every stream cut at once) and a new one, which remembers
    nothing of the job, serves the resume: each part goes on from its checkpoint."""
    monkeypatch.setattr(pipeline, "CHECKPOINT_BYTES", 2 * MiB)
    s = await server(mapped=True, bandwidth=8 * MiB, data_every=1)
    size = s.source.stat().st_size
    target = _target(tmp_path, size, chunk=65536)
    points = Points()
    task = asyncio.create_task(_receive_parts(s, target, points))
    await _every_part_checkpointed(points)
    await s.server.stop()
    with pytest.raises(TransferError):
        await task
    again = await server(mapped=True, data_every=1)  # a new process over the same source
    assert again.source == s.source
    held = dict(points)
    outcome = await _receive_parts(again, target, points, fresh=False)
    assert Path(target.path).read_bytes() == s.source.read_bytes()
    assert outcome.digest == _expected(s.source, PARTS)
    left = sum(plan.part(size, i, 4, MiB)[1] - p.point.offset for i, p in held.items())
    assert again.sent("data") <= left < size


class CuttingProxy:
    """A TCP relay on loopback in front of the sender that cuts the ``victim``-th connection
    (counted from 1) once ``after`` bytes went through it towards the receiver: a link lost in
    the middle of one stream."""

    def __init__(self, port: int, victim: int, after: int) -> None:
        self.target, self.victim, self.after = port, victim, after
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut = threading.Event()
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.target))
            limit = self.after if self.connections == self.victim else -1
            threading.Thread(target=self._pipe, args=(client, upstream, -1), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, limit),
                             daemon=True).start()  # fmt: skip

    def _pipe(self, src: socket.socket, dst: socket.socket, limit: int) -> None:
        moved = 0
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                moved += len(data)
                if 0 <= limit <= moved:
                    self.cut.set()
                    break
        except OSError:
            pass
        for end in (src, dst):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        self.listener.close()


async def test_a_copy_in_streams_whose_link_is_cut_in_one_stream_resumes_and_verifies(
    server: MakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline, "CHECKPOINT_BYTES", 2 * MiB)
    s = await server(mapped=False, bandwidth=8 * MiB)
    size = s.source.stat().st_size
    target = _target(tmp_path, size)
    proxy = CuttingProxy(s.server.port, victim=3, after=3 * MiB)
    points = Points()
    try:
        with pytest.raises(TransferError):
            await _receive_parts(s, target, points, port=proxy.port)
    finally:
        proxy.close()
    assert proxy.cut.is_set()
    s.server.limits = Limits(io_timeout=5)
    outcome = await _receive_parts(s, target, points, fresh=False)
    assert Path(target.path).read_bytes() == s.source.read_bytes()
    assert outcome.digest == _expected(s.source, PARTS)


async def test_a_stream_asking_for_a_part_that_does_not_exist_is_refused(
    server: MakeServer, tmp_path: Path
) -> None:
    s = await server(mapped=True)
    target = _target(tmp_path, s.source.stat().st_size)
    endpoint = Endpoint("node-a", "127.0.0.1", s.server.port, s.server.fingerprint)
    hello = msgspec.structs.replace(_hello(), part=messages.Part(index=5, count=4, unit=MiB))
    with pytest.raises(Refused, match="part 5 of 4") as refused:
        await asyncio.to_thread(receive, endpoint, hello, target, lambda cp: None,
                                lambda *a: None, threading.Event(), 5.0)  # fmt: skip
    assert refused.value.reason == "invalid" and s.sent("data") == 0


async def test_a_part_resumed_at_its_end_sends_nothing_even_inside_a_chunk(
    server: MakeServer, tmp_path: Path
) -> None:
    """A copy whose every part is complete, tried again (its Done was not written): each part
    resumes at its end, the last one's inside a chunk of the thin target (the volume's end)."""
    s = await server(mapped=True)
    size = s.source.stat().st_size
    target = _target(tmp_path, size, chunk=128 << 10)  # the size is 24 MiB + 64 KiB
    points = Points()
    first = await _receive_parts(s, target, points)
    sent = s.sent("data")
    again = await _receive_parts(s, target, points, fresh=False)
    assert s.sent("data") == sent and again.data_bytes == 0
    assert again.digest == first.digest == _expected(s.source, PARTS)
    assert Path(target.path).read_bytes() == s.source.read_bytes()


async def test_a_checkpoint_of_another_split_is_never_resumed_from(
    server: MakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints kept from a copy in three parts, offered to one in four: a point inside
    the new part's range but of another range is void, and that part starts over."""
    monkeypatch.setattr(pipeline, "CHECKPOINT_BYTES", 2 * MiB)
    s = await server(mapped=False, bandwidth=8 * MiB)
    size = s.source.stat().st_size
    target = _target(tmp_path, size)
    points, stop = Points(), threading.Event()
    three = Parts(3, MiB)
    task = asyncio.create_task(_receive_parts(s, target, points, stop=stop, parts=three))
    for _ in range(300):
        if len(points) == 3:
            break
        await asyncio.sleep(0.1)
    stop.set()
    with pytest.raises(TransferError):
        await task
    s.server.limits = Limits(io_timeout=5)
    with pytest.raises(TransferError, match="of the range"):
        await _receive_parts(s, target, points, fresh=False)
    outcome = await _receive_parts(s, target, points, fresh=False)  # the next attempt
    assert Path(target.path).read_bytes() == s.source.read_bytes()
    assert outcome.digest == _expected(s.source, PARTS)


async def test_more_streams_than_a_sender_authorises_at_once_connect_one_after_another(
    server: MakeServer, tmp_path: Path
) -> None:
    """The sender authorises few HELLOs of one address at once (a TokenReview each) and
    refuses more as busy: six parts connect one after the other and all get through."""
    s = await server(mapped=True, slow=0.2)
    size = s.source.stat().st_size
    target = _target(tmp_path, size, chunk=65536)
    outcome = await _receive_parts(s, target, Points(), parts=Parts(6, MiB))
    assert Path(target.path).read_bytes() == s.source.read_bytes()
    assert outcome.digest == _expected(s.source, Parts(6, MiB))

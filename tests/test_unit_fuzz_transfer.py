"""Seeded fuzzing (hypothesis) of what reaches the transfer port and its receiver from the
network (docs/mobility.md): frames of any shape, streams with one record dropped, repeated,
moved or flipped, resume requests, HELLOs, tokens (nested deep, too long) and TokenReview
answers. The property is the one of tests/test_unit_fuzz.py: a clear, typed error or a correct
result; never another exception, never a byte written outside the target, never a copy
reported done with other data.

The receiver reads from a socket pair here (TLS has nothing to add to what is parsed); the
sender is fuzzed over real TLS on loopback."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz_helpers import fuzz as fuzz_settings
from tests.fuzz_helpers import json_values
from topolvm.transfer import auth, messages, pipeline, plan, server, wire
from topolvm.transfer import resume as sender_memory
from topolvm.transfer.blockio import Volume
from topolvm.transfer.client import Outcome, _fill, connect
from topolvm.transfer.conn import Conn
from topolvm.transfer.door import PortLimits
from topolvm.transfer.errors import ProtocolError, Refused, TransferError
from topolvm.transfer.jobs import Job, Limits, VolumeInfo
from topolvm.transfer.metrics import TransferMetrics

fuzz = fuzz_settings(200)
SEG = wire.SEGMENT
SIZE = 3 * SEG + 8192
UID = "0b4f5c7e-1111-4222-8333-123456789abc"
AUDIENCE = auth.audience("a")  # node a's port
HELLO = messages.Hello(version=1, token="t", job="pvc-a", job_uid=UID)
ACCEPT = messages.Accept(size=SIZE, offset=0, source_id="src", source="test")


def _source_bytes(seed: int) -> bytes:
    rng = random.Random(seed)
    out = bytearray(SIZE)
    for _ in range(6):
        at = rng.randrange(0, SIZE - 4096) // 4096 * 4096
        out[at : at + 4096] = rng.randbytes(4096)
    return bytes(out)


def _stream(tmp: Path, data: bytes) -> list[bytes]:
    """The frames a sender makes of ``data`` (a thick source), END included."""
    path = tmp / "src"
    path.write_bytes(data)
    volume = Volume(str(path), writable=False)
    try:
        source = pipeline.RecordSource(volume, SIZE, plan.full(SIZE))
        frames = [wire.pack_header(k, o, n, p) + bytes(p) for k, o, n, p in source.records()]
        frames.append(wire.control(wire.Kind.END, messages.encode(source.end())))
    finally:
        volume.close()
    return frames


def _receive(tmp: Path, frames: list[bytes]) -> tuple[Outcome | TransferError, bytes]:
    """``frames`` into the receiver (then the peer hangs up); its result and the target."""
    target = tmp / "target"
    target.write_bytes(b"\xee" * SIZE)
    ours, theirs = socket.socketpair()
    ours.settimeout(5)

    def feed() -> None:
        try:
            theirs.sendall(b"".join(frames))
            theirs.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the receiver gave up and closed its end

    feeder = threading.Thread(target=feed)
    feeder.start()
    conn = Conn(ours, "fuzz")
    info = VolumeInfo(str(target), SIZE, False, 0, "t")
    try:
        result: Outcome | TransferError = _fill(
            conn, HELLO, ACCEPT, info, lambda c: None, lambda *a: None, threading.Event(), True
        )
    except TransferError as e:
        result = e
    finally:
        conn.close()  # first: a feeder blocked on a full socket then fails and ends
        feeder.join()
        theirs.close()
    written = target.read_bytes()
    assert len(written) == SIZE  # nothing past the target's end
    return result, written


def _frame(kind: int, offset: int, length: int, payload: bytes, corrupt: bool) -> bytes:
    raw = wire._HEAD.pack(wire.MAGIC, kind, 0, 0, offset, length, len(payload))
    check = wire._checksum(raw, payload) ^ (1 if corrupt else 0)
    return raw + check.to_bytes(8, "big") + payload


kinds = st.sampled_from(list(wire.Kind)) | st.integers(0, 255)
frames = st.lists(
    st.builds(
        _frame, kinds, st.integers(0, SIZE + SEG) | st.integers(0, 2**64 - 1),
        st.integers(0, 2 * SEG) | st.integers(0, 2**64 - 1), st.binary(max_size=300),
        st.booleans(),
    ) | st.binary(max_size=80),
    max_size=8,
)  # fmt: skip


@fuzz
@given(frames)
def test_any_frames_end_in_a_typed_error_and_write_nothing_past_the_target(
    tmp_path: Path, sent: list[bytes]
) -> None:
    result, _ = _receive(tmp_path, sent)
    assert isinstance(result, TransferError)  # no END with a matching digest is guessable


mutations = st.sampled_from(["drop", "repeat", "swap", "flip", "truncate"])


@fuzz
@given(st.integers(0, 2**32), mutations, st.integers(0, 10**6), st.integers(0, 10**6))
def test_a_damaged_stream_never_ends_in_a_done_copy_of_other_data(
    tmp_path: Path, seed: int, how: str, at: int, bit: int
) -> None:
    data = _source_bytes(seed)
    good = _stream(tmp_path, data)
    i = at % len(good)
    damaged = list(good)
    if how == "drop":
        del damaged[i]
    elif how == "repeat":
        damaged.insert(i, good[i])
    elif how == "swap":
        j = (i + 1) % len(good)
        damaged[i], damaged[j] = damaged[j], damaged[i]
    elif how == "flip":
        frame = bytearray(good[i])
        frame[bit % len(frame)] ^= 1 << (bit % 8)
        damaged[i] = bytes(frame)
    else:
        damaged[i] = good[i][: bit % len(good[i])]
    result, written = _receive(tmp_path, damaged)
    if isinstance(result, Outcome):
        assert written == data  # only an undamaged stream (a swap of twins) may get here
    else:
        assert isinstance(result, TransferError)
    result, written = _receive(tmp_path, good)
    assert isinstance(result, Outcome) and written == data


@fuzz
@given(
    st.integers(0, 2**62), st.binary(min_size=32, max_size=32),
    st.integers(0, 8 * SEG), st.one_of(st.none(), st.integers(0, 8 * SEG)),
)  # fmt: skip
def test_a_resume_request_goes_on_only_from_a_point_the_sender_can_vouch_for(
    offset: int, digest: bytes, size: int, sent_until: int | None
) -> None:
    resume = messages.Resume(offset=offset, digest=digest.hex(), source_id="src")
    memory = None
    if sent_until is not None:
        memory = sender_memory.JobMemory("src", sent_until=sent_until)
        memory.passed(offset, bytes(32))  # what it computed there: not the receiver's digest
    start, state, note = sender_memory.checked(resume, size, memory)
    if start:
        assert start == offset and start % SEG == 0 and start <= size and state == digest
        assert memory is None or (start <= memory.sent_until and digest == bytes(32))
    else:
        assert state is None and (note or offset == 0)


@fuzz
@given(
    st.integers(0, 2**62), st.binary(min_size=32, max_size=32), st.integers(0, 64 * SEG),
    st.integers(1, 16), st.integers(0, 15), st.integers(1, 4),
    st.one_of(st.none(), st.integers(0, 64 * SEG)),
)  # fmt: skip
def test_a_part_resumes_only_inside_its_own_range(
    offset: int, digest: bytes, size: int, count: int, index: int, unit_mib: int,
    sent_until: int | None,
) -> None:  # fmt: skip
    """A stream of a copy in several goes on from a checkpoint of its own part only: a point
    outside it, or between segment boundaries (but its end), starts the part over."""
    index %= count
    span = plan.part(size, index, count, unit_mib * SEG)
    begin, end = span
    resume = messages.Resume(offset=offset, digest=digest.hex(), source_id="src")
    memory = None
    if sent_until is not None:
        memory = sender_memory.JobMemory("src", sent_until=sent_until)
        memory.passed(offset, bytes(32))
    start, state, note = sender_memory.checked(resume, size, memory, span)
    if start != begin:
        assert start == offset and begin < start <= end and state == digest
        assert start % SEG == 0 or start == end
        assert memory is None or (start <= memory.sent_until and digest == bytes(32))
    else:
        assert state is None and (note or offset == begin)


@fuzz
@given(json_values | st.fixed_dictionaries({}, optional={
    "status": st.fixed_dictionaries({}, optional={
        "authenticated": st.booleans() | json_values,
        "audiences": st.lists(st.sampled_from([AUDIENCE, auth.LEGACY_AUDIENCE, "api", ""]),
                              max_size=2) | json_values,
        "user": st.fixed_dictionaries({}, optional={
            "username": st.sampled_from(["system:serviceaccount:ns:node", "x", ""]) | json_values,
            "extra": st.dictionaries(st.sampled_from([auth.NODE_NAME_KEY, "other"]),
                                     st.lists(st.text(max_size=8), max_size=2) | json_values),
        }) | json_values,
        "error": st.text(max_size=20),
    }) | json_values,
}))  # fmt: skip
def test_a_token_review_answer_names_a_node_or_refuses(review: Any) -> None:
    if not isinstance(review, dict):
        review = {"status": review}
    try:
        peer = auth.check_review(review, AUDIENCE, {"system:serviceaccount:ns:node"})
    except Refused as r:
        assert r.reason in ("unauthenticated", "forbidden") and r.message
    else:
        assert peer.node and peer.username == "system:serviceaccount:ns:node"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@fuzz
@given(st.text(max_size=200) | st.builds(
    lambda aud, junk: ".".join([junk, _b64(json.dumps({"aud": aud}).encode()), junk]),
    json_values | st.lists(st.sampled_from([AUDIENCE, auth.LEGACY_AUDIENCE,
                                            auth.audience("b"), "api"]), max_size=3),
    st.text(alphabet="abc", max_size=5),
) | st.builds(  # nested deep, under and over the length bound: '[[[[…' or '{"aud": [[[…'
    lambda depth, opener, prefix: f"x.{_b64(prefix + opener * depth)}.y",
    st.integers(1, 60000), st.sampled_from([b"[", b'{"a":']),
    st.sampled_from([b"", b'{"aud": ']),
))  # fmt: skip
def test_a_token_is_for_this_port_or_refused_before_any_review(token: str) -> None:
    try:
        auth.precheck(token, AUDIENCE)
    except Refused as r:
        assert r.reason == "unauthenticated" and r.message
    else:
        claims = auth.claims(token)
        assert claims is not None and AUDIENCE in (
            [claims["aud"]] if isinstance(claims["aud"], str) else claims["aud"]
        )


@fuzz
@given(st.binary(max_size=400) | st.builds(messages.encode, st.builds(
    messages.Hello, version=st.integers(0, 3), token=st.text(min_size=1, max_size=40),
    job=st.sampled_from(["pvc-a", "x"]), job_uid=st.just(UID),
)))  # fmt: skip
def test_a_hello_decodes_or_is_a_protocol_error(payload: bytes) -> None:
    try:
        hello = messages.decode(wire.Kind.HELLO, payload, messages.Hello)
    except ProtocolError:
        return
    assert hello.token and hello.job


class _Volumes:
    def __init__(self, path: str) -> None:
        self.path = path

    async def describe(self, name: str, device_class: str, with_uuid: bool = False) -> VolumeInfo:
        return VolumeInfo(self.path, SIZE, False, 0, "src")

    async def mapped(self, name: str, device_class: str) -> list[tuple[int, int]] | None:
        return None

    async def changed(
        self, name: str, base: str, device_class: str, thin: bool = True
    ) -> list[tuple[int, int]] | None:
        return None


async def test_the_sender_survives_any_hello_and_still_serves(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(_source_bytes(1))

    async def authorise(hello: messages.Hello) -> Job:
        if hello.token != "good":
            raise Refused("unauthenticated", "not this one")
        return Job(UID, "pvc-a", "b", "src", "", "source")

    metrics = TransferMetrics(None, "a")
    often = PortLimits(connects_per_peer=1000, connect_burst=1000)  # one address asks it all
    srv = server.TransferServer("a", authorise, _Volumes(str(src)), Limits(io_timeout=5), metrics,
                                port=often)  # fmt: skip
    await srv.start("127.0.0.1", 0)
    endpoint = server_endpoint(srv)
    rng = random.Random(7)
    try:
        for _ in range(int(os.environ.get("TOPOLVM_FUZZ_EXAMPLES", "40"))):
            payload = rng.choice([rng.randbytes(rng.randrange(0, 300)), b"{}",
                                  messages.encode(HELLO), b'{"version":1,"token":""}'])  # fmt: skip
            kind = rng.choice([wire.Kind.HELLO, wire.Kind.DATA, wire.Kind.ACK])
            with pytest.raises(TransferError):
                await asyncio.to_thread(_hello_exchange, endpoint, kind, payload)
        target = tmp_path / "target"
        target.write_bytes(bytes(SIZE))
        good = messages.Hello(version=1, token="good", job="pvc-a", job_uid=UID)
        from topolvm.transfer.client import receive

        outcome = await asyncio.to_thread(
            receive, endpoint, good, VolumeInfo(str(target), SIZE, False, 0, "t"),
            lambda c: None, lambda *a: None, threading.Event(), 5.0,
        )  # fmt: skip
        assert outcome.accept.size == SIZE and target.read_bytes() == src.read_bytes()
    finally:
        await srv.stop()


def server_endpoint(srv: server.TransferServer) -> Any:
    from topolvm.transfer.client import Endpoint

    return Endpoint("a", "127.0.0.1", srv.port, srv.fingerprint)


def _hello_exchange(endpoint: Any, kind: wire.Kind, payload: bytes) -> None:
    conn = connect(endpoint, 5.0)
    try:
        frame = wire._HEAD.pack(wire.MAGIC, kind, 0, 0, 0, 0, len(payload))
        conn.send(frame + wire._checksum(frame, payload).to_bytes(8, "big") + payload)
        conn.recv_message(messages.Accept)
    finally:
        conn.close()

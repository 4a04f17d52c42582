"""A copy in several streams (blocking; run in a worker thread by the node's copy jobs).

A large volume is split into ``count`` parts (:func:`~topolvm.transfer.plan.part`, boundaries
at multiples of ``unit``, which both ends compute from the source's size), each received over a
connection of its own by :func:`~topolvm.transfer.client.receive`: each part is resumable from
its own checkpoint, written sparsely as a whole copy is, and ends with its part's digest; the
copy's digest is made of the parts' (:func:`~topolvm.transfer.digest.combined`).

The first part connects alone: its source makes the job's cut and answers ACCEPT before the
others ask, so they all read the same cut. The first part that fails stops the others; the
error it raised is the copy's, and every part's checkpoint stays for the next attempt (a part
already complete is checkpointed at its end and resumes there, sending nothing).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import msgspec

from topolvm.transfer import client, digest, messages, plan
from topolvm.transfer.errors import ConnectionLost, ProtocolError
from topolvm.transfer.jobs import VolumeInfo

WAIT_STEP = 0.2  # seconds between looks at the caller's stop flag

PartPersist = Callable[[int, client.Checkpoint | None], None]
"""A part's checkpoint (its index, the point), from its worker thread: durable before the
sender hears of it, as a whole copy's. None: the part starts over, its checkpoint is void."""


@dataclass(frozen=True)
class Parts:
    count: int
    unit: int


class _Progress:
    """The parts' progress summed into one: bytes done of the volume, data and wire bytes."""

    def __init__(self, count: int, report: client.Progress) -> None:
        self.report = report
        self.begins = [0] * count
        self.done = [0] * count
        self.data = [0] * count
        self.wire = [0] * count
        self._lock = threading.Lock()

    def of(self, index: int) -> client.Progress:
        def progress(position: int, size: int, data: int, wire: int) -> None:
            with self._lock:
                self.done[index] = position - self.begins[index]
                self.data[index], self.wire[index] = data, wire
                done, data_sum, wire_sum = sum(self.done), sum(self.data), sum(self.wire)
            self.report(done, size, data_sum, wire_sum)

        return progress


def receive_parts(
    endpoint: client.Endpoint, hello: messages.Hello, target: VolumeInfo, parts: Parts,
    resumes: Mapping[int, client.Checkpoint], persist: PartPersist, progress: client.Progress,
    stop: threading.Event, timeout: float, accepted: client.Accepted = lambda accept: None,
    *, fresh: bool = True,
) -> client.Outcome:  # fmt: skip
    """Receive the job of ``hello`` into ``target`` in ``parts.count`` streams, each from its
    checkpoint in ``resumes`` (by part index). ``accepted`` hears the first part's ACCEPT."""
    count = parts.count
    inner = threading.Event()  # set: every part stops at its next record
    first = threading.Event()
    summed = _Progress(count, progress)

    def run(index: int) -> client.Outcome:
        resume = resumes.get(index)
        asked = msgspec.structs.replace(
            hello,
            part=messages.Part(index=index, count=count, unit=parts.unit),
            resume=None if resume is None else messages.Resume(
                offset=resume.offset, digest=resume.digest.hex(), source_id=resume.source_id),
        )  # fmt: skip

        def on_accept(accept: messages.Accept) -> None:
            begin, _ = plan.part(accept.size, index, count, parts.unit)
            if resume is not None and accept.offset != resume.offset:
                persist(index, None)  # before a byte is written over what it vouched for
            summed.begins[index] = begin
            summed.done[index] = accept.offset - begin
            if index == 0:
                accepted(accept)
                first.set()

        outcome = client.receive(endpoint, asked, target, lambda cp: persist(index, cp),
                                 summed.of(index), inner, timeout, on_accept,
                                 fresh=fresh)  # fmt: skip
        _, end = plan.part(outcome.accept.size, index, count, parts.unit)
        # complete: a later attempt resumes this part at its end and sends nothing of it
        persist(index, client.Checkpoint(end, outcome.digest, outcome.accept.source_id))
        return outcome

    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="transfer-part") as pool:
        futures = [pool.submit(run, 0)]
        while not (first.is_set() or futures[0].done()):
            _watch(stop, inner, futures)
        if not futures[0].done() or futures[0].exception() is None:
            futures += [pool.submit(run, i) for i in range(1, count)]
        while not all(f.done() for f in futures):
            _watch(stop, inner, futures)
        inner.set()
    return _joined(futures)


def _watch(
    stop: threading.Event, inner: threading.Event, futures: list[Future[client.Outcome]]
) -> None:
    """Wait a step; the caller's stop, or a part's failure, stops every part."""
    wait(futures, timeout=WAIT_STEP, return_when=FIRST_EXCEPTION)
    if stop.is_set() or any(f.done() and f.exception() is not None for f in futures):
        inner.set()


def _joined(futures: list[Future[client.Outcome]]) -> client.Outcome:
    """The parts' outcomes as the copy's; the first failure that is not a stop another part's
    failure caused, if any."""
    errors = [e for f in futures if (e := f.exception()) is not None]
    if errors:
        own = [e for e in errors if not (isinstance(e, ConnectionLost) and "stopped" in str(e))]
        raise (own or errors)[0]
    outcomes = [f.result() for f in futures]
    accept = outcomes[0].accept
    if any(o.accept.size != accept.size or o.accept.source_id != accept.source_id
           for o in outcomes):  # fmt: skip
        raise ProtocolError("the streams of one copy read different sources")
    senders = [o.sender_cpu_seconds for o in outcomes]
    return client.Outcome(
        accept,
        digest.combined(accept.size, [o.digest for o in outcomes]),
        sum(o.data_bytes for o in outcomes),
        sum(o.zero_bytes for o in outcomes),
        sum(o.keep_bytes for o in outcomes),
        sum(o.wire_bytes for o in outcomes),
        sum(o.cpu_seconds for o in outcomes),
        None if None in senders else sum(s for s in senders if s is not None),
    )

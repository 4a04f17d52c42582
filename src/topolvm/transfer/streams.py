"""A copy in several streams (blocking; run in a worker thread by the node's copy jobs).

A large volume is split into ``count`` parts (:func:`~topolvm.transfer.plan.part`, boundaries
at multiples of ``unit``, which both ends compute from the source's size), each received over a
connection of its own by :func:`~topolvm.transfer.client.receive`: each part is resumable from
its own checkpoint, written sparsely as a whole copy is, and ends with its part's digest; the
copy's digest is made of the parts' (:func:`~topolvm.transfer.digest.combined`).

The parts connect one after the other, each once the one before was accepted: the first one's
source makes the job's cut before its ACCEPT, so they all read the same cut. The first part
that fails stops the others; its error is the copy's, and every part's checkpoint (with the
range it is of) stays for the next attempt (a part already complete is checkpointed at its
end and resumes there, sending nothing).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import msgspec

from topolvm.transfer import client, digest, messages, plan
from topolvm.transfer.errors import ConnectionLost, ProtocolError, TransferError
from topolvm.transfer.jobs import VolumeInfo

log = logging.getLogger(__name__)

WAIT_STEP = 0.2  # seconds between looks at the caller's stop flag


@dataclass(frozen=True)
class PartPoint:
    """A part's durable checkpoint, with the range ``[begin, end)`` it is a point of: one of
    another split (another unit, count or size) is never resumed from."""

    begin: int
    end: int
    point: client.Checkpoint


PartPersist = Callable[[int, PartPoint | None], None]
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

    def started(self, index: int, begin: int, offset: int) -> None:
        with self._lock:
            self.begins[index], self.done[index] = begin, offset - begin

    def of(self, index: int) -> client.Progress:
        def progress(position: int, size: int, data: int, wire: int) -> None:
            with self._lock:
                self.done[index] = position - self.begins[index]
                self.data[index], self.wire[index] = data, wire
                done, data_sum, wire_sum = sum(self.done), sum(self.data), sum(self.wire)
            self.report(done, size, data_sum, wire_sum)

        return progress


class PartFailures:
    """The parts' failures in the order they happened, each marked if it came after the copy
    was told to stop (a consequence of another part's failure, or of the caller's stop)."""

    def __init__(self) -> None:
        self.seen: list[tuple[BaseException, bool]] = []
        self._lock = threading.Lock()

    def add(self, error: BaseException, stopping: bool) -> None:
        with self._lock:
            self.seen.append((error, stopping))

    def first(self) -> BaseException | None:
        """The copy's error: one that no retry mends (a digest that differs, a refusal for
        good) whenever it came, as no stop causes one; else a part's own failure rather than
        a stop it caused."""
        lasting = [e for e, _ in self.seen if isinstance(e, TransferError) and not e.transient]
        own = [e for e, stopping in self.seen if not stopping] or [e for e, _ in self.seen]
        return (lasting or own or [None])[0]


def receive_parts(
    endpoint: client.Endpoint, hello: messages.Hello, target: VolumeInfo, parts: Parts,
    resumes: Mapping[int, PartPoint], persist: PartPersist, progress: client.Progress,
    stop: threading.Event, timeout: float, accepted: client.Accepted = lambda accept: None,
    *, fresh: bool = True,
) -> client.Outcome:  # fmt: skip
    """Receive the job of ``hello`` into ``target`` in ``parts.count`` streams, each from its
    checkpoint in ``resumes`` (by part index). ``accepted`` hears the first part's ACCEPT.

    The parts connect one after the other, each once the one before it was accepted: the first
    one's source makes the job's cut, and the sender authorises one HELLO of the job at a time
    (it refuses more than a few at once from one address)."""
    count = parts.count
    inner = threading.Event()  # set: every part stops at its next record
    answered = [threading.Event() for _ in range(count)]
    summed = _Progress(count, progress)
    failures = PartFailures()
    points = dict(resumes)  # those of another split go at the first ACCEPT

    def void_other_splits(size: int) -> None:
        for index, held in list(points.items()):
            if (held.begin, held.end) != plan.part(size, index, count, parts.unit):
                persist(index, None)
                del points[index]

    def run(index: int) -> client.Outcome:
        try:
            return _part(index)
        except BaseException as e:
            failures.add(e, inner.is_set())
            inner.set()
            raise
        finally:
            answered[index].set()

    def _part(index: int) -> client.Outcome:
        held = points.get(index)
        resume = None if held is None else held.point
        asked = msgspec.structs.replace(
            hello,
            part=messages.Part(index=index, count=count, unit=parts.unit),
            resume=None if resume is None else messages.Resume(
                offset=resume.offset, digest=resume.digest.hex(), source_id=resume.source_id),
        )  # fmt: skip
        ranged: list[tuple[int, int]] = []  # the part's range, known from its ACCEPT

        def on_accept(accept: messages.Accept) -> None:
            begin, end = plan.part(accept.size, index, count, parts.unit)
            if index == 0:  # the size known: every checkpoint of another split is void
                void_other_splits(accept.size)
            if held is not None and (held.begin, held.end) != (begin, end):
                # resumed from already: this attempt fails, the next starts the part over
                raise ProtocolError(
                    f"the checkpoint of part {index + 1} is of the range {held.begin}-"
                    f"{held.end}, the part is {begin}-{end}"
                )
            if resume is not None and accept.offset != resume.offset:
                persist(index, None)  # before a byte is written over what it vouched for
            ranged.append((begin, end))
            summed.started(index, begin, accept.offset)
            if index == 0:
                accepted(accept)
            answered[index].set()

        def keep(cp: client.Checkpoint) -> None:
            begin, end = ranged[0]
            persist(index, PartPoint(begin, end, cp))

        outcome = client.receive(endpoint, asked, target, keep, summed.of(index), inner,
                                 timeout, on_accept, fresh=fresh)  # fmt: skip
        begin, end = plan.part(outcome.accept.size, index, count, parts.unit)
        # complete: a later attempt resumes this part at its end and sends nothing of it
        done = client.Checkpoint(end, outcome.digest, outcome.accept.source_id)
        persist(index, PartPoint(begin, end, done))
        return outcome

    futures: list[Future[client.Outcome]] = []
    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="transfer-part") as pool:
        for index in range(count):
            if inner.is_set() or stop.is_set():
                break
            futures.append(pool.submit(run, index))
            while not answered[index].wait(WAIT_STEP):
                if stop.is_set():
                    inner.set()
        while not all(f.done() for f in futures):
            wait(futures, timeout=WAIT_STEP)
            if stop.is_set():
                inner.set()
        inner.set()
    error = failures.first()
    if error is not None:
        for other, _ in failures.seen:
            if other is not error:
                log.info("a part of the copy ended too", extra={"error": str(other)})
        raise error
    if len(futures) < count:
        raise ConnectionLost("the copy was stopped")
    return _joined(futures)


def _joined(futures: list[Future[client.Outcome]]) -> client.Outcome:
    """The parts' outcomes as the copy's."""
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

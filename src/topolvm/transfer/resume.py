"""What the sender remembers of a job's stream, and how it checks a receiver's resume against
it (pure; :mod:`.server`)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from topolvm.transfer import messages, wire
from topolvm.transfer.errors import DigestMismatch

REMEMBERED_BOUNDARIES = 4096  # per job: about 4 GiB of stream past its last acknowledgement


@dataclass
class JobMemory:
    """What this process knows of a job's stream: the source it read, how far it sent, the
    digest chain at the segment boundaries past the last checkpoint the receiver confirmed."""

    source_id: str
    sent_until: int = 0
    split: tuple[int, int] = (0, 0)  # a part's (count, unit); (0, 0): the whole volume
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


def checked(
    resume: messages.Resume, size: int, memory: JobMemory | None,
    span: tuple[int, int] | None = None,
) -> tuple[int, bytes | None, str]:  # fmt: skip
    """Where a stream goes on from: the receiver's checkpoint if it holds, else the start of
    the volume (or of its ``span``, one part of a copy in several streams) with a note."""
    begin, end = span if span is not None else (0, size)
    offset, state = resume.offset, bytes.fromhex(resume.digest)
    if offset == begin:
        return begin, None, ""  # the start: the chain starts from its own initial value
    # a part's end (a complete part) may fall inside a segment: the volume's end
    if (offset % wire.SEGMENT and (span is None or offset != end)) or not begin < offset <= end:
        where = "the volume" if span is None else f"part {begin}-{end}"
        return begin, None, f"checkpoint {offset} is not a segment boundary of {where}"
    if memory is not None:
        if offset > memory.sent_until:
            return begin, None, f"checkpoint {offset} is past what was sent ({memory.sent_until})"
        known = memory.boundaries.get(offset)
        if known is not None and known != state:
            return begin, None, f"checkpoint {offset} does not match what was sent there"
    return offset, state, ""

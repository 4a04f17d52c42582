"""The control frames' payloads (pure): JSON decoded by msgspec into frozen structs whose
shapes and bounds are checked on decode. Anything else is a :class:`ProtocolError`.

Fields added later have defaults and are left out when they have them (``omit_defaults``), so
a peer that predates them reads what a full copy says, and one that gets a field it does not
know (a delta ACCEPT) refuses it."""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

import msgspec

from topolvm.transfer.errors import ProtocolError
from topolvm.transfer.wire import MAX_VOLUME, Kind

VERSION = 1
Offset = Annotated[int, msgspec.Meta(ge=0, lt=MAX_VOLUME)]
Count = Annotated[int, msgspec.Meta(ge=0, lt=1 << 62)]
Hex256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
# a Kubernetes object name (DNS subdomain) and UID
ObjectName = Annotated[
    str, msgspec.Meta(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
]
Uid = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                                          r"[0-9a-f]{12}$")]  # fmt: skip
# the identity of the exact bytes a copy reads: LVM's lv_uuid of the source (or its cut)
SourceId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9-]{1,64}$")]
Token = Annotated[str, msgspec.Meta(min_length=1, max_length=16384)]
Text = Annotated[str, msgspec.Meta(max_length=4096)]
FeatureName = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9-]{1,32}\Z")]
Features = Annotated[tuple[FeatureName, ...], msgspec.Meta(max_length=16)]
COMPRESS = "zstd"
"""A receiver's feature: it decodes ZDATA records (:mod:`.compress`)."""
SENDER_CPU = "sender-cpu"
"""A receiver's feature: its END may say the sender's CPU time (``End.sender_cpu_ms``)."""
STREAMS = "streams"
"""A receiver's feature: its HELLO may ask for one part of the source (``Hello.part``)."""
FEATURES = frozenset({COMPRESS, SENDER_CPU, STREAMS})


def publish_features(fingerprint: str, features: list[str]) -> str:
    """What a sender's Node says it honours (``Names.transfer_features_annotation``)."""
    return f"{fingerprint[:16].lower()}:{','.join(features)}"


def honoured(published: str, fingerprint: str) -> frozenset[str]:
    """The features a receiver may ask of the sender whose Node says ``published`` and whose
    certificate is ``fingerprint``: none when the annotation is of another start (an older
    release restarted there reads no feature), and only those this release knows."""
    prefix, sep, names = published.partition(":")
    if not sep or len(prefix) != 16 or prefix != fingerprint[:16].lower():
        return frozenset()
    return frozenset(names.split(",")) & FEATURES


class _Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pass


class Resume(_Message, frozen=True):
    """Where a receiver goes on from: its last durable checkpoint, and the source it was
    copying then (a resume against another source starts over)."""

    offset: Offset
    digest: Hex256
    source_id: SourceId


class Part(_Message, frozen=True):
    """One of ``count`` streams of a copy: the source's range ``plan.part(size, index, count,
    unit)`` (:func:`~topolvm.transfer.plan.part`), which both ends compute from the size."""

    index: Annotated[int, msgspec.Meta(ge=0, lt=16)]
    count: Annotated[int, msgspec.Meta(ge=1, le=16)]
    unit: Annotated[int, msgspec.Meta(ge=1 << 20, le=1 << 30, multiple_of=1 << 20)]


class Hello(_Message, frozen=True, omit_defaults=True):
    """The receiver's first frame: who it is (a ServiceAccount token for the transfer's
    audience) and which job it asks for: the target LogicalVolume, by name and UID.

    ``features``: what the receiver understands beyond version 1 (:data:`FEATURES`; a sender
    ignores names it does not know). A receiver sends it only to a sender whose Node publishes
    that it reads it (an older sender refuses a field it does not know).

    ``part``: the stream reads only that part of the source (feature :data:`STREAMS`); its
    ``resume`` is the part's checkpoint, its END digest the part's chain."""

    version: int
    token: Token
    job: ObjectName
    job_uid: Uid
    resume: Resume | None = None
    features: Features = ()
    part: Part | None = None


class Accept(_Message, frozen=True, omit_defaults=True):
    """The sender took the job: it streams the source's ``size`` bytes from ``offset`` (the
    receiver's checkpoint, or 0 with ``note`` saying why it starts over). ``delta``: the stream
    is a delta against the base the receiver's target holds (KEEP records leave its bytes)."""

    size: Offset
    offset: Offset
    source_id: SourceId
    source: Text
    note: Text = ""
    delta: bool = False


class Refuse(_Message, frozen=True):
    reason: Literal["unauthenticated", "forbidden", "unknown-job", "replayed", "busy",
                    "invalid", "unavailable"]  # fmt: skip
    message: Text


class Ack(_Message, frozen=True):
    """The receiver's durable checkpoint: everything before ``offset`` is written and synced,
    and the digest chain there is ``digest``."""

    offset: Offset
    digest: Hex256


class End(_Message, frozen=True, omit_defaults=True):
    """The last record: what was sent since ACCEPT, and the whole-volume digest."""

    data_records: Count
    zero_records: Count
    data_bytes: Count
    zero_bytes: Count
    digest: Hex256
    keep_records: Count = 0
    keep_bytes: Count = 0
    # the stream's CPU time on the sender (feature SENDER_CPU only), at most 10^10 ms
    sender_cpu_ms: Annotated[int, msgspec.Meta(ge=0, le=10**10)] = 0


class Fail(_Message, frozen=True):
    message: Text


Message = Hello | Accept | Refuse | Ack | End | Fail
KIND_OF: dict[type[Message], Kind] = {
    Hello: Kind.HELLO, Accept: Kind.ACCEPT, Refuse: Kind.REFUSE, Ack: Kind.ACK, End: Kind.END,
    Fail: Kind.FAIL,
}  # fmt: skip
TYPE_OF = {kind: t for t, kind in KIND_OF.items()}
M = TypeVar("M", bound=_Message)
_encoder = msgspec.json.Encoder()


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(kind: Kind, payload: bytes | memoryview, expected: type[M]) -> M:
    """The payload of a ``kind`` frame as ``expected``; a frame of another kind, or a payload
    that does not fit, is a :class:`ProtocolError`."""
    if TYPE_OF.get(kind) is not expected:
        raise ProtocolError(f"expected {KIND_OF[expected].name}, got {kind.name}")  # type: ignore[index]
    try:
        return msgspec.json.decode(payload, type=expected)
    except msgspec.DecodeError as e:  # ValidationError is a DecodeError
        raise ProtocolError(f"malformed {kind.name}: {e}") from None

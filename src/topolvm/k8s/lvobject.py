"""The LogicalVolume custom resource as a typed view over its JSON (spec §5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# the quantity helpers, read by many modules from here
from topolvm.quantity import MAX_QUANTITY as MAX_QUANTITY  # noqa: PLC0414
from topolvm.quantity import InvalidQuantity as InvalidQuantity  # noqa: PLC0414
from topolvm.quantity import format_quantity as format_quantity  # noqa: PLC0414
from topolvm.quantity import parse_quantity as parse_quantity  # noqa: PLC0414


class CopyPhase:
    """``status.copy.phase`` of a LogicalVolume filled by a copy (docs/mobility.md)."""

    PENDING = "Pending"  # not started: waiting for the source, a free slot, the sender
    COPYING = "Copying"
    DONE = "Done"  # complete and verified
    FAILED = "Failed"  # for good (the source is gone, the data did not verify)


def int_or_zero(value: Any) -> int:
    """A status field written by another process: a wrong type reads as 0."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


@dataclass(frozen=True)
class PartCheckpoint:
    """``status.copy.streams.checkpoints[]``: a part's last durable point (a copy in several
    streams): everything from ``begin`` up to ``offset`` is written and synced, the part's
    digest chain there is ``digest``, read from the source of LVM uuid ``source_id``."""

    index: int
    begin: int
    end: int
    offset: int
    digest: str
    source_id: str

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> PartCheckpoint:
        """Tolerant, as :class:`CopyStatus`: a field of the wrong type reads as empty."""
        index, begin, end, offset = (int_or_zero(raw.get(k))
                                     for k in ("index", "begin", "end", "offset"))  # fmt: skip
        return cls(index, begin, end, offset, str(raw.get("digest") or ""),
                   str(raw.get("sourceID") or ""))  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "begin": self.begin, "end": self.end, "offset": self.offset,
                "digest": self.digest, "sourceID": self.source_id}  # fmt: skip


@dataclass(frozen=True)
class CopyStatus:
    """``status.copy``: one copy's state, written by the node that fills the volume and read
    by the controller that waits for it, by the sender checking a resume, and by doctor."""

    phase: str = CopyPhase.PENDING
    message: str = ""
    source_node: str = ""
    source_id: str = ""  # LVM uuid of the source LV (or its cut) the checkpoint was read from
    total_bytes: int = 0
    done_bytes: int = 0
    transferred_bytes: int = 0  # DATA bytes received over every attempt
    bytes_per_second: int = 0
    checkpoint_offset: int = 0
    checkpoint_digest: str = ""
    attempts: int = 0
    resumed_from: int = 0
    digest: str = ""  # the whole-volume digest, once done
    start_time: str = ""
    completion_time: str = ""
    round: int = 0  # the spec.copy.round this status is of (0: the first)
    wire_bytes: int = 0  # DATA payload on the wire over every attempt (compressed: fewer)
    sender_cpu_ms_per_gib: int = 0  # the last attempt's CPU per GiB of data, on each side
    receiver_cpu_ms_per_gib: int = 0
    # a copy in several streams: how many, the unit their parts end on, each part's last
    # checkpoint
    part_count: int = 0
    part_unit: int = 0
    part_checkpoints: tuple[PartCheckpoint, ...] = ()

    _KEYS = (("phase", "phase"), ("message", "message"), ("source_node", "sourceNode"),
             ("source_id", "sourceID"), ("total_bytes", "totalBytes"),
             ("done_bytes", "doneBytes"), ("transferred_bytes", "transferredBytes"),
             ("bytes_per_second", "bytesPerSecond"), ("attempts", "attempts"),
             ("resumed_from", "resumedFrom"), ("digest", "digest"),
             ("start_time", "startTime"), ("completion_time", "completionTime"),
             ("round", "round"), ("wire_bytes", "wireBytes"),
             ("sender_cpu_ms_per_gib", "senderCPUMillisPerGiB"),
             ("receiver_cpu_ms_per_gib", "receiverCPUMillisPerGiB"))  # fmt: skip

    @classmethod
    def from_dict(cls, raw: Any) -> CopyStatus | None:
        """Tolerant: a field of the wrong type reads as empty (only nodes write it)."""
        if not isinstance(raw, dict):
            return None
        values: dict[str, Any] = {}
        for attr, key in cls._KEYS:
            default = getattr(cls, attr)
            value = raw.get(key)
            values[attr] = int_or_zero(value) if isinstance(default, int) else str(value or "")
        values["phase"] = values["phase"] or CopyPhase.PENDING
        checkpoint = raw.get("checkpoint")
        if isinstance(checkpoint, dict):
            values["checkpoint_offset"] = int_or_zero(checkpoint.get("offset"))
            values["checkpoint_digest"] = str(checkpoint.get("digest") or "")
        streams = raw.get("streams")
        if isinstance(streams, dict):
            values["part_count"] = int_or_zero(streams.get("count"))
            values["part_unit"] = int_or_zero(streams.get("unit"))
            points = streams.get("checkpoints")
            values["part_checkpoints"] = tuple(
                PartCheckpoint.from_dict(p)
                for p in (points if isinstance(points, list) else []) if isinstance(p, dict)
            )  # fmt: skip
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for attr, key in self._KEYS:
            value = getattr(self, attr)
            if value or key == "phase":
                out[key] = value
        if self.checkpoint_digest:
            out["checkpoint"] = {"offset": self.checkpoint_offset,
                                 "digest": self.checkpoint_digest}  # fmt: skip
        if self.part_count:
            points = [p.to_dict() for p in self.part_checkpoints]
            out["streams"] = {"count": self.part_count, "unit": self.part_unit,
                              "checkpoints": points}  # fmt: skip
        return out


class VerifyPhase:
    """``status.verify.phase``: a node's verification digest of one of its volumes
    (docs/mobility.md, "Verifying a move")."""

    PENDING = "Pending"  # the cut is not made yet (lvmd unavailable, say: retried)
    CUT = "Cut"  # the point-in-time cut exists: the volume may change from now on
    DONE = "Done"  # digest and sizeBytes are the cut's content digest
    FAILED = "Failed"  # message says why (the cut overflowed, or a restart lost it)
    ENDED = frozenset({DONE, FAILED})


@dataclass(frozen=True)
class VerifyStatus:
    """``status.verify``, written by the node of the volume for ``spec.verify.id``."""

    id: str = ""
    phase: str = VerifyPhase.PENDING
    message: str = ""
    digest: str = ""  # hex, the whole-volume digest chain of transfer/digest.py
    size_bytes: int = 0  # the bytes the digest covers (its chain starts from this size)
    cut_time: str = ""
    completion_time: str = ""

    _KEYS = (("id", "id"), ("phase", "phase"), ("message", "message"), ("digest", "digest"),
             ("size_bytes", "sizeBytes"), ("cut_time", "cutTime"),
             ("completion_time", "completionTime"))  # fmt: skip

    @classmethod
    def from_dict(cls, raw: Any) -> VerifyStatus | None:
        """Tolerant: a field of the wrong type reads as empty (only nodes write it)."""
        if not isinstance(raw, dict):
            return None
        values: dict[str, Any] = {}
        for attr, key in cls._KEYS:
            value = raw.get(key)
            values[attr] = int_or_zero(value) if attr == "size_bytes" else str(value or "")
        values["phase"] = values["phase"] or VerifyPhase.PENDING
        return cls(**values)

    def to_patch(self) -> dict[str, Any]:
        """Every field, as a merge patch: the empty ones removed."""
        return {key: getattr(self, attr) or None for attr, key in self._KEYS}


@dataclass
class LogicalVolumeObject:
    """What the node and controller read from a LogicalVolume object.

    Three types carry the name "logical volume"; each is named by its role: this one is the
    Kubernetes object, ``lvm.report.LvRecord`` is a row of ``lvs``, and the protobuf
    ``LogicalVolume`` is lvmd's wire message.
    """

    name: str
    uid: str
    resource_version: str
    node_name: str
    size: int
    device_class: str = ""
    lvcreate_option_class: str = ""
    source: str = ""
    access_type: str = ""
    volume_id: str = ""
    code: int = 0
    message: str = ""
    current_size: int | None = None
    deleting: bool = False
    finalizers: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    copy_source: str = ""  # spec.copy.source: the LogicalVolume a copy fills this one from
    # a move's copy (docs/mobility.md, "Move"): round 1 fills it from a first cut of the
    # source, which its node keeps (keepCut); round 2 sends what changed since that cut
    copy_round: int = 1
    copy_keep_cut: bool = False
    copy: CopyStatus | None = None  # status.copy
    created: str = ""  # metadata.creationTimestamp
    # spec.verify: a digest of the volume's content at one instant, asked for by its id (a
    # move, after its final copy: docs/mobility.md); sizeBytes: of its first bytes only
    verify_id: str = ""
    verify_size: int = 0
    verify: VerifyStatus | None = None  # status.verify
    # spec.ioLimits: per second, or per second and GiB (topolvm.iolimits reads it)
    io_limits: dict[str, int] = field(default_factory=dict)

    @property
    def verify_pending(self) -> bool:
        """``spec.verify`` asks for a digest this node has not reported yet."""
        if not self.verify_id:
            return False
        st = self.verify
        return st is None or st.id != self.verify_id or st.phase not in VerifyPhase.ENDED

    @property
    def copy_done(self) -> bool:
        """Not filled by a copy, or the copy is complete and verified. (A thick snapshot or
        clone on its source's node is a copy too: its node reports ``status.copy``.)"""
        if self.copy is not None:
            return self.copy.phase == CopyPhase.DONE and self.copy_round_of(self.copy) == (
                self.copy_round
            )
        return not self.copy_source

    @staticmethod
    def copy_round_of(status: CopyStatus) -> int:
        return max(status.round, 1)

    @property
    def ready(self) -> bool:
        """The volume exists and holds its data: a CSI volume may be handed out."""
        return bool(self.volume_id) and self.copy_done

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> LogicalVolumeObject:
        """Raises InvalidQuantity/KeyError/TypeError for objects that break the schema."""
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        current = status.get("currentSize")
        return cls(
            name=str(meta["name"]),
            uid=str(meta.get("uid", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            node_name=str(spec.get("nodeName", "")),
            size=parse_quantity(spec.get("size", 0)),
            device_class=str(spec.get("deviceClass") or ""),
            lvcreate_option_class=str(spec.get("lvcreateOptionClass") or ""),
            source=str(spec.get("source") or ""),
            access_type=str(spec.get("accessType") or ""),
            volume_id=str(status.get("volumeID") or ""),
            code=int(status.get("code") or 0),
            message=str(status.get("message") or ""),
            current_size=None if current is None else parse_quantity(current),
            deleting=bool(meta.get("deletionTimestamp")),
            finalizers=list(meta.get("finalizers") or []),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            copy_source=str((spec.get("copy") or {}).get("source") or ""),
            copy_round=max(int_or_zero((spec.get("copy") or {}).get("round")), 1),
            copy_keep_cut=bool((spec.get("copy") or {}).get("keepCut")),
            copy=CopyStatus.from_dict(status.get("copy")),
            created=str(meta.get("creationTimestamp") or ""),
            verify_id=str(_mapping(spec.get("verify")).get("id") or ""),
            verify_size=int_or_zero(_mapping(spec.get("verify")).get("sizeBytes")),
            verify=VerifyStatus.from_dict(status.get("verify")),
            io_limits={str(k): v for k, v in _mapping(spec.get("ioLimits")).items()},
        )


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def status_dict(
    *, volume_id: str, code: int, message: str, current_size: int | None
) -> dict[str, Any]:
    """The ``status`` object as upstream writes it (empty fields omitted)."""
    out: dict[str, Any] = {}
    if volume_id:
        out["volumeID"] = volume_id
    if code:
        out["code"] = code
    if message:
        out["message"] = message
    if current_size is not None:
        out["currentSize"] = format_quantity(current_size)
    return out

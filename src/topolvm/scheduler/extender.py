"""The extender's filtering and scoring, and the kube-scheduler extender wire format.

Requests (``ExtenderArgs``) are decoded with msgspec: the top-level keys case-insensitively (the
real scheduler sends ``Pod``/``Nodes``/``NodeNames``, older code ``pod``/``nodes``/``nodenames``),
Node objects only as far as ``metadata.name`` and ``metadata.annotations``. Passing Node objects
are echoed back as the exact bytes kube-scheduler sent, so a filter reply costs no re-encoding.
Replies use the Go field names kube-scheduler's types have (``Nodes``, ``NodeNames``,
``FailedNodes``, ``Error``, ``Host``, ``Score``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec

from topolvm import capacity_annotations
from topolvm.constants import Names

MAX_SCORE = 10
MIN_SCORE = 1


class BadRequest(Exception):
    """The request cannot be answered; the message says why (sent back with HTTP 400)."""


# -- wire types ---------------------------------------------------------------------------------


class ObjectMeta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    annotations: dict[str, str] | None = None


class KubeObject(msgspec.Struct):
    """A Pod or a Node, decoded only as far as the extender needs."""

    metadata: ObjectMeta | None = None


class RawNodeList(msgspec.Struct):
    items: list[msgspec.Raw] | None = None


class NodeList(msgspec.Struct):
    items: list[KubeObject] | None = None


class HostPriority(msgspec.Struct):
    Host: str
    Score: int


_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_POD = msgspec.json.Decoder(KubeObject | None)
_OBJ = msgspec.json.Decoder(KubeObject)
_RAW_NODES = msgspec.json.Decoder(RawNodeList | None)
_NODES = msgspec.json.Decoder(NodeList | None)
_NAMES = msgspec.json.Decoder(list[str] | None)
_ENCODER = msgspec.json.Encoder()
_ARG_KEYS = {"pod": "Pod", "nodes": "Nodes", "nodenames": "NodeNames"}


def _error(where: str, e: msgspec.MsgspecError) -> BadRequest:
    return BadRequest(f"{where}: {e}")


@dataclass
class ExtenderArgs:
    """A decoded request. ``nodes`` holds the raw Nodes value; ``node_names`` the NodeNames."""

    pod: KubeObject
    nodes: msgspec.Raw | None
    node_names: list[str] | None


def decode_args(body: bytes) -> ExtenderArgs:
    """Decode ``ExtenderArgs``, matching the top-level keys case-insensitively."""
    try:
        top = _TOP.decode(body)
    except msgspec.ValidationError:  # a subclass of DecodeError
        raise BadRequest("body is not a JSON object (ExtenderArgs)") from None
    except msgspec.DecodeError as e:
        raise BadRequest(f"body is not valid JSON: {e}") from None
    found: dict[str, tuple[str, msgspec.Raw]] = {}
    for key, raw in top.items():
        field = key.lower()
        if field not in _ARG_KEYS:
            continue
        if field in found:
            raise BadRequest(f"ExtenderArgs has both {found[field][0]!r} and {key!r}")
        found[field] = (key, raw)
    pod = None
    if "pod" in found:
        try:
            pod = _POD.decode(found["pod"][1])
        except msgspec.MsgspecError as e:
            raise _error("Pod", e) from None
    if pod is None:
        raise BadRequest("missing Pod")
    names = None
    if "nodenames" in found:
        try:
            names = _NAMES.decode(found["nodenames"][1])
        except msgspec.MsgspecError as e:
            raise _error("NodeNames", e) from None
    nodes = found["nodes"][1] if "nodes" in found else None
    if nodes is not None and bytes(nodes).strip() == b"null":
        nodes = None
    if nodes is None and names is None:
        raise BadRequest("missing Nodes and NodeNames: one of them is required")
    return ExtenderArgs(pod=pod, nodes=nodes, node_names=names)


def decode_raw_nodes(raw: msgspec.Raw) -> list[msgspec.Raw]:
    try:
        nl = _RAW_NODES.decode(raw)
    except msgspec.MsgspecError as e:
        raise _error("Nodes", e) from None
    if nl is None:
        raise BadRequest("missing Nodes")
    return nl.items or []


def decode_node(raw: msgspec.Raw, index: int) -> ObjectMeta:
    try:
        obj = _OBJ.decode(raw)
    except msgspec.MsgspecError as e:
        raise _error(f"Nodes.items[{index}]", e) from None
    return _node_meta(obj, index)


def _node_meta(obj: KubeObject, index: int) -> ObjectMeta:
    meta = obj.metadata
    if meta is None or not meta.name:
        raise BadRequest(f"Nodes.items[{index}]: a Node without metadata.name")
    return meta


def decode_nodes(raw: msgspec.Raw) -> list[ObjectMeta]:
    try:
        nl = _NODES.decode(raw)
    except msgspec.MsgspecError as e:
        raise _error("Nodes", e) from None
    if nl is None:
        raise BadRequest("missing Nodes")
    return [_node_meta(obj, i) for i, obj in enumerate(nl.items or [])]


# -- capacity rules ----------------------------------------------------------------------------


def requested_capacity(pod: KubeObject, names: Names) -> dict[str, int]:
    """Device class → bytes, from the pod's ``capacity.<plugin>/<dc>`` annotations; a value
    that is not a number of bytes is a bad request (HTTP 400, kube-scheduler logs it)."""
    meta = pod.metadata
    if meta is None or not meta.annotations:
        return {}
    try:
        return capacity_annotations.decode_pod(
            names, meta.annotations, f"pod {meta.namespace}/{meta.name}"
        )
    except capacity_annotations.BadCapacityAnnotation as e:
        raise BadRequest(str(e)) from None


def capacity_score(capacity: int, divisor: float) -> int:
    """Upstream's ``capacityToScore``: ``clamp(1..10, floor(log2((capacity >> 30) / divisor)))``.

    0 bytes scores 0 and less than 1 GiB scores 1. ``floor(log2(q))`` is taken exactly from the
    float's exponent instead of through a rounded logarithm.
    """
    gb = capacity >> 30
    if gb == 0:
        return MIN_SCORE if capacity > 0 else 0
    q = gb / divisor
    if q >= 1 << MAX_SCORE:
        return MAX_SCORE
    if q < 2:
        return MIN_SCORE
    return math.frexp(q)[1] - 1


# A node's view of one capacity annotation: (parsed value or None if invalid, raw string), or
# None when the node has no such annotation.
Capacity = tuple[int | None, str] | None


def missing_annotation_reason(dc: str, req: int, names: Names) -> str:
    return (
        f"no capacity annotation {names.capacity_prefix}{dc} for device-class {dc}: "
        f"requested {req} bytes, available unknown"
    )


def bad_annotation_reason(dc: str, req: int, raw: str, names: Names) -> str:
    return (
        f"bad capacity annotation: {raw} (annotation {names.capacity_prefix}{dc} of "
        f"device-class {dc}): requested {req} bytes, available unknown"
    )


def out_of_space_reason(dc: str, req: int, available: int) -> str:
    return out_of_space_prefix(dc, req) + available_bytes(available)


def out_of_space_prefix(dc: str, req: int) -> str:
    return f"out of VG free space for device-class {dc}: requested {req} bytes, "


def available_bytes(available: int) -> str:
    """The end of :func:`out_of_space_reason`, which the node cache keeps for every node."""
    return f"available {available} bytes"


def filter_reason(
    lookup: Callable[[str], Capacity], requested: dict[str, int], names: Names
) -> str | None:
    """Why the node cannot host the pod, or ``None`` if it can. The first failing device class
    (in name order) is reported; the reasons start with upstream's exact phrases."""
    for dc, req in requested.items():
        cap = lookup(dc)
        if cap is None:
            return missing_annotation_reason(dc, req, names)
        value, raw = cap
        if value is None:
            return bad_annotation_reason(dc, req, raw, names)
        if value < req:
            return out_of_space_reason(dc, req, value)
    return None


def unknown_reason(requested: dict[str, int], why: str) -> str:
    classes = ", ".join(
        f"device-class {dc} (requested {req} bytes)" for dc, req in requested.items()
    )
    return f"unknown capacity for {classes}, available unknown: {why}"


def node_score(
    lookup: Callable[[str], Capacity],
    device_classes: Iterable[str],
    divisor: Callable[[str], float],
) -> int:
    """The minimum score over the pod's device classes the node has; 0 if it has none."""
    best: int | None = None
    for dc in device_classes:
        cap = lookup(dc)
        if cap is None:
            continue
        score = capacity_score(cap[0] or 0, divisor(dc))
        if best is None or score < best:
            best = score
    return 0 if best is None else best


def annotation_lookup(
    annotations: dict[str, str] | None, names: Names
) -> Callable[[str], Capacity]:
    caps = capacity_annotations.decode_node(names, annotations)
    return caps.get


# -- replies -----------------------------------------------------------------------------------


def encode_filter_nodes(
    passing: Iterable[msgspec.Raw | bytes], failed: dict[str, str], whole: msgspec.Raw | None = None
) -> bytes:
    """``ExtenderFilterResult`` for nodeCacheCapable=false: passing nodes as full Node objects
    (the bytes kube-scheduler sent), ``whole`` to echo the request's NodeList unchanged."""
    nodes = (
        bytes(whole)
        if whole is not None
        else b'{"metadata":{},"items":[' + b",".join(passing) + b"]}"
    )
    return (
        b'{"Nodes":'
        + nodes
        + b',"NodeNames":null,"FailedNodes":'
        + _ENCODER.encode(failed)
        + b',"FailedAndUnresolvableNodes":null,"Error":""}'
    )


def encode_filter_names(passing: list[str], failed: dict[str, str]) -> bytes:
    """``ExtenderFilterResult`` for nodeCacheCapable=true: passing nodes by name."""
    return (
        b'{"Nodes":null,"NodeNames":'
        + _ENCODER.encode(passing)
        + b',"FailedNodes":'
        + _ENCODER.encode(failed)
        + b',"FailedAndUnresolvableNodes":null,"Error":""}'
    )


def encode_priorities(priorities: list[HostPriority] | None) -> bytes:
    """``HostPriorityList``; ``None`` (a pod without TopoLVM annotations) gives ``null``, as
    upstream."""
    return _ENCODER.encode(priorities)

"""Host unit tests: quantities, the LogicalVolume view, CRD manifests, names, the work queue,
the typed Kubernetes errors."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
import yaml
from lightkube import ApiError
from lightkube.models.meta_v1 import Status

from topolvm.constants import LEGACY, NORMAL, names
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.crd import crd_files, logicalvolume_crd
from topolvm.k8s.lvobject import (
    InvalidQuantity,
    LogicalVolumeObject,
    format_quantity,
    parse_quantity,
    status_dict,
)
from topolvm.k8s.runtime import Controller, Result, WorkQueue
from topolvm.node.exporter import node_annotations
from topolvm.proto import lvmd_pb2 as pb

REPO = Path(__file__).resolve().parent.parent
GiB = 1 << 30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1Gi", GiB),
        ("1023Mi", 1023 << 20),
        ("4097", 4097),
        (1073741824, GiB),
        ("1G", 10**9),
        ("1.5Gi", 3 << 29),
        ("1e3", 1000),
        ("100m", 1),  # fractions of a byte round up
        ("0", 0),
    ],
)
def test_parse_quantity(text: str | int, expected: int) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("bad", ["", "1GB", "Gi", "1.2.3", "--1", True, None, 1.5, [1]])
def test_parse_quantity_rejects(bad: object) -> None:
    with pytest.raises(InvalidQuantity):
        parse_quantity(bad)


@pytest.mark.parametrize(
    "huge", ["1e30000000", "1e300000", "9.3e18", "8Ei", "0.1e20", 2**63, "9223372036854775808"]
)
def test_parse_quantity_refuses_what_no_volume_can_be_at_once(huge: object) -> None:
    """The CRD's quantity pattern lets anyone with write access store "1e30000000" in
    spec.size: it used to overflow Decimal (an unexpected error) or, at 1e300000, cost seconds
    of CPU per reconcile. Now it is an InvalidQuantity, found without computing it."""
    with pytest.raises(InvalidQuantity, match="is larger than 9223372036854775807 bytes"):
        parse_quantity(huge)
    assert parse_quantity("9223372036854775807") == 2**63 - 1
    assert parse_quantity("7Ei") == 7 << 60


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (GiB, "1Gi"),
        (1023 << 20, "1023Mi"),
        (4097, "4097"),
        (0, "0"),
        (5 << 40, "5Ti"),
        (4096, "4Ki"),
    ],
)
def test_format_quantity_binary_si(size: int, text: str) -> None:
    assert format_quantity(size) == text
    assert parse_quantity(text) == size


def test_logicalvolume_view_reads_upstream_fields() -> None:
    obj = {
        "metadata": {
            "name": "pvc-1",
            "uid": "u-1",
            "resourceVersion": "7",
            "finalizers": ["topolvm.io/logicalvolume"],
            "deletionTimestamp": "2026-11-22T10:00:00Z",
        },
        "spec": {
            "name": "pvc-1",
            "nodeName": "n1",
            "size": "2Gi",
            "deviceClass": "ssd",
            "source": "pvc-0",
            "accessType": "ro",
        },
        "status": {"volumeID": "u-1", "code": 8, "message": "full", "currentSize": "1Gi"},
    }
    lv = LogicalVolumeObject.from_dict(obj)
    assert (lv.name, lv.uid, lv.node_name, lv.size) == ("pvc-1", "u-1", "n1", 2 * GiB)
    assert (lv.device_class, lv.source, lv.access_type) == ("ssd", "pvc-0", "ro")
    assert (lv.volume_id, lv.code, lv.message, lv.current_size) == ("u-1", 8, "full", GiB)
    assert lv.deleting and lv.finalizers == ["topolvm.io/logicalvolume"]
    empty = LogicalVolumeObject.from_dict(
        {"metadata": {"name": "x"}, "spec": {"nodeName": "n", "size": 1}}
    )
    assert empty.current_size is None and empty.volume_id == "" and not empty.deleting


def test_status_dict_omits_empty_fields() -> None:
    assert status_dict(volume_id="u", code=0, message="", current_size=GiB) == {
        "volumeID": "u",
        "currentSize": "1Gi",
    }
    assert status_dict(volume_id="", code=8, message="no space", current_size=None) == {
        "code": 8,
        "message": "no space",
    }


def test_crd_files_are_rendered_from_the_code() -> None:
    for name, text in crd_files().items():
        assert (REPO / "deploy" / "crds" / name).read_text() == text, (
            f"deploy/crds/{name} is stale: run python -m topolvm.k8s.crd deploy/crds"
        )


def test_crds_differ_only_in_group() -> None:
    a, b = logicalvolume_crd("topolvm.io"), logicalvolume_crd("topolvm.cybozu.com")
    assert a["metadata"]["name"] == "logicalvolumes.topolvm.io"
    assert b["metadata"]["name"] == "logicalvolumes.topolvm.cybozu.com"
    text_a = yaml.safe_dump(a).replace("topolvm.io", "G")
    text_b = yaml.safe_dump(b).replace("topolvm.cybozu.com", "G")
    assert text_a == text_b
    version = a["spec"]["versions"][0]
    assert a["spec"]["scope"] == "Cluster" and version["subresources"] == {"status": {}}
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    assert schema["spec"]["required"] == ["name", "nodeName", "size"]
    # upstream's fields, the copy that fills a volume from another (docs/mobility.md), and
    # the IO limits of its pods (docs/qos.md)
    assert set(schema["spec"]["properties"]) == {
        "name", "nodeName", "size", "deviceClass", "lvcreateOptionClass", "source", "accessType",
        "copy", "verify", "ioLimits",
    }  # fmt: skip
    io = schema["spec"]["properties"]["ioLimits"]["properties"]
    assert set(io) == {f + suffix for f in ("readBytesPerSecond", "writeBytesPerSecond",
                       "readIOPS", "writeIOPS") for suffix in ("", "PerGiB")}  # fmt: skip
    assert all(p["type"] == "integer" and p["minimum"] == 2 for p in io.values())
    assert set(schema["status"]["properties"]) == {
        "volumeID",
        "code",
        "message",
        "currentSize",
        "copy",
        "verify",
    }


def test_names_normal_and_legacy(monkeypatch: pytest.MonkeyPatch) -> None:
    assert NORMAL.capacity_annotation("") == "capacity.topolvm.io/00default"
    assert NORMAL.capacity_annotation("ssd") == "capacity.topolvm.io/ssd"
    assert LEGACY.lv_finalizer == "topolvm.cybozu.com/logicalvolume"
    assert LEGACY.topology_key == "topology.topolvm.cybozu.com/node"
    assert NORMAL.capacity_resource == "topolvm.io/capacity"
    monkeypatch.setenv("USE_LEGACY", "1")
    assert names() is LEGACY
    monkeypatch.setenv("USE_LEGACY", "")
    assert names() is NORMAL


def test_capacity_annotations_thick_and_thin() -> None:
    msg = pb.WatchResponse(free_bytes=100)
    msg.items.add(device_class="ssd", free_bytes=100, size_bytes=200)
    thin = msg.items.add(device_class="thin", free_bytes=50, size_bytes=200)
    thin.thin_pool.overprovision_bytes = 500
    assert node_annotations(LEGACY, msg) == {
        "capacity.topolvm.cybozu.com/00default": "100",
        "capacity.topolvm.cybozu.com/ssd": "100",
        "capacity.topolvm.cybozu.com/thin": "500",
    }


async def test_work_queue_dedups_and_serializes_per_key() -> None:
    running: set[str] = set()
    overlaps: list[str] = []
    calls: list[str] = []
    gate = asyncio.Event()

    async def reconcile(key: str) -> Result | None:
        if key in running:
            overlaps.append(key)
        running.add(key)
        calls.append(key)
        await gate.wait()
        running.discard(key)
        return None

    ctl = Controller("t", reconcile, workers=4)
    task = asyncio.create_task(ctl.run())
    for _ in range(5):
        ctl.enqueue("a")
    ctl.enqueue("b")
    await asyncio.sleep(0.05)
    assert sorted(calls) == ["a", "b"]  # five adds of "a" while queued = one run
    ctl.enqueue("a")  # added while "a" runs: runs again afterwards, not concurrently
    await asyncio.sleep(0.05)
    assert calls.count("a") == 1
    gate.set()
    await asyncio.sleep(0.05)
    assert calls.count("a") == 2 and overlaps == []
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_controller_retries_with_backoff_then_forgets() -> None:
    attempts: list[float] = []
    loop = asyncio.get_running_loop()

    async def reconcile(key: str) -> Result | None:
        attempts.append(loop.time())
        if len(attempts) < 4:
            raise RuntimeError("transient")
        return None

    ctl = Controller("t", reconcile, base_backoff=0.01)
    task = asyncio.create_task(ctl.run())
    ctl.enqueue("k")
    for _ in range(100):
        if len(attempts) >= 4:
            break
        await asyncio.sleep(0.01)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert len(attempts) == 4
    assert gaps[0] >= 0.009 and gaps[2] >= 0.039  # 10 ms, 20 ms, 40 ms
    assert ctl.backoff("k") == 0.01  # success forgets the failures
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_requeue_after_and_earliest_delay_wins() -> None:
    q = WorkQueue()
    q.add_after("k", 10)
    q.add_after("k", 0.01)  # an earlier retry replaces the later one
    key = await asyncio.wait_for(q.get(), 1)
    assert key == "k"
    q.done("k")
    q.close()


def _api_error(code: int, reason: str) -> ApiError:
    return ApiError(status=Status(code=code, reason=reason, message=f"{reason} happened"))


@pytest.mark.parametrize(
    ("code", "reason", "kind", "transient"),
    [
        (400, "BadRequest", kube.BadRequest, False),
        (401, "Unauthorized", kube.Unauthorized, False),
        (403, "Forbidden", kube.Forbidden, False),
        (404, "NotFound", kube.NotFound, False),
        (409, "Conflict", kube.Conflict, True),
        (409, "AlreadyExists", kube.AlreadyExists, False),
        (410, "Expired", kube.Gone, False),
        (422, "Invalid", kube.Invalid, False),
        (429, "TooManyRequests", kube.TooManyRequests, True),
        (500, "InternalError", kube.ServerError, True),
        (503, "ServiceUnavailable", kube.ServerError, True),
        (418, "Teapot", kube.StatusError, False),
    ],
)
def test_api_errors_are_typed_by_status(
    code: int, reason: str, kind: type[kube.StatusError], transient: bool
) -> None:
    with pytest.raises(kube.KubeError) as caught, kube.translated():
        raise _api_error(code, reason)
    e = caught.value
    assert type(e) is kind and isinstance(e, kube.StatusError)
    assert (e.code, e.reason, e.message) == (code, reason, f"{reason} happened")
    assert isinstance(e.__cause__, ApiError)  # the library's error stays chained
    assert str(e) == kube.describe(e) == f"{code} {reason}: {reason} happened"
    assert kube.is_transient(e) is transient
    assert kube.is_transient(e.__cause__) is transient  # the raw error is judged the same way


def _http_status_error(code: int, body: bytes | None, content_type: str) -> httpx2.HTTPStatusError:
    request = httpx2.Request("GET", "https://apiserver/api/v1/nodes?watch=true")
    stream = httpx2.ByteStream(b"unread")  # a watch's body: lightkube checks the status first
    response = (
        httpx2.Response(code, headers={"Content-Type": content_type}, stream=stream,
                        request=request)
        if body is None
        else httpx2.Response(code, headers={"Content-Type": content_type}, content=body,
                             request=request)
    )  # fmt: skip
    with pytest.raises(httpx2.HTTPStatusError) as caught:
        response.raise_for_status()
    return caught.value


@pytest.mark.parametrize(
    ("code", "body", "content_type", "kind", "reason", "transient"),
    [
        # a watch refused by API Priority and Fairness: lightkube raises httpx's error
        (429, None, "application/json", kube.TooManyRequests, "Too Many Requests", True),
        (500, None, "application/json", kube.ServerError, "Internal Server Error", True),
        (410, None, "application/json", kube.Gone, "Gone", False),
        # a Status whose Content-Type carries a parameter: lightkube does not read it
        (409, b'{"kind":"Status","reason":"Conflict","message":"changed"}',
         "application/json; charset=utf-8", kube.Conflict, "Conflict", True),
        (502, b"<html>bad gateway</html>", "text/html", kube.ServerError, "Bad Gateway", True),
    ],
)  # fmt: skip
def test_error_answers_lightkube_leaves_untyped_are_typed_by_status(
    code: int, body: bytes | None, content_type: str, kind: type[kube.StatusError], reason: str,
    transient: bool,
) -> None:  # fmt: skip
    raw = _http_status_error(code, body, content_type)
    with pytest.raises(kube.KubeError) as caught, kube.translated():
        raise raw
    e = caught.value
    assert type(e) is kind and isinstance(e, kube.StatusError)
    assert (e.code, e.reason) == (code, reason)
    assert e.message == ("changed" if body and b"Status" in body else str(raw).splitlines()[0])
    assert e.__cause__ is raw
    assert kube.is_transient(e) is transient and kube.is_transient(raw) is transient


def test_transport_errors_are_unreachable_and_other_errors_pass_through() -> None:
    with pytest.raises(kube.Unreachable) as caught, kube.translated():
        raise httpx2.ConnectError("connection refused")
    assert "cannot reach the Kubernetes API: ConnectError: connection refused" in str(caught.value)
    assert kube.is_transient(caught.value)
    with pytest.raises(ValueError), kube.translated():  # not the client libraries': untouched
        raise ValueError("a bug")
    assert kube.describe(ValueError("a bug")) == "ValueError: a bug"
    assert not kube.is_transient(ValueError("a bug"))


async def test_a_translated_watch_raises_typed_errors_and_closes_its_stream() -> None:
    closed: list[bool] = []

    async def watch() -> AsyncIterator[int]:
        try:
            yield 1
            raise _api_error(410, "Expired")
        finally:
            closed.append(True)

    got: list[int] = []
    with pytest.raises(kube.Gone):
        async for item in kube.translated_stream(watch()):
            got.append(item)
    assert got == [1] and closed == [True]

    closed.clear()
    stream = kube.translated_stream(watch())
    assert await anext(stream) == 1
    await stream.aclose()  # the caller stops early: the watch is closed too
    assert closed == [True]


async def test_transient_api_errors_are_waited_out_and_others_raised() -> None:
    """What a daemon's indispensable start-up write does (topolvm-node publishing its transfer
    endpoint): a 500, a 429 or a lost connection is tried again; a 403 is the answer."""
    failures: list[Exception] = [
        kube.ServerError(500, "InternalError", "injected"),
        kube.TooManyRequests(429, "TooManyRequests", "slow down"),
        kube.Unreachable("cannot reach the Kubernetes API: connection reset"),
    ]
    seen: list[str] = []

    async def write() -> str:
        if failures:
            raise failures.pop(0)
        return "written"

    got = await api.retry_transient(write, "a write", first=0.001, most=0.002, on_retry=seen.append)
    assert got == "written" and len(seen) == 3 and "500 InternalError" in seen[0]

    async def forbidden() -> str:
        raise kube.Forbidden(403, "Forbidden", "nodes is forbidden")

    with pytest.raises(kube.Forbidden):
        await api.retry_transient(forbidden, "a write", first=0.001)


async def test_a_bounded_wait_gives_up_with_the_last_transient_error() -> None:
    """What a daemon's start-up read does (topolvm-node's and topolvm-controller's check_api):
    an API server that throttles is waited out, one that never answers ends the start with the
    error it gave, after the attempts asked for."""
    calls: list[int] = []

    async def throttled() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise kube.TooManyRequests(429, "TooManyRequests", "slow down")
        return "node"

    assert await api.retry_transient(throttled, "a read", first=0.001, attempts=3) == "node"
    calls.clear()

    async def down() -> str:
        calls.append(1)
        raise kube.Unreachable("cannot reach the Kubernetes API: connection refused")

    with pytest.raises(kube.Unreachable, match="connection refused"):
        await api.retry_transient(down, "a read", first=0.001, attempts=4)
    assert len(calls) == 4

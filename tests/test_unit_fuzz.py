"""Seeded property-based fuzzing (hypothesis) of what anyone can send or write: scheduler
extender bodies, AdmissionReview bodies and pods, quantities and LogicalVolume objects, capacity
annotations, and the names and tags that reach LVM's command line. The property is always the
same: a clear, typed error or a well-formed answer; never another exception, never a value
that could be read as an option.

Each test runs 300 seeded cases (derandomized: the same cases on every run, so CI is
repeatable); set ``TOPOLVM_FUZZ_EXAMPLES`` for a longer campaign. lvmd's gRPC requests are
fuzzed against real LVM in tests/test_lvmd_fuzz.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz_helpers import fuzz as fuzz_settings
from tests.fuzz_helpers import json_values
from tests.podmutate_helpers import Reader
from topolvm import capacity_annotations as cap
from topolvm.constants import NORMAL
from topolvm.controller.podmutate import decide
from topolvm.controller.webhook import BadReview, parse_review
from topolvm.k8s.lvobject import MAX_QUANTITY, InvalidQuantity, LogicalVolumeObject, parse_quantity
from topolvm.lvm import validate
from topolvm.lvm.errors import InvalidInput
from topolvm.scheduler.extender import BadRequest
from topolvm.scheduler.verbs import Extender

fuzz = fuzz_settings(300)

quantity_text = st.from_regex(
    r"[+-]?([0-9]{1,25}(\.[0-9]{0,5})?|\.[0-9]{1,5})([eE][+-]?[0-9]{1,9}|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?",
    fullmatch=True,
)
annotation_values = st.one_of(st.text(max_size=30), quantity_text, st.integers().map(str))
capacity_keys = st.sampled_from(["ssd", "hdd", "00default", ""]).map(
    lambda dc: NORMAL.capacity_prefix + dc
)
annotation_maps = st.dictionaries(
    capacity_keys | st.text(max_size=20), annotation_values, max_size=5
)


@fuzz
@given(st.one_of(quantity_text, st.text(max_size=40), st.integers(), json_values))
def test_a_quantity_is_bytes_in_range_or_an_invalid_quantity(value: Any) -> None:
    try:
        n = parse_quantity(value)
    except InvalidQuantity:
        return
    assert isinstance(n, int) and n <= MAX_QUANTITY


lv_specs = st.fixed_dictionaries(
    {},
    optional={
        "nodeName": st.text(max_size=20) | json_values,
        "size": quantity_text | st.integers() | json_values,
        "deviceClass": st.text(max_size=20) | json_values,
        "source": st.text(max_size=20),
        "accessType": st.sampled_from(["rw", "ro", ""]) | st.text(max_size=5),
        "lvcreateOptionClass": st.text(max_size=20),
    },
)
lv_statuses = st.fixed_dictionaries(
    {},
    optional={
        "volumeID": st.text(max_size=20),
        "code": st.integers(min_value=0, max_value=20) | json_values,
        "message": st.text(max_size=40),
        "currentSize": quantity_text | st.integers() | json_values,
    },
)


@fuzz
@given(lv_specs, lv_statuses, st.dictionaries(st.text(max_size=10), st.text(max_size=10)))
def test_a_logicalvolume_anyone_wrote_reads_or_fails_as_the_reconciler_expects(
    spec: dict[str, Any], status: dict[str, Any], labels: dict[str, str]
) -> None:
    """The API server checks metadata and the CRD's types only loosely (int-or-string, a
    pattern), so spec and status come as anything; topolvm-node's reconciler skips an object
    that raises one of these and must never see another error."""
    obj = {"metadata": {"name": "lv", "uid": "u", "labels": labels}, "spec": spec, "status": status}
    try:
        lv = LogicalVolumeObject.from_dict(obj)
    except (InvalidQuantity, KeyError, TypeError, ValueError):
        return
    assert lv.size <= MAX_QUANTITY
    assert lv.current_size is None or lv.current_size <= MAX_QUANTITY


@fuzz
@given(annotation_maps)
def test_capacity_annotations_decode_to_bytes_or_a_named_error(raw: dict[str, str]) -> None:
    try:
        requested = cap.decode_pod(NORMAL, raw, "pod p")
    except cap.BadCapacityAnnotation as e:
        assert "pod p annotation" in str(e)
    else:
        assert all(isinstance(v, int) and v >= 0 for v in requested.values())
    for _, (value, text) in cap.decode_node(NORMAL, raw).items():
        assert value is None or 0 <= value <= cap.UINT64_MAX
        assert isinstance(text, str)
    assert cap.node_free(NORMAL, raw, "ssd") >= 0


def _extender_body(pod_annotations: Any, nodes: Any, names: Any) -> bytes:
    body: dict[str, Any] = {"Pod": {"metadata": {"name": "p", "annotations": pod_annotations}}}
    if nodes is not None:
        body["Nodes"] = {"items": nodes}
    if names is not None:
        body["NodeNames"] = names
    return json.dumps(body).encode()


node_objects = st.lists(
    st.fixed_dictionaries(
        {
            "metadata": st.fixed_dictionaries(
                {"name": st.text(max_size=10), "annotations": annotation_maps}
            )
        }
    )
    | json_values,
    max_size=4,
)


@fuzz
@given(
    st.one_of(
        st.binary(max_size=200),
        st.builds(_extender_body, annotation_maps | json_values, node_objects | st.none(),
                  st.lists(st.text(max_size=8), max_size=3) | st.none() | json_values),
    )
)  # fmt: skip
def test_the_extender_answers_any_body_with_json_or_a_bad_request(body: bytes) -> None:
    ext = Extender()
    for verb in (ext.predicate, ext.prioritize):
        try:
            reply = verb(body)
        except BadRequest as e:
            assert str(e)
            continue
        msgspec.json.decode(reply)  # a well-formed answer


volume = st.one_of(
    st.fixed_dictionaries({"name": st.text(max_size=5), "persistentVolumeClaim":
                           st.fixed_dictionaries({"claimName": st.sampled_from(["a", "b", ""])})}),
    st.fixed_dictionaries({"name": st.text(max_size=5), "ephemeral": json_values}),
    json_values,
)  # fmt: skip
pods = st.one_of(
    json_values,
    st.fixed_dictionaries({
        "metadata": st.fixed_dictionaries(
            {}, optional={"annotations": annotation_maps | json_values}
        ),
        "spec": st.fixed_dictionaries({
            "containers": st.lists(
                json_values | st.fixed_dictionaries({"name": st.text(max_size=5)}), max_size=3
            ) | json_values,
            "volumes": st.lists(volume, max_size=3) | json_values,
        }),
    }),
)  # fmt: skip
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
# What the API server returns is always an object; its fields can be anything it let through.
claims = st.fixed_dictionaries(
    {},
    optional={
        "ns/a": st.fixed_dictionaries({"spec": st.fixed_dictionaries(
            {"storageClassName": st.sampled_from(["ssd", "x", ""]) | json_values,
             "resources": json_values})}) | json_objects,
    },
)  # fmt: skip
classes = st.fixed_dictionaries(
    {},
    optional={
        "ssd": st.fixed_dictionaries({"provisioner": st.just("topolvm.io"),
                                      "parameters": json_values}) | json_objects,
    },
)  # fmt: skip


@fuzz
@given(pods, claims, classes, st.booleans())
def test_the_pod_webhook_decides_on_any_pod(
    pod: Any, pvcs: dict[str, Any], storage_classes: dict[str, Any], marker: bool
) -> None:
    reader = Reader(pvcs)
    reader.classes = storage_classes  # these, not the helper's well-formed ones
    decision = asyncio.run(decide(pod, "ns", reader, NORMAL, marker=marker))
    assert decision.kind in ("mutated", "allowed", "denied", "errored")
    assert isinstance(decision.message, str)
    if decision.kind == "errored":
        assert decision.code in (400, 500) and decision.message


@fuzz
@given(st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode())))
def test_an_admission_review_body_is_parsed_or_refused_clearly(body: bytes) -> None:
    try:
        review = parse_review(body)
    except BadReview as e:
        assert str(e)
        return
    assert review["kind"] == "AdmissionReview"


@fuzz
@given(st.text(max_size=140))
def test_a_name_that_reaches_lvm_cannot_be_read_as_an_option(name: str) -> None:
    try:
        accepted = validate.lv_name(name)
    except InvalidInput as e:
        assert str(e)
        return
    assert accepted == name and not name.startswith("-") and name not in (".", "..")
    assert name.isascii() and all(c.isalnum() or c in "+_.-" for c in name)


@fuzz
@given(st.text(max_size=60))
def test_a_tag_that_reaches_lvm_cannot_be_read_as_an_option(value: str) -> None:
    try:
        accepted = validate.tag(value)
    except InvalidInput as e:
        assert str(e)
        return
    assert accepted == value and not value.startswith("-") and value.isascii()
    assert all(c.isalnum() or c in "_+./=!:&#-" for c in value)

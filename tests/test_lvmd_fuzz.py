"""Seeded fuzzing of lvmd's gRPC requests against real LVM inside User-Mode Linux: any name,
tags, device class, option class and size a client can send ends the call OK or with the
status code of a bad request, never with LVM itself refusing what lvmd let through, and every
LV that exists afterwards has a name LVM's rules and lvmd's allow.

Two refusals carry INTERNAL, as upstream's lvmd answers them (wire compatibility,
../shared/spec/topolvm-upstream.md): an unknown lvcreate option class and a thick size that is
not a multiple of 4096. Both are decided before any command runs."""

# ruff: noqa: F811  (fixtures imported from tests.lvmd_lvm_helpers are parameters here)

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz_helpers import fuzz
from tests.lvm_fixtures import LvmdClient, lvm
from tests.lvmd_lvm_helpers import MiB, lv_report, thick  # noqa: F401
from topolvm.lvm import validate
from topolvm.lvm.errors import InvalidInput
from topolvm.proto import lvmd_pb2 as pb

pytestmark = pytest.mark.uml

# Codes a well-formed refusal may carry: the request, not lvmd or LVM, is at fault.
UPSTREAM_INTERNAL = (
    "unsupported lvcreate-option-class target: ",
    "cannot create volume as given size is not a multiple of 4096",
)
REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNIMPLEMENTED,
}  # fmt: skip

names = st.one_of(
    st.text(max_size=140),
    st.from_regex(r"[A-Za-z0-9+_.-]{1,130}", fullmatch=True),  # near LVM's own alphabet
    st.sampled_from(["-y", "--help", ".", "..", "snapshot1", "a_tmeta", "vg1/x", "a b", "a\n"]),
)
sizes = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=1, max_value=64).map(lambda n: n * MiB),
)
device_classes = st.one_of(st.sampled_from(["", "ssd", "nope", "../ssd"]), st.text(max_size=10))
tags = st.lists(st.one_of(st.text(max_size=20), st.sampled_from(["-x", "a=b", "k:v"])), max_size=3)


async def refused_as_the_clients_fault(call: object) -> bool:
    """True if ``call`` succeeds or is refused for its request."""
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as e:
        why = e.details() or ""
        assert why, "a refusal says why"
        if e.code() == grpc.StatusCode.INTERNAL:
            return why.startswith(UPSTREAM_INTERNAL)
        return e.code() in REFUSALS
    return True


def remove_every_lv() -> None:
    for name in lv_report("vg1"):
        lvm("lvremove", "-f", "-y", f"vg1/{name}")


@fuzz(60)
@given(names, tags, device_classes, st.sampled_from(["", "nope"]), sizes, sizes)
async def test_any_lv_request_is_done_or_refused_as_the_clients_fault(
    thick: LvmdClient,
    name: str,
    tag_list: list[str],
    device_class: str,
    option_class: str,
    size: int,
    new_size: int,
) -> None:
    try:
        create = pb.CreateLVRequest(
            name=name, tags=tag_list, device_class=device_class,
            lvcreate_option_class=option_class, size_bytes=size,
        )  # fmt: skip
    except ValueError:  # protobuf refuses strings that are not valid UTF-8 (surrogates)
        return
    try:
        resize = pb.ResizeLVRequest(name=name, device_class=device_class, size_bytes=new_size)
        remove = pb.RemoveLVRequest(name=name, device_class=device_class)
        assert await refused_as_the_clients_fault(thick.lv.CreateLV(create)), create
        assert await refused_as_the_clients_fault(thick.lv.ResizeLV(resize)), resize
        assert await refused_as_the_clients_fault(thick.lv.RemoveLV(remove)), remove
        for lv in lv_report("vg1"):
            try:
                validate.lv_name(lv)
            except InvalidInput as e:  # pragma: no cover - the failure this test looks for
                raise AssertionError(f"an LV lvmd should have refused exists: {e}") from e
    finally:
        remove_every_lv()

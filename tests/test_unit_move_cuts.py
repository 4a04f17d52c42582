"""The source node's cuts for a move's copy (node/transfer.py): round 1 keeps its cut, round 2
is always a delta against it, and what a move's copy does when a cut is gone or finds no room
(its copy fails, so the move rolls back, instead of the pod waiting down)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from grpclib.const import Status

from topolvm.k8s.lvobject import LogicalVolumeObject
from topolvm.node.finalcut import FinalCuts
from topolvm.node.lvmd_client import LvmdCallError
from topolvm.node.transfer import TransferService
from topolvm.node.volumes import CutOverflowed, Cuts, LvmdVolumes, NoRoomForCut, cut_name, round_two
from topolvm.proto import lvmd_pb2 as pb
from topolvm.proto import volumedata_pb2 as vd
from topolvm.transfer.errors import Refused, SourceFailed


class FakeCuts:
    def __init__(self, existing: list[str] | None = None, room: bool = True,
                 list_fails: bool = False, overflowed: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.existing = list(existing or [])
        self.room = room
        self.list_fails = list_fails
        self.overflowed = overflowed
        self.min_cow: dict[str, int] = {}
        self.lvmd = FakeLvmd()  # the source is closed (tests/test_unit_source_open.py)

    async def ensure(self, job: str, source: str, dc: str, min_cow: int = 0) -> str:
        if not self.room:
            raise NoRoomForCut("no room for the copy's point-in-time cut of vol")
        self.existing.append(job)
        self.min_cow[job] = min_cow
        return cut_name(job)

    async def check(self, job: str, dc: str) -> None:
        if job in self.overflowed:
            raise CutOverflowed(f"the point-in-time cut {cut_name(job)} overflowed")

    async def listed(self, dc: str, strict: bool = False) -> list[str]:
        if self.list_fails and strict:
            raise SourceFailed("lvmd cannot list the cuts: unavailable")
        return [] if self.list_fails else list(self.existing)


def _service(cuts: FakeCuts) -> Any:
    service = TransferService.__new__(TransferService)
    service.cuts = cuts  # type: ignore[assignment]
    service.final = FinalCuts(cuts, LvmdVolumes(cuts.lvmd), "node-a", asyncio.ensure_future)  # type: ignore[arg-type]
    return service


def _lv(name: str, round_: int = 1, keep: bool = True) -> LogicalVolumeObject:
    return LogicalVolumeObject(
        name, f"uid-{name}", "1", "b", 1 << 30, volume_id=f"id-{name}", copy_source="src",
        copy_round=round_, copy_keep_cut=keep,
    )  # fmt: skip


SOURCE = LogicalVolumeObject("src", "uid-src", "1", "a", 1 << 30, volume_id="id-src")


async def test_round_one_reads_a_cut_and_round_two_a_delta_against_it() -> None:
    cuts = FakeCuts()
    assert await _service(cuts)._cut(_lv("t"), SOURCE) == (cut_name("uid-t"), "")
    volume, base = await _service(cuts)._cut(_lv("t", 2), SOURCE)
    assert (volume, base) == (cut_name(round_two("uid-t")), cut_name("uid-t"))


async def test_round_two_without_its_first_cut_fails_for_good() -> None:
    with pytest.raises(Refused) as e:
        await _service(FakeCuts())._cut(_lv("t", 2), SOURCE)
    assert e.value.reason == "unknown-job" and not e.value.transient
    assert "cannot be a delta" in e.value.message


async def test_an_lvmd_error_listing_the_cuts_is_transient_not_a_missing_cut() -> None:
    with pytest.raises(SourceFailed):
        await _service(FakeCuts(["uid-t"], list_fails=True))._cut(_lv("t", 2), SOURCE)


async def test_no_room_fails_a_moves_copy_but_a_restore_waits() -> None:
    with pytest.raises(Refused) as e:
        await _service(FakeCuts(["uid-t"], room=False))._cut(_lv("t", 2), SOURCE)
    assert e.value.reason == "invalid" and not e.value.transient
    assert "the move rolls back" in e.value.message
    with pytest.raises(NoRoomForCut):  # a restore or clone (no keepCut): transient
        await _service(FakeCuts(room=False))._cut(_lv("r", keep=False), SOURCE)


async def test_a_moves_cuts_may_be_smaller_than_their_origin_a_restores_not() -> None:
    """A move's first cut lives while the pod writes, its second while the pod is stopped:
    without room for whole ones (lvmd decides), an eighth and a 32nd of the origin at least."""
    cuts = FakeCuts()
    await _service(cuts)._cut(_lv("t"), SOURCE)
    await _service(cuts)._cut(_lv("t", 2), SOURCE)
    await _service(cuts)._cut(_lv("r", keep=False), SOURCE)
    assert cuts.min_cow == {"uid-t": (1 << 30) // 8, round_two("uid-t"): (1 << 30) // 32,
                            "uid-r": 0}  # fmt: skip


@pytest.mark.parametrize("job", ["uid-t", round_two("uid-t")])
async def test_an_overflowed_cut_fails_a_moves_copy_for_good(job: str) -> None:
    """The first cut (it lived while the pod wrote), or the second, made by the final copy:
    either overflowed fails the copy."""
    with pytest.raises(Refused) as e:
        await _service(FakeCuts(["uid-t"], overflowed=(job,)))._cut(_lv("t", 2), SOURCE)
    assert e.value.reason == "invalid" and not e.value.transient
    assert "overflowed" in e.value.message and "the move rolls back" in e.value.message


class FakeLvmd:
    """What :class:`Cuts` asks of lvmd: CreateCut (or, from an older lvmd, UNIMPLEMENTED),
    CreateLVSnapshot, DescribeLV with check_snapshot."""

    def __init__(self, cut_code: Status | None = None, invalid: bool = False) -> None:
        self.cut_code = cut_code
        self.invalid = invalid
        self.calls: list[str] = []

    async def create_cut(self, request: vd.CreateCutRequest) -> vd.CreateCutResponse:
        self.calls.append(f"CreateCut {request.name} {request.min_cow_bytes}")
        if self.cut_code is not None:
            raise LvmdCallError(self.cut_code, "no")
        return vd.CreateCutResponse(path=f"/dev/vg1/{request.name}", cow_bytes=64 << 20)

    async def create_lv_snapshot(
        self, request: pb.CreateLVSnapshotRequest
    ) -> pb.CreateLVSnapshotResponse:
        self.calls.append(f"CreateLVSnapshot {request.name}")
        return pb.CreateLVSnapshotResponse()

    async def open_state(self, name: str, device_class: str) -> vd.OpenStateResponse:
        return vd.OpenStateResponse(active=True)

    async def describe_lv(
        self, name: str, device_class: str, with_uuid: bool = False, check_snapshot: bool = False
    ) -> vd.DescribeLVResponse:
        assert check_snapshot
        return vd.DescribeLVResponse(invalid=self.invalid, cow_bytes=64 << 20)


async def test_cuts_ask_lvmd_for_a_smaller_one_only_with_min_cow() -> None:
    lvmd = FakeLvmd()
    cuts = Cuts(lvmd)  # type: ignore[arg-type]
    assert await cuts.ensure("j", "vol", "ssd", 8 << 20) == "cut.j"
    assert await cuts.ensure("k", "vol", "ssd") == "cut.k"
    assert lvmd.calls == [f"CreateCut cut.j {8 << 20}", "CreateLVSnapshot cut.k"]
    await cuts.check("j", "ssd")  # not overflowed: fine


async def test_an_older_lvmd_makes_a_whole_cut_and_no_room_is_said() -> None:
    old = FakeLvmd(Status.UNIMPLEMENTED)
    assert await Cuts(old).ensure("j", "vol", "ssd", 8 << 20) == "cut.j"  # type: ignore[arg-type]
    assert old.calls == [f"CreateCut cut.j {8 << 20}", "CreateLVSnapshot cut.j"]
    full = Cuts(FakeLvmd(Status.RESOURCE_EXHAUSTED))  # type: ignore[arg-type]
    with pytest.raises(NoRoomForCut):
        await full.ensure("j", "vol", "ssd", 8 << 20)


async def test_an_overflowed_cut_says_how_large_its_area_was() -> None:
    with pytest.raises(CutOverflowed) as e:
        await Cuts(FakeLvmd(invalid=True)).check("j", "ssd")  # type: ignore[arg-type]
    assert "cut.j overflowed: the volume changed by more than its 64.0 MiB copy-on-write" in (
        str(e.value)
    )

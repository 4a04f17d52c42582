"""The source node's cuts for a move's copy (node/transfer.py): round 1 keeps its cut, round 2
is always a delta against it, and what a move's copy does when a cut is gone or finds no room
(its copy fails, so the move rolls back, instead of the pod waiting down)."""

from __future__ import annotations

from typing import Any

import pytest

from topolvm.k8s.lvobject import LogicalVolumeObject
from topolvm.node.transfer import TransferService
from topolvm.node.volumes import NoRoomForCut, cut_name, round_two
from topolvm.transfer.errors import Refused, SourceFailed


class FakeCuts:
    def __init__(self, existing: list[str] | None = None, room: bool = True,
                 list_fails: bool = False) -> None:  # fmt: skip
        self.existing = list(existing or [])
        self.room = room
        self.list_fails = list_fails

    async def ensure(self, job: str, source: str, dc: str) -> str:
        if not self.room:
            raise NoRoomForCut("no room for the copy's point-in-time cut of vol")
        self.existing.append(job)
        return cut_name(job)

    async def listed(self, dc: str, strict: bool = False) -> list[str]:
        if self.list_fails and strict:
            raise SourceFailed("lvmd cannot list the cuts: unavailable")
        return [] if self.list_fails else list(self.existing)


def _service(cuts: FakeCuts) -> Any:
    service = TransferService.__new__(TransferService)
    service.cuts = cuts  # type: ignore[assignment]
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

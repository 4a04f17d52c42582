"""A move's final cut made the moment its source is unmounted (node/finalearly.py,
node/transfer.py): the cut and its delta are ready when the final copy asks, which then asks
lvmd for neither; a publish of the source before the final copy reads the cut drops it (the final
copy waits for the source to close again); once read, it stays. And which unmounts lead to one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from topolvm.k8s.lvobject import CopyPhase, CopyStatus, LogicalVolumeObject
from topolvm.node.finalearly import EarlyFinalCuts
from topolvm.node.orphans import copy_running, final_pending
from topolvm.node.transfer import FinalCuts, TransferService
from topolvm.node.volumes import JobEnded, LvmdVolumes, cut_name, round_two
from topolvm.proto import volumedata_pb2 as vd
from topolvm.transfer.errors import Refused

MOUNTED = vd.OpenStateResponse(active=True, open_count=1, mounts=["/var/lib/kubelet/a/mount"])
CLOSED = vd.OpenStateResponse(active=True)
DELTA = [(0, 1 << 20), (8 << 20, 2 << 20)]
FIRST, SECOND = cut_name("uid-t"), cut_name(round_two("uid-t"))


class Lvmd:
    """lvmd as the source node's copies ask it: open state, describe, thin delta (counted)."""

    def __init__(self, state: vd.OpenStateResponse = CLOSED) -> None:
        self.state = state
        self.asked_open = 0
        self.deltas = 0

    async def open_state(self, name: str, device_class: str) -> vd.OpenStateResponse:
        self.asked_open += 1
        return self.state

    async def describe_lv(self, name: str, device_class: str, with_uuid: bool = False) -> Any:
        return vd.DescribeLVResponse(path=f"/dev/vg/{name}", size_bytes=1 << 30, thin=True,
                                     chunk_bytes=64 << 10, uuid=f"uuid-{name}")  # fmt: skip

    async def thin_delta(self, name: str, base: str, dc: str) -> AsyncIterator[tuple[int, int]]:
        self.deltas += 1
        for r in DELTA:
            yield r


class Cuts:
    def __init__(self, lvmd: Lvmd) -> None:
        self.lvmd = lvmd
        self.existing = ["uid-t"]  # the first cut, kept since the pre-copy
        self.made: list[str] = []
        self.removed: list[str] = []
        self.checked: list[str] = []  # the cuts checked for an overflow
        self.hold: asyncio.Event | None = None  # lvmd makes the cut once it is set

    async def ensure(self, job: str, source: str, dc: str, min_cow: int = 0) -> str:
        if self.hold is not None:
            await self.hold.wait()
        self.existing.append(job)
        self.made.append(job)
        return cut_name(job)

    def known(self, job: str, dc: str) -> str:
        if job not in self.existing:
            raise JobEnded("gone")
        return cut_name(job)

    async def check(self, job: str, dc: str) -> None:
        self.checked.append(job)

    async def listed(self, dc: str, strict: bool = False) -> list[str]:
        return list(self.existing)

    async def remove(self, job: str, dc: str) -> bool:
        self.removed.append(job)
        self.existing.remove(job)
        return True


def _service(lvmd: Lvmd) -> Any:
    service = TransferService.__new__(TransferService)
    service.cuts = Cuts(lvmd)  # type: ignore[assignment]
    service.volumes = LvmdVolumes(lvmd)  # type: ignore[arg-type]
    service.finals = FinalCuts()
    service.node = "node-a"
    service._cleanups = set()
    return service


def _target(round_: int = 1, done: bool = True, source: str = "pvc-src") -> LogicalVolumeObject:
    copy = CopyStatus(phase=CopyPhase.DONE if done else CopyPhase.COPYING, round=1)
    return LogicalVolumeObject("t", "uid-t", "1", "node-b", 1 << 30, volume_id="id-t",
                               copy_source=source, copy_round=round_, copy_keep_cut=True,
                               copy=copy)  # fmt: skip


SOURCE = LogicalVolumeObject("pvc-src", "uid-src", "1", "node-a", 1 << 30, device_class="thin",
                             volume_id="id-src")  # fmt: skip


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    from topolvm.node import sourceopen

    monkeypatch.setattr(sourceopen, "PATIENCE", 0.2)
    monkeypatch.setattr(sourceopen, "EVERY", 0.05)


async def test_the_final_copy_finds_its_cut_and_delta_made_when_the_source_closed() -> None:
    lvmd = Lvmd()
    service = _service(lvmd)
    await service.final_early(_target(), SOURCE)
    assert service.cuts.made == [round_two("uid-t")]
    assert (lvmd.asked_open, lvmd.deltas) == (1, 1)
    assert service.cuts.checked == ["uid-t", round_two("uid-t")]  # after the source closed
    # the final copy is asked for: nothing more to cut, check, ask about or compare
    assert await service._cut(_target(round_=2, done=False), SOURCE) == (SECOND, FIRST)
    assert service.cuts.made == [round_two("uid-t")]
    assert service.cuts.checked == ["uid-t", round_two("uid-t")]
    assert lvmd.asked_open == 1
    assert await service.volumes.changed(SECOND, FIRST, "thin") == DELTA
    assert lvmd.deltas == 1
    assert await service.volumes.changed(SECOND, FIRST, "thin") == DELTA  # kept for one use
    assert lvmd.deltas == 2


async def test_a_source_published_again_before_the_final_copy_loses_its_early_cut() -> None:
    lvmd = Lvmd()
    service = _service(lvmd)
    await service.final_early(_target(), SOURCE)
    await service.source_published("id-other")  # another volume: nothing happens
    assert service.cuts.removed == []
    await service.source_published("id-src")
    assert service.cuts.removed == [round_two("uid-t")]
    # the delta kept for it is gone too, and the final copy waits for the source to close
    lvmd.state = MOUNTED
    with pytest.raises(Refused) as e:
        await service._cut(_target(round_=2, done=False), SOURCE)
    assert e.value.reason == "unavailable" and "still open" in e.value.message
    assert await service.volumes.changed(SECOND, FIRST, "thin") == DELTA
    assert lvmd.deltas == 2


async def test_an_early_cut_the_final_copy_reads_stays_when_the_source_is_published() -> None:
    service = _service(Lvmd())
    await service.final_early(_target(), SOURCE)
    await service._cut(_target(round_=2, done=False), SOURCE)
    await service.source_published("id-src")
    assert service.cuts.removed == []


async def test_a_publish_while_the_early_cut_is_made_drops_it() -> None:
    service = _service(Lvmd())
    service.cuts.hold = asyncio.Event()
    early = asyncio.create_task(service.final_early(_target(), SOURCE))
    await asyncio.sleep(0.01)  # it asked lvmd for the cut
    published = asyncio.create_task(service.source_published("id-src"))
    await asyncio.sleep(0.01)
    service.cuts.hold.set()
    await asyncio.gather(early, published)
    assert service.cuts.made == [round_two("uid-t")]
    assert service.cuts.removed == [round_two("uid-t")]
    assert "uid-t" not in service.finals.early


async def test_a_source_still_open_gets_no_early_cut_and_no_error() -> None:
    lvmd = Lvmd(MOUNTED)
    service = _service(lvmd)
    await service.final_early(_target(), SOURCE)  # logged; the final copy cuts it later
    assert service.cuts.made == [] and lvmd.deltas == 0
    lvmd.state = CLOSED
    assert await service._cut(_target(round_=2, done=False), SOURCE) == (SECOND, FIRST)
    assert service.cuts.made == [round_two("uid-t")]


def test_a_second_cut_belongs_to_a_move_from_its_pre_copys_end_to_its_final_copys() -> None:
    assert not final_pending(_target(done=False))  # the pre-copy runs: no second cut yet
    assert final_pending(_target())  # pre-copied: the move stops the pod next
    assert final_pending(_target(round_=2, done=False))
    done = _target(round_=2)
    done.copy = CopyStatus(phase=CopyPhase.DONE, round=2)
    assert not final_pending(done)
    restore = _target()
    restore.copy_keep_cut = False  # a restore or clone has no final copy
    assert not final_pending(restore)
    assert copy_running(_target(), second=True)  # the sweep keeps an early cut


class Store:
    def __init__(self, *lvs: LogicalVolumeObject) -> None:
        self.lvs = [SOURCE, *lvs]

    async def find_by_volume_id(self, volume_id: str) -> LogicalVolumeObject | None:
        return next((lv for lv in self.lvs if lv.volume_id == volume_id), None)

    def all(self) -> list[LogicalVolumeObject]:
        return list(self.lvs)


class Transfer:
    def __init__(self) -> None:
        self.early: list[str] = []
        self.published: list[str] = []

    def final_early_soon(self, target: LogicalVolumeObject, source: LogicalVolumeObject) -> None:
        self.early.append(f"{source.name}->{target.name}")

    async def source_published(self, volume_id: str) -> None:
        self.published.append(volume_id)


async def test_only_an_unmount_of_a_pre_copied_moves_source_on_this_node_cuts_early() -> None:
    precopying = _target(done=False)
    precopying.name = "t2"
    other = _target(source="pvc-other")
    other.name = "t3"
    transfer = Transfer()
    hooks = EarlyFinalCuts(Store(_target(), precopying, other), transfer, "node-a")  # type: ignore[arg-type]
    await hooks.unpublished("id-src", "/var/lib/kubelet/pods/p/volumes/x/mount")
    assert transfer.early == ["pvc-src->t"]
    await hooks.unpublished("id-unknown", "/x")
    elsewhere = EarlyFinalCuts(Store(_target()), transfer, "node-b")  # type: ignore[arg-type]
    await elsewhere.unpublished("id-src", "/x")  # the source is not this node's
    assert transfer.early == ["pvc-src->t"]
    await hooks.published("id-src", "/x", {})
    assert transfer.published == ["id-src"]

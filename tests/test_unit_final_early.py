"""A move's final cut made the moment its source is unmounted (node/finalcut.py): the cut and
its delta are ready when the final copy asks, which then asks lvmd for neither; a publish of the
source before the final copy reads the cut drops it at once, without waiting (the final copy
then waits for the source to close again); once read, it stays. A second cut this process did
not make (before a restart), or could not drop, is never trusted: it is made again once the
source is closed. And which unmounts lead to one, and the publish hooks' time limits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest
from grpclib.const import Status

from topolvm.k8s.lvobject import CopyPhase, CopyStatus, LogicalVolumeObject
from topolvm.node import csihooks
from topolvm.node.finalcut import FinalCutHooks, FinalCuts
from topolvm.node.lvmd_client import LvmdCallError
from topolvm.node.orphans import copy_running, final_pending
from topolvm.node.volumes import LvmdVolumes, cut_name, round_two
from topolvm.proto import volumedata_pb2 as vd
from topolvm.transfer.errors import Refused, TransferError

MOUNTED = vd.OpenStateResponse(active=True, open_count=1, mounts=["/var/lib/kubelet/a/mount"])
CLOSED = vd.OpenStateResponse(active=True)
DELTA = [(0, 1 << 20), (8 << 20, 2 << 20)]
FIRST, SECOND = cut_name("uid-t"), cut_name(round_two("uid-t"))
R2 = round_two("uid-t")


class Lvmd:
    """lvmd as the source node's copies ask it: open state, describe, thin delta (counted)."""

    def __init__(self, state: vd.OpenStateResponse | None = CLOSED) -> None:
        self.state = state  # None: an lvmd without OpenState
        self.asked_open = 0
        self.deltas = 0
        self.existing: list[str] = []  # the cuts (Cuts's), by job
        self.describe_hold: asyncio.Event | None = None  # lvmd describes once it is set
        self.describe_error: Status | None = None  # lvmd's answer to a describe of a cut

    async def open_state(self, name: str, device_class: str) -> vd.OpenStateResponse:
        self.asked_open += 1
        if self.state is None:
            raise LvmdCallError(Status.UNIMPLEMENTED, "unknown method OpenState")
        return self.state

    async def describe_lv(self, name: str, device_class: str, with_uuid: bool = False) -> Any:
        if self.describe_hold is not None:
            await self.describe_hold.wait()
        if name.startswith("cut.") and self.describe_error is not None:
            raise LvmdCallError(self.describe_error, "lvmd is restarting")
        if name.startswith("cut.") and name[4:] not in self.existing:
            raise LvmdCallError(Status.NOT_FOUND, f"logical volume {name} is not found")
        return vd.DescribeLVResponse(path=f"/dev/vg/{name}", size_bytes=1 << 30, thin=True,
                                     chunk_bytes=64 << 10, uuid=f"uuid-{name}")  # fmt: skip

    async def thin_delta(self, name: str, base: str, dc: str) -> AsyncIterator[tuple[int, int]]:
        self.deltas += 1
        for r in DELTA:
            yield r


class Cuts:
    def __init__(self, lvmd: Lvmd) -> None:
        self.lvmd = lvmd
        self.existing = lvmd.existing
        self.existing.append("uid-t")  # the first cut, kept since the pre-copy
        self.lists = 0
        self.made: list[str] = []
        self.removed: list[str] = []
        self.checked: list[str] = []  # the cuts checked for an overflow
        self.hold: asyncio.Event | None = None  # lvmd makes the cut once it is set
        self.remove_fails = False
        self.list_hold: asyncio.Event | None = None  # lvmd lists the cuts once it is set

    async def ensure(self, job: str, source: str, dc: str, min_cow: int = 0) -> str:
        if self.hold is not None:
            await self.hold.wait()
        self.existing.append(job)
        self.made.append(job)
        return cut_name(job)

    def known(self, job: str, dc: str) -> str:  # as topolvm-node's: no lvmd asked
        return cut_name(job)

    async def check(self, job: str, dc: str) -> None:
        self.checked.append(job)

    async def listed(self, dc: str, strict: bool = False) -> list[str]:
        self.lists += 1
        if self.list_hold is not None:
            await self.list_hold.wait()
        return list(self.existing)

    async def remove(self, job: str, dc: str) -> bool:
        if self.remove_fails:
            raise TransferError(f"cannot remove the cut of job {job}: in use")
        self.removed.append(job)
        self.existing.remove(job)
        return True


class Final(FinalCuts):
    """FinalCuts over the fakes; its background work is awaited by :meth:`settle`."""

    def __init__(self, lvmd: Lvmd | None = None) -> None:
        self.lvmd = lvmd or Lvmd()
        self.tasks: list[asyncio.Future[None]] = []
        super().__init__(Cuts(self.lvmd), LvmdVolumes(self.lvmd), "node-a", self._keep)  # type: ignore[arg-type]

    def _keep(self, work: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.ensure_future(work))

    async def settle(self) -> None:
        await asyncio.gather(*self.tasks)

    @property
    def fake(self) -> Cuts:
        return self.cuts  # type: ignore[return-value]


def _target(round_: int = 1, done: bool = True, source: str = "pvc-src") -> LogicalVolumeObject:
    copy = CopyStatus(phase=CopyPhase.DONE if done else CopyPhase.COPYING, round=1)
    return LogicalVolumeObject("t", "uid-t", "1", "node-b", 1 << 30, volume_id="id-t",
                               copy_source=source, copy_round=round_, copy_keep_cut=True,
                               copy=copy)  # fmt: skip


FINAL = _target(round_=2, done=False)  # the final copy asked for
SOURCE = LogicalVolumeObject("pvc-src", "uid-src", "1", "node-a", 1 << 30, device_class="thin",
                             volume_id="id-src")  # fmt: skip


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    from topolvm.node import sourceopen

    monkeypatch.setattr(sourceopen, "PATIENCE", 0.2)
    monkeypatch.setattr(sourceopen, "EVERY", 0.05)


async def test_the_final_copy_finds_its_cut_and_delta_made_when_the_source_closed() -> None:
    final = Final()
    await final.make_early(_target(), SOURCE, 0)
    assert final.fake.made == [R2]
    assert (final.lvmd.asked_open, final.lvmd.deltas) == (1, 1)
    # the base, kept while the pod wrote, is checked for an overflow; the second cut, made
    # now of a closed source, cannot have overflowed (no LVM command for it, the pod down)
    assert final.fake.checked == ["uid-t"]
    # the final copy is asked for: nothing more to cut, check, ask about or compare, and no
    # list of the cuts (a report, after lvmd's other changes): lvmd's model has both
    lists = final.fake.lists
    assert await final.for_copy(FINAL, SOURCE) == (SECOND, FIRST)
    assert final.fake.made == [R2] and final.fake.checked == ["uid-t"]
    assert final.fake.lists == lists
    assert final.lvmd.asked_open == 1
    assert await final.volumes.changed(SECOND, FIRST, "thin") == DELTA
    assert final.lvmd.deltas == 1
    assert await final.volumes.changed(SECOND, FIRST, "thin") == DELTA  # kept for one use
    assert final.lvmd.deltas == 2


async def test_a_second_cut_made_without_an_early_one_is_checked() -> None:
    """No early cut (the unmount was missed): the final copy makes the second cut and checks
    it (it may have found the source closed only because lvmd cannot tell: no OpenState), and
    a resumed final copy checks it again."""
    final = Final()
    assert await final.for_copy(FINAL, SOURCE) == (SECOND, FIRST)
    assert final.fake.made == [R2] and final.fake.checked == ["uid-t", R2]
    assert await final.for_copy(FINAL, SOURCE) == (SECOND, FIRST)
    assert final.fake.removed == [] and final.fake.checked == ["uid-t", R2, "uid-t", R2]


async def test_a_source_published_again_before_the_final_copy_loses_its_early_cut() -> None:
    final = Final()
    await final.make_early(_target(), SOURCE, 0)
    final.publishing("id-other")  # another volume: nothing happens
    await final.settle()
    assert final.fake.removed == []
    final.publishing("id-src")  # returns at once; the cut goes in the background
    assert "uid-t" not in final.early
    await final.settle()
    assert final.fake.removed == [R2]
    # the delta kept for it is gone too, and the final copy waits for the source to close
    final.lvmd.state = MOUNTED
    with pytest.raises(Refused) as e:
        await final.for_copy(FINAL, SOURCE)
    assert e.value.reason == "unavailable" and "still open" in e.value.message
    assert await final.volumes.changed(SECOND, FIRST, "thin") == DELTA
    assert final.lvmd.deltas == 2


async def test_an_early_cut_the_final_copy_reads_stays_when_the_source_is_published() -> None:
    final = Final()
    await final.make_early(_target(), SOURCE, 0)
    await final.for_copy(FINAL, SOURCE)
    final.publishing("id-src")
    await final.settle()
    assert final.fake.removed == []
    assert await final.for_copy(FINAL, SOURCE) == (SECOND, FIRST)  # a resumed final copy
    assert final.fake.made == [R2]


async def test_a_publish_while_the_early_cut_is_made_drops_it_without_waiting() -> None:
    final = Final()
    final.fake.hold = asyncio.Event()
    early = asyncio.create_task(final.make_early(_target(), SOURCE, 0))
    await asyncio.sleep(0.01)  # it asked lvmd for the cut, holding the target's lock
    final.publishing("id-src")  # does not wait for that lock
    final.fake.hold.set()
    await early
    await final.settle()
    assert final.fake.made == [R2] and final.fake.removed == [R2]
    assert "uid-t" not in final.early


async def test_a_drop_queued_behind_a_final_copy_spares_the_cut_that_copy_reads() -> None:
    final = Final()
    await final.make_early(_target(), SOURCE, 0)
    final.lvmd.describe_hold = asyncio.Event()
    copying = asyncio.create_task(final.for_copy(FINAL, SOURCE))
    await asyncio.sleep(0.01)  # the final copy holds the target's lock, asking lvmd
    final.publishing("id-src")  # the early cut is not trusted; its drop waits for the lock
    final.lvmd.describe_hold.set()
    assert await copying == (SECOND, FIRST)  # cut again, once the source is closed
    await final.settle()
    assert final.fake.removed == [R2] and final.fake.made == [R2, R2]
    assert R2 in final.fake.existing  # the queued drop spared the cut the final copy reads


async def test_a_drop_queued_behind_a_final_copy_listing_the_cuts_spares_its_cut() -> None:
    """The same when lvmd cannot describe the cuts (the final copy lists them instead)."""
    final = Final()
    await final.make_early(_target(), SOURCE, 0)
    final.lvmd.describe_error = Status.UNAVAILABLE
    final.fake.list_hold = asyncio.Event()
    copying = asyncio.create_task(final.for_copy(FINAL, SOURCE))
    await asyncio.sleep(0.01)
    final.publishing("id-src")
    final.fake.list_hold.set()
    assert await copying == (SECOND, FIRST)
    await final.settle()
    assert final.fake.removed == [R2] and final.fake.made == [R2, R2]
    assert R2 in final.fake.existing


async def test_an_early_cut_removed_behind_its_back_is_made_again() -> None:
    final = Final()
    await final.make_early(_target(), SOURCE, 0)
    final.fake.existing.remove(R2)  # removed outside topolvm-node
    assert await final.for_copy(FINAL, SOURCE) == (SECOND, FIRST)
    assert final.fake.made == [R2, R2] and final.fake.checked[-1] == R2
    assert final.lvmd.asked_open == 2  # made again only once the source was seen closed


async def test_a_publish_after_the_unmount_drops_a_cut_made_later() -> None:
    final = Final()
    final.publishing("id-src")  # a publish between the unmount and the early cut's start
    await final.make_early(_target(), SOURCE, 0)
    assert final.fake.removed == [R2] and "uid-t" not in final.early


async def test_a_second_cut_this_process_did_not_make_is_made_again_once_closed() -> None:
    """A topolvm-node restarted after an early cut (its source published again since, perhaps),
    or one whose early cut could not be dropped: the cut found is not trusted."""
    final = Final(Lvmd(MOUNTED))
    final.fake.existing.append(R2)  # from before a restart
    with pytest.raises(Refused) as e:
        await final.for_copy(FINAL, SOURCE)
    assert "still open" in e.value.message and final.fake.removed == [R2]
    final.lvmd.state = CLOSED
    assert await final.for_copy(FINAL, SOURCE) == (SECOND, FIRST)
    assert final.fake.made == [R2]
    # an early cut whose drop failed is not trusted either
    other = Final()
    await other.make_early(_target(), SOURCE, 0)
    other.fake.remove_fails = True
    other.publishing("id-src")
    await other.settle()
    assert R2 in other.fake.existing and "uid-t" not in other.early
    other.fake.remove_fails = False
    await other.for_copy(FINAL, SOURCE)
    assert other.fake.removed == [R2] and other.fake.made == [R2, R2]


async def test_no_early_cut_while_the_source_is_open_or_lvmd_cannot_tell() -> None:
    final = Final(Lvmd(MOUNTED))  # a second pod on this node still mounts it
    await final.make_early(_target(), SOURCE, 0)  # logged; the final copy cuts it later
    assert final.fake.made == [] and final.lvmd.deltas == 0
    final.lvmd.state = CLOSED
    assert await final.for_copy(FINAL, SOURCE) == (SECOND, FIRST)
    older = Final(Lvmd(None))  # an lvmd without OpenState
    await older.make_early(_target(), SOURCE, 0)
    assert older.fake.made == []
    assert await older.for_copy(FINAL, SOURCE) == (SECOND, FIRST)  # as before: cut, warned


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


async def test_only_an_unmount_of_a_pre_copied_moves_source_on_this_node_cuts_early() -> None:
    precopying = _target(done=False)
    precopying.name, precopying.uid = "t2", "uid-t2"
    other = _target(source="pvc-other")
    other.name, other.uid = "t3", "uid-t3"
    final = Final()
    hooks = FinalCutHooks(Store(_target(), precopying, other), final, "node-a")  # type: ignore[arg-type]
    await hooks.unpublished("id-src", "/var/lib/kubelet/pods/p/volumes/x/mount")
    await final.settle()
    assert final.fake.made == [R2] and list(final.early) == ["uid-t"]
    await hooks.unpublished("id-unknown", "/x")
    elsewhere = FinalCutHooks(Store(_target()), Final(), "node-b")  # type: ignore[arg-type]
    await elsewhere.unpublished("id-src", "/x")  # the source is not this node's
    assert elsewhere.final.tasks == []  # type: ignore[attr-defined]
    await hooks.publishing("id-src", "/x")
    await final.settle()
    assert final.fake.removed == [R2]


class Hook:
    def __init__(self, hang: bool = False) -> None:
        self.hang = hang
        self.calls: list[str] = []

    async def publishing(self, volume_id: str, target: str) -> None:
        self.calls.append(volume_id)
        if self.hang:
            await asyncio.sleep(60)


async def test_a_hook_that_hangs_is_cut_short_and_the_next_still_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(csihooks, "HOOK_TIMEOUT", 0.05)
    first, second = Hook(hang=True), Hook()
    await csihooks.run_hooks([first, second], "publishing", "v", "/t")  # type: ignore[list-item]
    assert first.calls == ["v"] and second.calls == ["v"]


async def test_a_final_copy_whose_first_cut_is_gone_is_refused_though_its_early_cut_is_there() -> (
    None
):
    final = Final()
    await final.make_early(_target(), SOURCE, 0)
    final.fake.existing.remove("uid-t")  # removed outside topolvm-node
    with pytest.raises(Refused) as e:
        await final.for_copy(FINAL, SOURCE)
    assert e.value.reason == "unknown-job" and "cannot be a delta" in e.value.message

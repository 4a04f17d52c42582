"""lvmd's Watch against real LVM inside User-Mode Linux: the first report, changes through
lvmd and outside it, and the free space it computes without asking LVM."""

# ruff: noqa: F811  (fixtures imported from tests.lvmd_lvm_helpers are parameters here)

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.lvm_fixtures import THICK, GiB, LvmdClient, VolumeGroups, lvm
from tests.lvmd_lvm_helpers import (
    MiB,
    both,  # noqa: F401
    vg_free,
)
from topolvm.proto import lvmd_pb2 as pb

pytestmark = pytest.mark.uml


async def next_watch(stream: Any, timeout: float) -> pb.WatchResponse:
    msg = await asyncio.wait_for(stream.read(), timeout)
    assert isinstance(msg, pb.WatchResponse), f"Watch stream ended: {msg!r}"
    return msg


async def test_watch_initial_and_after_changes(both: LvmdClient) -> None:
    stream = both.vg.Watch(pb.Empty())
    first = await next_watch(stream, 10)
    items = {i.device_class: i for i in first.items}
    assert set(items) == {"ssd", "thin"}
    free = vg_free("vg1")
    assert items["ssd"].free_bytes == free - GiB and first.free_bytes == free - GiB
    assert items["ssd"].size_bytes == items["thin"].size_bytes > 0
    assert items["thin"].free_bytes == free  # raw VG free for thin items
    assert items["thin"].thin_pool.size_bytes == 2 * GiB
    assert items["thin"].thin_pool.overprovision_bytes == 10 * GiB
    assert items["thin"].thin_pool.metadata_percent > 0

    await both.lv.CreateLV(pb.CreateLVRequest(name="w", size_bytes=GiB))
    second = await next_watch(stream, 10)
    assert second.free_bytes == first.free_bytes - GiB
    await both.lv.CreateLV(pb.CreateLVRequest(name="wt", device_class="thin", size_bytes=GiB))
    third = await next_watch(stream, 10)
    assert {i.device_class: i for i in third.items}["thin"].thin_pool.overprovision_bytes == 9 * GiB

    # a burst of changes coalesces: fewer messages than changes, the last one exact
    await asyncio.gather(
        *(both.lv.CreateLV(pb.CreateLVRequest(name=f"b{n}", size_bytes=64 * MiB)) for n in range(5))
    )
    messages = []
    while True:
        try:
            messages.append(await next_watch(stream, 1.0))
        except TimeoutError:
            break
    assert 1 <= len(messages) < 5
    assert messages[-1].free_bytes == vg_free("vg1") - GiB
    stream.cancel()


async def test_watch_periodic_refresh_sees_outside_changes(
    vgs: VolumeGroups, lvmd_factory: Any
) -> None:
    """The safety net alone (device events off): the periodic report."""
    vgs.create("vg1", size_gib=8)
    client: LvmdClient = await lvmd_factory(
        [THICK], options={"refresh_interval": 0.3, "device_events": False}
    )
    stream = client.vg.Watch(pb.Empty())
    first = await next_watch(stream, 10)
    lvm("lvcreate", "-n", "outside", "-L", "1g", "-y", "vg1")  # not through lvmd
    second = await next_watch(stream, 10)
    assert second.free_bytes == first.free_bytes - GiB
    names = [v.name for v in (await client.vg.GetLVList(pb.GetLVListRequest())).volumes]
    assert names == ["outside"]
    stream.cancel()


async def test_outside_changes_are_seen_from_device_events_alone(
    vgs: VolumeGroups, lvmd_factory: Any
) -> None:
    """No periodic report in the test's time (an hour's interval): an lvcreate, lvextend and
    lvremove made outside lvmd reach the Watch, GetLVList and GetFreeBytes within seconds, each
    for one report; lvmd's own changes cause none."""
    vgs.create("vg1", size_gib=8)
    client: LvmdClient = await lvmd_factory([THICK], options={"refresh_interval": 3600})
    state = client.server.state
    watch = WatchReader(client)
    first = await watch.until_quiet()
    assert client.server.device_events is not None and client.server.device_events.events == 0

    async def seen(change: list[str], free: int) -> None:
        """The change reaches the Watch (each read waits at most 10 s) for one report."""
        reports = state.refreshes
        lvm(*change)  # not through lvmd
        while (await watch.until_quiet()).free_bytes != free:
            pass
        assert state.refreshes == reports + 1, change

    await seen(["lvcreate", "-n", "outside", "-L", "1g", "-y", "vg1"], first.free_bytes - GiB)
    names = [v.name for v in (await client.vg.GetLVList(pb.GetLVListRequest())).volumes]
    assert names == ["outside"]
    await seen(["lvextend", "-L", "+512m", "vg1/outside"], first.free_bytes - GiB - 512 * MiB)
    free = await client.vg.GetFreeBytes(pb.GetFreeBytesRequest(device_class="ssd"))
    assert free.free_bytes == first.free_bytes - GiB - 512 * MiB
    await seen(["lvremove", "-f", "vg1/outside"], first.free_bytes)
    assert state.device_refreshes == 3

    # lvmd's own changes: their events come, and cost no report
    events = client.server.device_events.events
    await client.lv.CreateLV(pb.CreateLVRequest(name="own", size_bytes=GiB))
    await client.lv.ResizeLV(pb.ResizeLVRequest(name="own", size_bytes=2 * GiB))
    await client.lv.RemoveLV(pb.RemoveLVRequest(name="own"))
    assert (await watch.until_quiet()).free_bytes == first.free_bytes
    assert client.server.device_events.events > events, "the kernel announced lvmd's changes"
    assert state.device_refreshes == 3, "lvmd's own changes re-read LVM"
    watch.close()


class WatchReader:
    """Reads a Watch stream in a task (a timed-out read would cancel the whole call)."""

    def __init__(self, client: LvmdClient) -> None:
        self.stream = client.vg.Watch(pb.Empty())
        self.queue: asyncio.Queue[pb.WatchResponse] = asyncio.Queue()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.stream:
            self.queue.put_nowait(msg)

    async def until_quiet(self) -> pb.WatchResponse:
        """The last message of a burst: read until none comes for a second."""
        last = await asyncio.wait_for(self.queue.get(), 10)
        while True:
            try:
                last = await asyncio.wait_for(self.queue.get(), 1.0)
            except TimeoutError:
                return last

    def close(self) -> None:
        self.stream.cancel()
        self.task.cancel()


async def test_watch_after_plain_thick_changes_reports_the_model_exactly(
    both: LvmdClient,
) -> None:
    watch = WatchReader(both)
    first = await watch.until_quiet()
    calls = both.server.runner.calls
    # 95 MiB: LVM rounds each up to 96 MiB (4 MiB extents); the model must take the real size
    await asyncio.gather(
        *(both.lv.CreateLV(pb.CreateLVRequest(name=f"e{n}", size_bytes=95 * MiB)) for n in range(4))
    )
    after_creates = await watch.until_quiet()
    assert both.server.runner.calls == calls + 4, "4 lvcreate and no report for the Watch"
    assert after_creates.free_bytes == vg_free("vg1") - GiB == first.free_bytes - 4 * 96 * MiB
    thin = {i.device_class: i for i in after_creates.items}["thin"]
    assert thin.free_bytes == vg_free("vg1")  # the thin item's raw VG free moves too
    assert thin.thin_pool.overprovision_bytes == 10 * GiB
    # an LV lvmd made since the last report, then one that report shows as linear ("-wi-a-")
    await both.lv.RemoveLV(pb.RemoveLVRequest(name="e0"))
    assert (await watch.until_quiet()).free_bytes == vg_free("vg1") - GiB
    assert both.server.runner.calls == calls + 5
    await both.vg.GetLVList(pb.GetLVListRequest())  # dirty model: one fullreport
    await both.lv.RemoveLV(pb.RemoveLVRequest(name="e1"))
    assert (await watch.until_quiet()).free_bytes == vg_free("vg1") - GiB
    assert both.server.runner.calls == calls + 7, "lvremove, and no second report"
    watch.close()


async def test_watch_after_an_allocation_lvmd_cannot_compute_reads_lvm(
    vgs: VolumeGroups, lvmd_factory: Any
) -> None:
    vgs.create("vg1", size_gib=8, pvs=2)
    vgs.create("vg2", size_gib=4, pvs=2)
    striped = {**THICK, "name": "striped", "volume-group": "vg2", "default": False, "stripe": 2}
    client: LvmdClient = await lvmd_factory(
        [THICK, striped],
        **{"lvcreate-option-classes": [{"name": "raid1", "options": ["--type=raid1", "-m1"]}]},
    )
    watch = WatchReader(client)
    first = await watch.until_quiet()
    req = pb.CreateLVRequest(name="m", size_bytes=GiB, lvcreate_option_class="raid1")
    await client.lv.CreateLV(req)
    second = await watch.until_quiet()
    # two legs and their metadata: more than the LV's size left the VG
    assert second.free_bytes == vg_free("vg1") - GiB < first.free_bytes - 2 * GiB
    await client.lv.RemoveLV(pb.RemoveLVRequest(name="m"))
    third = await watch.until_quiet()
    assert third.free_bytes == vg_free("vg1") - GiB == first.free_bytes
    # a striped class rounds to stripes x extents: lvmd reads LVM rather than compute it
    calls = client.server.runner.calls
    await client.lv.CreateLV(pb.CreateLVRequest(name="s", device_class="striped", size_bytes=GiB))
    items = {i.device_class: i for i in (await watch.until_quiet()).items}
    assert items["striped"].free_bytes == vg_free("vg2") - GiB
    assert client.server.runner.calls == calls + 2, "lvcreate, then one report for the Watch"
    watch.close()

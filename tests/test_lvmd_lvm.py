"""lvmd against real LVM inside User-Mode Linux: every RPC, thick and thin, with status codes."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Awaitable
from typing import Any

import grpc
import pytest

from tests.lvm_fixtures import THICK, THIN, GiB, LvmdClient, VolumeGroups, lvm
from topolvm.config.lvmd import LvmdConfig
from topolvm.daemon import StartupError
from topolvm.lvmd.server import LvmdServer
from topolvm.proto import lvmd_pb2 as pb

pytestmark = pytest.mark.uml
MiB = 1 << 20


async def code_of(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value.code(), e.value.details() or ""


async def next_watch(stream: Any, timeout: float) -> pb.WatchResponse:
    msg = await asyncio.wait_for(stream.read(), timeout)
    assert isinstance(msg, pb.WatchResponse), f"Watch stream ended: {msg!r}"
    return msg


def lv_report(vg: str) -> dict[str, dict[str, str]]:
    out = lvm(
        "lvs", vg, "--reportformat", "json", "--units", "b", "--nosuffix",
        "-o", "lv_name,lv_size,lv_attr,lv_tags,stripes,pool_lv,origin",
        "-o", "+lv_kernel_major,lv_kernel_minor",
    )  # fmt: skip
    rows = json.loads(out)["report"][0]["lv"]
    return {r["lv_name"]: r for r in rows}


def vg_free(vg: str) -> int:
    out = lvm("vgs", vg, "--reportformat", "json", "--units", "b", "--nosuffix", "-o", "vg_free")
    return int(json.loads(out)["report"][0]["vg"][0]["vg_free"])


@pytest.fixture
async def thick(vgs: VolumeGroups, lvmd_factory: Any) -> LvmdClient:
    vgs.create("vg1", size_gib=8)
    client: LvmdClient = await lvmd_factory([THICK])
    return client


@pytest.fixture
async def both(vgs: VolumeGroups, lvmd_factory: Any) -> LvmdClient:
    vgs.create("vg1", size_gib=8)
    vgs.thin_pool("vg1", "pool0", 2)
    client: LvmdClient = await lvmd_factory([THICK, THIN])
    return client


# -- CreateLV / RemoveLV -------------------------------------------------------------------


async def test_create_thick_rounds_to_extents_and_reports_device(thick: LvmdClient) -> None:
    resp = await thick.lv.CreateLV(
        pb.CreateLVRequest(name="lv-a", size_bytes=1023 * MiB, tags=["owner=test"])
    )
    assert resp.volume.name == "lv-a"
    assert resp.volume.size_bytes == 1024 * MiB  # LVM rounds up to the 4 MiB extent
    st = os.stat("/dev/vg1/lv-a")
    assert (resp.volume.dev_major, resp.volume.dev_minor) == (
        os.major(st.st_rdev),
        os.minor(st.st_rdev),
    )
    row = lv_report("vg1")["lv-a"]
    assert int(row["lv_size"]) == 1024 * MiB
    assert row["lv_tags"] == "owner=test"
    listed = {v.name: v for v in (await thick.vg.GetLVList(pb.GetLVListRequest())).volumes}
    assert listed["lv-a"].path == "/dev/vg1/lv-a"
    assert listed["lv-a"].attr == row["lv_attr"]
    assert list(listed["lv-a"].tags) == ["owner=test"]


async def test_create_is_idempotent_for_same_size_and_conflicts_for_another(
    thick: LvmdClient,
) -> None:
    first = await thick.lv.CreateLV(pb.CreateLVRequest(name="idem", size_bytes=1023 * MiB))
    again = await thick.lv.CreateLV(pb.CreateLVRequest(name="idem", size_bytes=1023 * MiB))
    assert again.volume.size_bytes == first.volume.size_bytes
    assert (again.volume.dev_major, again.volume.dev_minor) == (
        first.volume.dev_major,
        first.volume.dev_minor,
    )
    code, msg = await code_of(
        thick.lv.CreateLV(pb.CreateLVRequest(name="idem", size_bytes=2 * GiB))
    )
    assert code == grpc.StatusCode.ALREADY_EXISTS and "idem" in msg
    assert list(lv_report("vg1")) == ["idem"]


async def test_create_without_space_is_resource_exhausted(thick: LvmdClient) -> None:
    free = vg_free("vg1")
    code, msg = await code_of(
        thick.lv.CreateLV(pb.CreateLVRequest(name="big", size_bytes=free + 4 * MiB))
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"free={free}" in msg and f"requested={free + 4 * MiB}" in msg
    assert lv_report("vg1") == {}
    # the spare is not applied to admission (upstream semantics): all raw free space is usable
    resp = await thick.lv.CreateLV(pb.CreateLVRequest(name="all", size_bytes=free))
    assert resp.volume.size_bytes == free


async def test_create_error_codes(thick: LvmdClient) -> None:
    calls = thick.server.runner.calls
    code, msg = await code_of(
        thick.lv.CreateLV(pb.CreateLVRequest(name="x", device_class="nope", size_bytes=GiB))
    )
    assert (code, msg) == (grpc.StatusCode.NOT_FOUND, "device-class not found: nope")
    code, msg = await code_of(thick.lv.CreateLV(pb.CreateLVRequest(name="x", size_bytes=GiB + 512)))
    assert code == grpc.StatusCode.INTERNAL and "multiple of 4096" in msg
    code, msg = await code_of(
        thick.lv.CreateLV(pb.CreateLVRequest(name="x", size_bytes=GiB, lvcreate_option_class="no"))
    )
    assert (
        code == grpc.StatusCode.INTERNAL and "unsupported lvcreate-option-class target: no" in msg
    )
    assert thick.server.runner.calls == calls, "no LVM command may run for a rejected request"


@pytest.mark.parametrize(
    "name",
    ["-rf", "--help", "../../etc/passwd", "vg1/other", "a b", "", ".", "snapshot0", "x_tmeta",
     "n" * 128, "bad\nname"],
)  # fmt: skip
async def test_hostile_names_are_rejected_before_lvm_runs(thick: LvmdClient, name: str) -> None:
    calls = thick.server.runner.calls
    requests: list[Awaitable[Any]] = [
        thick.lv.CreateLV(pb.CreateLVRequest(name=name, size_bytes=GiB)),
        thick.lv.RemoveLV(pb.RemoveLVRequest(name=name)),
        thick.lv.ResizeLV(pb.ResizeLVRequest(name=name, size_bytes=GiB)),
    ]
    for call in requests:
        code, msg = await code_of(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, msg
    assert thick.server.runner.calls == calls
    assert lv_report("vg1") == {}


@pytest.mark.parametrize("tag", ["--addtag", "-y", "a b", "x" * 1025, ""])
async def test_hostile_tags_and_sizes_are_rejected(thick: LvmdClient, tag: str) -> None:
    code, _ = await code_of(
        thick.lv.CreateLV(pb.CreateLVRequest(name="t", size_bytes=GiB, tags=[tag]))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    for size in (0, -GiB):
        code, _ = await code_of(thick.lv.CreateLV(pb.CreateLVRequest(name="t", size_bytes=size)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert lv_report("vg1") == {}


async def test_remove(thick: LvmdClient) -> None:
    await thick.lv.CreateLV(pb.CreateLVRequest(name="gone", size_bytes=GiB))
    before = vg_free("vg1")
    await thick.lv.RemoveLV(pb.RemoveLVRequest(name="gone"))
    assert "gone" not in lv_report("vg1")
    assert vg_free("vg1") == before + GiB
    code, _ = await code_of(thick.lv.RemoveLV(pb.RemoveLVRequest(name="gone")))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = await code_of(thick.lv.RemoveLV(pb.RemoveLVRequest(name="gone", device_class="x")))
    assert code == grpc.StatusCode.NOT_FOUND


async def test_remove_refuses_the_thin_pool(both: LvmdClient) -> None:
    code, _ = await code_of(both.lv.RemoveLV(pb.RemoveLVRequest(name="pool0", device_class="thin")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "pool0" in lv_report("vg1")


# -- thin ----------------------------------------------------------------------------------


async def test_thin_create_list_and_overprovision(both: LvmdClient) -> None:
    # pool 2 GiB x ratio 5 = 10 GiB virtual; spare 1 GiB only affects GetFreeBytes
    resp = await both.lv.CreateLV(
        pb.CreateLVRequest(name="t1", device_class="thin", size_bytes=6 * GiB)
    )
    assert resp.volume.size_bytes == 6 * GiB
    await both.lv.CreateLV(pb.CreateLVRequest(name="k1", size_bytes=GiB))
    rows = lv_report("vg1")
    assert rows["t1"]["pool_lv"] == "pool0" and rows["t1"]["lv_attr"].startswith("V")
    thin = [
        v.name for v in (await both.vg.GetLVList(pb.GetLVListRequest(device_class="thin"))).volumes
    ]
    thick = [v.name for v in (await both.vg.GetLVList(pb.GetLVListRequest())).volumes]
    assert thin == ["t1"]
    assert sorted(thick) == ["k1"]  # thick list excludes the pool and thin volumes
    free = await both.vg.GetFreeBytes(pb.GetFreeBytesRequest(device_class="thin"))
    assert free.free_bytes == 10 * GiB - 6 * GiB - GiB
    code, msg = await code_of(
        both.lv.CreateLV(pb.CreateLVRequest(name="t2", device_class="thin", size_bytes=5 * GiB))
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and f"free={4 * GiB}" in msg
    await both.lv.CreateLV(pb.CreateLVRequest(name="t2", device_class="thin", size_bytes=4 * GiB))


async def test_get_free_bytes_thick_subtracts_spare(both: LvmdClient) -> None:
    free = await both.vg.GetFreeBytes(pb.GetFreeBytesRequest())
    assert free.free_bytes == vg_free("vg1") - GiB


# -- stripes and option classes --------------------------------------------------------------


async def test_stripes_and_lvcreate_option_class(vgs: VolumeGroups, lvmd_factory: Any) -> None:
    vgs.create("vg1", size_gib=8, pvs=2)
    striped = {**THICK, "stripe": 2, "stripe-size": "64k"}
    client: LvmdClient = await lvmd_factory(
        [striped],
        **{"lvcreate-option-classes": [{"name": "linear", "options": ["--type=linear", "-Zn"]}]},
    )
    await client.lv.CreateLV(pb.CreateLVRequest(name="s", size_bytes=GiB))
    await client.lv.CreateLV(
        pb.CreateLVRequest(name="l", size_bytes=GiB, lvcreate_option_class="linear")
    )
    out = json.loads(
        lvm(
            "lvs",
            "vg1",
            "--reportformat",
            "json",
            "-o",
            "lv_name,stripes,stripe_size",
            "--units",
            "k",
        )
    )
    rows = {r["lv_name"]: r for r in out["report"][0]["lv"]}
    assert rows["s"]["stripes"] == "2" and rows["s"]["stripe_size"].startswith("64")
    assert rows["l"]["stripes"] == "1"  # the option class replaces the class's stripe settings


# -- ResizeLV ------------------------------------------------------------------------------


async def test_resize_thick_and_thin(both: LvmdClient) -> None:
    await both.lv.CreateLV(pb.CreateLVRequest(name="r", size_bytes=GiB))
    grown = await both.lv.ResizeLV(pb.ResizeLVRequest(name="r", size_bytes=2 * GiB - MiB))
    assert grown.size_bytes == 2 * GiB
    assert int(lv_report("vg1")["r"]["lv_size"]) == 2 * GiB
    same = await both.lv.ResizeLV(pb.ResizeLVRequest(name="r", size_bytes=GiB))  # never shrinks
    assert same.size_bytes == 2 * GiB
    assert int(lv_report("vg1")["r"]["lv_size"]) == 2 * GiB
    code, msg = await code_of(both.lv.ResizeLV(pb.ResizeLVRequest(name="r", size_bytes=100 * GiB)))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and f"requested={98 * GiB}" in msg
    code, _ = await code_of(both.lv.ResizeLV(pb.ResizeLVRequest(name="missing", size_bytes=GiB)))
    assert code == grpc.StatusCode.NOT_FOUND
    await both.lv.CreateLV(pb.CreateLVRequest(name="tr", device_class="thin", size_bytes=GiB))
    resp = await both.lv.ResizeLV(
        pb.ResizeLVRequest(name="tr", device_class="thin", size_bytes=3 * GiB)
    )
    assert resp.size_bytes == 3 * GiB
    code, _ = await code_of(  # a thick LV is not in the thin class
        both.lv.ResizeLV(pb.ResizeLVRequest(name="r", device_class="thin", size_bytes=3 * GiB))
    )
    assert code == grpc.StatusCode.NOT_FOUND


# -- CreateLVSnapshot ------------------------------------------------------------------------


@pytest.mark.parametrize("access", ["ro", "rw"])
async def test_thin_snapshot(both: LvmdClient, access: str) -> None:
    await both.lv.CreateLV(pb.CreateLVRequest(name="src", device_class="thin", size_bytes=GiB))
    with open("/dev/vg1/src", "r+b") as f:
        f.write(b"topolvm-snapshot-data")
    resp = await both.lv.CreateLVSnapshot(
        pb.CreateLVSnapshotRequest(
            name="snap", device_class="thin", source_volume="src", access_type=access,
            size_bytes=2 * GiB,
        )
    )  # fmt: skip
    assert resp.snapshot.name == "snap" and resp.snapshot.size_bytes == 2 * GiB
    row = lv_report("vg1")["snap"]
    assert row["origin"] == "src" and row["pool_lv"] == "pool0"
    assert row["lv_attr"][1] == ("r" if access == "ro" else "w")
    assert row["lv_attr"][4] == "a", "the snapshot must be active"
    with open("/dev/vg1/snap", "rb") as f:
        assert f.read(21) == b"topolvm-snapshot-data"
    assert resp.snapshot.dev_major == int(row["lv_kernel_major"])


async def test_snapshot_errors(both: LvmdClient) -> None:
    await both.lv.CreateLV(pb.CreateLVRequest(name="k", size_bytes=GiB))
    await both.lv.CreateLV(pb.CreateLVRequest(name="t", device_class="thin", size_bytes=2 * GiB))

    def snap(**kw: Any) -> Awaitable[Any]:
        req = {"name": "s", "device_class": "thin", "source_volume": "t", "access_type": "rw", **kw}
        return both.lv.CreateLVSnapshot(pb.CreateLVSnapshotRequest(**req))

    assert (await code_of(snap(device_class="")))[0] == grpc.StatusCode.UNIMPLEMENTED
    assert (await code_of(snap(source_volume="k")))[0] == grpc.StatusCode.UNIMPLEMENTED
    assert (await code_of(snap(source_volume="nope")))[0] == grpc.StatusCode.NOT_FOUND
    assert (await code_of(snap(size_bytes=GiB)))[0] == grpc.StatusCode.OUT_OF_RANGE
    assert (await code_of(snap(size_bytes=9 * GiB)))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (await code_of(snap(access_type="rx")))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert (await code_of(snap(source_volume="--all")))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert sorted(lv_report("vg1")) == ["k", "pool0", "t"]


# -- Watch ---------------------------------------------------------------------------------


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
    vgs.create("vg1", size_gib=8)
    client: LvmdClient = await lvmd_factory([THICK], options={"refresh_interval": 0.3})
    stream = client.vg.Watch(pb.Empty())
    first = await next_watch(stream, 10)
    lvm("lvcreate", "-n", "outside", "-L", "1g", "-y", "vg1")  # not through lvmd
    second = await next_watch(stream, 10)
    assert second.free_bytes == first.free_bytes - GiB
    names = [v.name for v in (await client.vg.GetLVList(pb.GetLVListRequest())).volumes]
    assert names == ["outside"]
    stream.cancel()


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


# -- caching -------------------------------------------------------------------------------


async def test_idle_reads_do_not_call_lvm(thick: LvmdClient) -> None:
    await thick.vg.GetLVList(pb.GetLVListRequest())
    calls = thick.server.runner.calls
    for _ in range(20):
        await thick.vg.GetLVList(pb.GetLVListRequest())
        await thick.vg.GetFreeBytes(pb.GetFreeBytesRequest())
    assert thick.server.runner.calls == calls
    await thick.lv.CreateLV(pb.CreateLVRequest(name="c", size_bytes=GiB))
    after_create = thick.server.runner.calls
    assert after_create == calls + 1, "CreateLV runs exactly one LVM command (lvcreate)"
    for _ in range(5):
        await thick.vg.GetLVList(pb.GetLVListRequest())
    assert thick.server.runner.calls == after_create + 1, "one refresh after a change, then cache"


# -- concurrency ---------------------------------------------------------------------------


async def test_16_parallel_creates(thick: LvmdClient) -> None:
    calls = [
        thick.lv.CreateLV(pb.CreateLVRequest(name=f"p{i:02d}", size_bytes=256 * MiB))
        for i in range(16)
    ]
    results = await asyncio.gather(*calls)
    assert sorted(r.volume.name for r in results) == [f"p{i:02d}" for i in range(16)]
    assert sorted(lv_report("vg1")) == [f"p{i:02d}" for i in range(16)]
    assert len({(r.volume.dev_major, r.volume.dev_minor) for r in results}) == 16


async def test_16_parallel_creates_when_space_runs_out(
    vgs: VolumeGroups, lvmd_factory: Any
) -> None:
    vgs.create("vg1", size_gib=2)
    client: LvmdClient = await lvmd_factory([THICK])
    names = [f"q{i:02d}" for i in range(16)]
    results = await asyncio.gather(
        *(client.lv.CreateLV(pb.CreateLVRequest(name=n, size_bytes=256 * MiB)) for n in names),
        *(client.lv.CreateLV(pb.CreateLVRequest(name=n, size_bytes=256 * MiB)) for n in names[:4]),
        return_exceptions=True,
    )
    ok = {r.volume.name for r in results if isinstance(r, pb.CreateLVResponse)}
    failed = [r for r in results if not isinstance(r, pb.CreateLVResponse)]
    assert all(
        isinstance(f, grpc.aio.AioRpcError) and f.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        for f in failed
    ), failed
    assert set(lv_report("vg1")) == ok
    assert 0 < len(ok) < 16


# -- start-up and shutdown -----------------------------------------------------------------


async def test_startup_names_every_missing_vg_and_pool(vgs: VolumeGroups, tmp_path: Any) -> None:
    vgs.create("vg1", size_gib=2)
    config = LvmdConfig.model_validate(
        {
            "socket-name": str(tmp_path / "s.sock"),
            "lvm-command-prefix": ["/sbin/lvm"],
            "device-classes": [
                {"name": "a", "volume-group": "novg", "default": True},
                {**THIN, "thin-pool": {"name": "nopool", "overprovision-ratio": 2}},
            ],
        }
    )
    with pytest.raises(StartupError) as e:
        await LvmdServer(config).start()
    assert "'novg'" in str(e.value) and "'nopool'" in str(e.value)
    assert not (tmp_path / "s.sock").exists()


async def test_socket_mode_and_graceful_stop(thick: LvmdClient) -> None:
    path = thick.server.config.socket_name
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    create = asyncio.ensure_future(
        thick.lv.CreateLV(pb.CreateLVRequest(name="inflight", size_bytes=GiB))
    )
    await asyncio.sleep(0.05)
    await thick.server.stop()  # in-flight calls get SHUTDOWN_GRACE
    resp = await create
    assert resp.volume.name == "inflight"
    assert "inflight" in lv_report("vg1")
    assert not os.path.exists(path)

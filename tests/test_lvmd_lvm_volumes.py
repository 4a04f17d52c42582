"""lvmd against real LVM inside User-Mode Linux: CreateLV, RemoveLV, thin pools, stripes and
option classes, ResizeLV and CreateLVSnapshot, thick and thin, with status codes."""

# ruff: noqa: F811  (fixtures imported from tests.lvmd_lvm_helpers are parameters here)

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Awaitable
from typing import Any

import grpc
import pytest

from tests.lvm_fixtures import THICK, THIN, GiB, LvmdClient, VolumeGroups, code_of, lvm
from tests.lvmd_lvm_helpers import (
    MiB,
    both,  # noqa: F401
    lv_report,
    thick,  # noqa: F401
    vg_free,
)
from topolvm.proto import lvmd_pb2 as pb

pytestmark = pytest.mark.uml

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


async def test_a_pool_component_left_active_alone_is_deactivated(
    both: LvmdClient, caplog: pytest.LogCaptureFixture
) -> None:
    """An LVM command killed while it held the pool's metadata LV active on its own (found by
    the crash campaign: lvmd SIGKILLed 0.53 s into a thin create) leaves every later activation
    of the pool refused ("Activation of logical volume vg1/pool0 is prohibited while logical
    volume vg1/pool0_tmeta is active"); lvmd deactivates that component and goes on, for a
    create, a resize and a snapshot alike (each takes the retry: its warning is logged)."""
    caplog.set_level(logging.WARNING, logger="topolvm.lvmd.thin_repair")

    def leave_active_alone(component: str) -> None:
        lvm("lvchange", "-an", "vg1")
        lvm("lvchange", "-ay", "-y", f"vg1/{component}")  # LVM's component activation
        with pytest.raises(AssertionError, match="is prohibited while"):
            lvm("lvchange", "-ay", "vg1/pool0")
        caplog.clear()

    def retried() -> bool:
        return any("active on its own" in r.getMessage() for r in caplog.records)

    await both.lv.CreateLV(pb.CreateLVRequest(name="t0", device_class="thin", size_bytes=GiB))
    for component in ("pool0_tmeta", "pool0_tdata"):
        leave_active_alone(component)
        name = f"after-{component.removeprefix('pool0_t')}"
        await both.lv.CreateLV(pb.CreateLVRequest(name=name, device_class="thin", size_bytes=GiB))
        assert os.path.exists(f"/dev/vg1/{name}") and retried()
    leave_active_alone("pool0_tmeta")
    resp = await both.lv.ResizeLV(
        pb.ResizeLVRequest(name="t0", device_class="thin", size_bytes=2 * GiB)
    )
    assert resp.size_bytes == 2 * GiB and retried()
    leave_active_alone("pool0_tmeta")
    snap = await both.lv.CreateLVSnapshot(
        pb.CreateLVSnapshotRequest(
            name="t0-snap", device_class="thin", source_volume="t0", access_type="rw"
        )
    )
    assert snap.snapshot.size_bytes == 2 * GiB and retried()


def _dmsetup(*args: str) -> None:
    proc = subprocess.run(["dmsetup", *args], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"dmsetup {' '.join(args)}: {proc.stderr}"


async def test_a_thin_volume_its_pool_lost_is_created_again(
    vgs: VolumeGroups, lvmd_factory: Any
) -> None:
    """Power lost during a thin create can leave LVM's metadata with the volume while the
    pool's own metadata never got its thin device (crash campaign, seed 20261125 run 7): at
    boot its activation fails with ENODATA. The create retried after the restart must give a
    volume that works, not report the lost one."""
    vgs.create("vg1", size_gib=8)
    vgs.thin_pool("vg1", "pool0", 2)
    before = await lvmd_factory([THICK, THIN])
    await before.lv.CreateLV(pb.CreateLVRequest(name="lost", device_class="thin", size_bytes=GiB))
    thin_id = lvm("lvs", "--noheadings", "-o", "thin_id", "vg1/lost").strip()
    lvm("lvchange", "-an", "vg1/lost")
    lvm("lvchange", "-ay", "vg1/pool0")  # the pool's -tpool device takes the message
    _dmsetup("message", "vg1-pool0-tpool", "0", f"delete {thin_id}")  # what the pool loses
    with pytest.raises(AssertionError, match="No data available"):
        lvm("lvchange", "-ay", "vg1/lost")
    after = await lvmd_factory([THICK, THIN])  # lvmd after the reboot: a fresh report
    resp = await after.lv.CreateLV(
        pb.CreateLVRequest(name="lost", device_class="thin", size_bytes=GiB)
    )
    assert resp.volume.size_bytes == GiB
    with open("/dev/vg1/lost", "r+b") as dev:  # the volume is usable: written and read back
        dev.write(b"topolvm" * 512)
        dev.flush()
        os.fsync(dev.fileno())
        dev.seek(0)
        assert dev.read(7 * 512) == b"topolvm" * 512
    assert lv_report("vg1")["lost"]["lv_attr"][4] == "a"


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

    # a thin volume through the thick class: not one of its volumes
    assert (await code_of(snap(device_class="")))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert (await code_of(snap(source_volume="k")))[0] == grpc.StatusCode.UNIMPLEMENTED
    assert (await code_of(snap(source_volume="nope")))[0] == grpc.StatusCode.NOT_FOUND
    assert (await code_of(snap(size_bytes=GiB)))[0] == grpc.StatusCode.OUT_OF_RANGE
    assert (await code_of(snap(size_bytes=9 * GiB)))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (await code_of(snap(access_type="rx")))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert (await code_of(snap(source_volume="--all")))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert sorted(lv_report("vg1")) == ["k", "pool0", "t"]

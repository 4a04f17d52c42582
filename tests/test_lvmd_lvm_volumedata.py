"""What the node-to-node copy asks of lvmd, against real LVM inside User-Mode Linux: thick
(COW) snapshots as large as their origin, which then cannot grow or be removed under them; a
move's cut with a smaller area on a VG without the room, and its overflow seen; a
volume's device, size and chunk (DescribeLV); a thin volume's mapped blocks from a reserved
metadata snapshot (ThinMappings), also after a reservation was left behind; a thin volume
discarded reads as zeros again; where a thin snapshot maps other blocks than an older one
(ThinDelta): exactly the chunks written between them; and where two thick cuts of one origin
differ (CowDelta, from their exception tables): the same; and who holds a volume open
(OpenState: opened, mounted, stacked on, or nothing)."""

# ruff: noqa: F811  (fixtures imported from tests.lvmd_lvm_helpers are parameters here)

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import grpc
import pytest

from tests.lvm_fixtures import GiB, LvmdClient, code_of, lvm
from tests.lvmd_lvm_helpers import MiB, both, lv_report, vg_free  # noqa: F401
from topolvm.lvm.report import FULLREPORT_ARGS, parse_report
from topolvm.proto import lvmd_pb2 as pb
from topolvm.proto import volumedata_pb2 as vd
from topolvm.transfer.blockio import Volume
from topolvm.transfer.errors import SourceFailed

pytestmark = pytest.mark.uml


async def test_a_thick_snapshot_is_as_large_as_its_origin_and_guards_it(both: LvmdClient) -> None:
    await both.lv.CreateLV(pb.CreateLVRequest(name="k", size_bytes=GiB))
    free = vg_free("vg1")
    req = pb.CreateLVSnapshotRequest(name="k-cut", source_volume="k", access_type="ro")
    snap = (await both.lv.CreateLVSnapshot(req)).snapshot
    assert snap.size_bytes == GiB  # reads as the origin
    row = lv_report("vg1")["k-cut"]
    assert row["origin"] == "k" and row["lv_attr"][1] == "r"
    assert free - vg_free("vg1") >= GiB  # the COW can hold every chunk: it never fills up
    again = (await both.lv.CreateLVSnapshot(req)).snapshot  # a retry finds it
    assert again.name == "k-cut"
    described = await both.data.DescribeLV(vd.DescribeLVRequest(name="k"))
    assert described.cow_origin and not described.thin and described.chunk_bytes == 0

    code, msg = await code_of(both.lv.ResizeLV(pb.ResizeLVRequest(name="k", size_bytes=2 * GiB)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "COW snapshot" in msg
    code, msg = await code_of(both.lv.RemoveLV(pb.RemoveLVRequest(name="k")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "remove the snapshot first" in msg
    assert "k" in lv_report("vg1")

    await both.lv.RemoveLV(pb.RemoveLVRequest(name="k-cut"))
    resized = await both.lv.ResizeLV(pb.ResizeLVRequest(name="k", size_bytes=2 * GiB))
    assert resized.size_bytes == 2 * GiB
    described = await both.data.DescribeLV(vd.DescribeLVRequest(name="k"))
    assert not described.cow_origin and described.size_bytes == 2 * GiB


async def test_a_cut_without_room_for_a_whole_one_is_smaller_and_says_when_it_overflows(
    both: LvmdClient,
) -> None:
    """CreateCut (a move's cut): as large as its origin when a quarter of the room holds it;
    else a quarter of the room (at least min_cow_bytes), and once the origin changed by more,
    DescribeLV says so and reading it fails. (Cuts, like snapshots, may use the spare.)"""

    def cut(name: str, min_cow: int, source: str = "k") -> vd.CreateCutRequest:
        return vd.CreateCutRequest(name=name, source_volume=source, min_cow_bytes=min_cow,
                                   tags=["topolvm/cut"])  # fmt: skip

    # room for four times the origin: a whole cut (it cannot overflow)
    await both.lv.CreateLV(pb.CreateLVRequest(name="s", size_bytes=256 * MiB))
    whole = await both.data.CreateCut(cut("s-cut", 24 * MiB, "s"))
    assert whole.cow_bytes == 256 * MiB and whole.path == "/dev/vg1/s-cut"
    described = await both.data.DescribeLV(vd.DescribeLVRequest(name="s-cut",
                                                                check_snapshot=True))  # fmt: skip
    assert not described.invalid and described.cow_bytes >= 256 * MiB  # with LVM's overhead
    await both.lv.RemoveLV(pb.RemoveLVRequest(name="s-cut"))
    await both.lv.CreateLV(pb.CreateLVRequest(name="k", size_bytes=2 * GiB))

    free = (await both.vg.GetFreeBytes(pb.GetFreeBytesRequest())).free_bytes  # less the spare
    await both.lv.CreateLV(pb.CreateLVRequest(name="fill", size_bytes=free - 256 * MiB))
    left = vg_free("vg1")  # the spare and 256 MiB
    assert left < 2 * GiB
    whole_only = pb.CreateLVSnapshotRequest(name="k-cut", source_volume="k", access_type="ro")
    code, _ = await code_of(both.lv.CreateLVSnapshot(whole_only))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    code, _ = await code_of(both.data.CreateCut(cut("k-cut", left + 8 * MiB)))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    made = await both.data.CreateCut(cut("k-cut", 256 * MiB))
    # a quarter of the room (about 320 MiB), in whole extents, for other cuts may come
    assert made.cow_bytes == -(-(left // 4) // (4 * MiB)) * 4 * MiB > 256 * MiB
    assert (await both.data.CreateCut(cut("k-cut", 256 * MiB))).cow_bytes == made.cow_bytes
    check = vd.DescribeLVRequest(name="k-cut", check_snapshot=True)
    described = await both.data.DescribeLV(check)
    assert not described.invalid and described.cow_bytes == made.cow_bytes
    assert lv_report("vg1")["k-cut"]["lv_attr"][1] == "r"

    # the origin changes by more than the area holds
    _run("dd", "if=/dev/zero", "of=/dev/vg1/k", "bs=4M", f"count={made.cow_bytes // (4 * MiB) + 8}",
         "oflag=direct")  # fmt: skip
    assert (await both.data.DescribeLV(check)).invalid
    # and a delta against it is refused (a move's final copy fails, and the move rolls back)
    overflowed = vd.CowDeltaRequest(name="k", base="k-cut")
    code, msg = await code_of(_all(both.data.CowDelta(overflowed)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "vg1/k-cut" in msg, msg
    cut_volume = Volume("/dev/vg1/k-cut", writable=False)
    try:
        with pytest.raises(SourceFailed):
            cut_volume.read_into(memoryview(bytearray(MiB)), 0)
    finally:
        cut_volume.close()
    code, _ = await code_of(both.data.CreateCut(cut("k-cut", -1)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def _lv_fields(full: str, fields: str) -> dict[str, str]:
    out = lvm("lvs", full, "--reportformat", "json", "--units", "b", "--nosuffix", "-o", fields)
    row: dict[str, str] = json.loads(out)["report"][0]["lv"][0]
    return row


async def test_a_thin_volume_maps_only_what_was_written(both: LvmdClient) -> None:
    await both.lv.CreateLV(pb.CreateLVRequest(name="t", device_class="thin", size_bytes=64 * MiB))
    described = await both.data.DescribeLV(vd.DescribeLVRequest(name="t", device_class="thin"))
    chunk = int(_lv_fields("vg1/pool0", "chunk_size")["chunk_size"])
    assert described.thin and described.chunk_bytes == chunk
    assert described.path == "/dev/vg1/t" and described.size_bytes == 64 * MiB
    assert described.uuid == _lv_fields("vg1/t", "lv_uuid")["lv_uuid"]

    async def mapped() -> list[tuple[int, int]]:
        req = vd.ThinMappingsRequest(name="t", device_class="thin")
        return [(o, n) for m in await _all(both.data.ThinMappings(req))
                for o, n in zip(m.offsets, m.lengths, strict=True)]  # fmt: skip

    assert await mapped() == []
    for offset in (0, 10):
        _run("dd", "if=/dev/urandom", "of=/dev/vg1/t", "bs=1M", f"seek={offset}", "count=1",
             "oflag=direct")  # fmt: skip
    assert await mapped() == [(0, MiB), (10 * MiB, MiB)]

    # a metadata snapshot an earlier lvmd left reserved is released and taken again
    tpool = "vg1-pool0-tpool"
    _run("dmsetup", "message", tpool, "0", "reserve_metadata_snap")
    assert await mapped() == [(0, MiB), (10 * MiB, MiB)]
    status = _run("dmsetup", "status", tpool).split()
    assert status[6] == "-", status  # no reservation held afterwards (the held root)

    # a copy's target that an earlier attempt wrote into is discarded before it starts over:
    # its blocks are unmapped and read as zeros again
    target = Volume("/dev/vg1/t", writable=True)
    target.discard(64 * MiB)
    target.close()
    assert await mapped() == []
    with open("/dev/vg1/t", "rb") as f:
        assert f.read(12 * MiB) == bytes(12 * MiB)


async def test_a_thin_delta_covers_exactly_the_chunks_written_between_two_snapshots(
    both: LvmdClient,
) -> None:
    await both.lv.CreateLV(pb.CreateLVRequest(name="t", device_class="thin", size_bytes=64 * MiB))
    await both.vg.GetLVList(pb.GetLVListRequest(device_class="thin"))  # a report: t as LVM has it
    chunk = int(_lv_fields("vg1/pool0", "chunk_size")["chunk_size"])
    _dd("/dev/vg1/t", 0, 16)  # data the first copy took (snapshot A)
    await both.lv.CreateLVSnapshot(pb.CreateLVSnapshotRequest(
        name="t-a", device_class="thin", source_volume="t", access_type="ro"))  # fmt: skip
    written = [(2 * MiB, MiB), (10 * MiB + 3 * chunk, 2 * chunk), (40 * MiB, MiB)]
    for offset, length in written:  # over A's data, and where A had none
        _dd("/dev/vg1/t", offset // chunk, length // chunk, bs=chunk)
    calls = both.server.runner.calls
    await both.lv.CreateLVSnapshot(pb.CreateLVSnapshotRequest(
        name="t-b", device_class="thin", source_volume="t", access_type="ro"))  # fmt: skip
    # a thin cut right after another (a move's claims, the pod down): its lvcreate alone, no
    # report first (the model has the source from the last report, and lvmd's own snapshot),
    # and no activation after it (``-k n`` made it active)
    assert both.server.runner.calls == calls + 1
    assert _lv_fields("vg1/t-b", "lv_attr")["lv_attr"][4] == "a"

    async def delta(name: str, base: str, dc: str = "thin") -> list[tuple[int, int]]:
        req = vd.ThinDeltaRequest(name=name, base=base, device_class=dc)
        return [(o, n) for m in await _all(both.data.ThinDelta(req))
                for o, n in zip(m.offsets, m.lengths, strict=True)]  # fmt: skip

    # a snapshot lvmd just made: its uuid from its device, as LVM reports it, with no LVM
    # command (lvmd's model has it in its pool before a report gives its lv_attr; the pool's
    # chunk size is read once, by a first describe)
    await both.data.DescribeLV(vd.DescribeLVRequest(name="t", device_class="thin"))
    calls = both.server.runner.calls
    made = await both.data.DescribeLV(
        vd.DescribeLVRequest(name="t-b", device_class="thin", with_uuid=True)
    )
    assert both.server.runner.calls == calls
    assert made.uuid == _lv_fields("vg1/t-b", "lv_uuid")["lv_uuid"]
    # the device ids thin_dump is given come from lvmd's fullreport (no lvs per volume)
    out = lvm(*FULLREPORT_ARGS, "--reportformat", "json", "--units", "b", "--nosuffix")
    ids = {lv.name: lv.thin_id for lv in parse_report(json.loads(out)).lvs_of("vg1")}
    for name in ("t", "t-a", "t-b"):
        assert ids[name] == int(_lv_fields(f"vg1/{name}", "thin_id")["thin_id"]), ids
    assert ids["pool0"] is None
    # a delta right after a cut (a move's final copy, the pod down): the LVs from lvmd's
    # model, no report; the ids thin_dump gets from the kernel's tables of their devices
    await both.lv.CreateLVSnapshot(pb.CreateLVSnapshotRequest(
        name="t-c", device_class="thin", source_volume="t", access_type="ro"))  # fmt: skip
    reports = both.server.state.refreshes
    assert await delta("t-c", "t-a") == written
    assert both.server.state.refreshes == reports
    assert await delta("t-b", "t-a") == written
    assert await delta("t-a", "t-b") == written  # the same blocks differ either way
    assert await delta("t", "t-b") == []  # nothing written since B
    status = _run("dmsetup", "status", "vg1-pool0-tpool").split()
    assert status[6] == "-", status  # the one reservation was released

    code, _ = await code_of(delta("t-b", "nope"))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = await code_of(delta("t-b", "--all"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    await both.lv.CreateLV(pb.CreateLVRequest(name="k", size_bytes=64 * MiB))
    code, _ = await code_of(delta("k", "t-a", dc=""))
    assert code == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_cow_delta_lists_the_chunks_written_between_two_thick_cuts(
    both: LvmdClient,
) -> None:
    """CowDelta (a thick move's final copy): the chunks of the origin written between two of
    its cuts, read from the cuts' exception tables, either way round; none since the newer."""
    await both.lv.CreateLV(pb.CreateLVRequest(name="k", size_bytes=64 * MiB))
    _dd("/dev/vg1/k", 0, 64)

    async def cut(name: str) -> None:
        await both.data.CreateCut(vd.CreateCutRequest(name=name, source_volume="k",
                                                      tags=["topolvm/cut"]))  # fmt: skip

    await cut("k-a")
    chunk = int(_lv_fields("vg1/k-a", "chunk_size")["chunk_size"])
    written = [(2 * MiB, MiB), (10 * MiB + 3 * chunk, 2 * chunk), (40 * MiB, chunk)]
    for offset, length in written:
        _dd("/dev/vg1/k", offset // chunk, length // chunk, bs=chunk)
    await cut("k-b")

    async def delta(name: str, base: str, dc: str = "") -> list[tuple[int, int]]:
        req = vd.CowDeltaRequest(name=name, base=base, device_class=dc)
        return [(o, n) for m in await _all(both.data.CowDelta(req))
                for o, n in zip(m.offsets, m.lengths, strict=True)]  # fmt: skip

    calls = both.server.runner.calls
    assert await delta("k-b", "k-a") == written
    # the cuts lvmd just made, from its model, no report; and one lvs for both cuts' state (a
    # move's final copy waits for this with the pod down)
    assert both.server.runner.calls == calls + 1
    assert await delta("k-a", "k-b") == written
    assert await delta("k", "k-a") == written  # the origin against its cut
    assert await delta("k", "k-b") == []  # nothing written since B
    _dd("/dev/vg1/k", 50 * MiB // chunk, 1, bs=chunk)  # after B: in both tables
    assert await delta("k-b", "k-a") == [*written, (50 * MiB, chunk)]

    code, _ = await code_of(delta("k-b", "nope"))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = await code_of(delta("k-b", "--all"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    await both.lv.CreateLV(pb.CreateLVRequest(name="other", size_bytes=64 * MiB))
    code, msg = await code_of(delta("other", "k-a"))  # not cuts of one origin
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "one origin" in msg
    code, _ = await code_of(delta("k-b", "k-a", dc="thin"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION


def _dd(device: str, seek: int, count: int, bs: int = MiB) -> None:
    _run("dd", "if=/dev/urandom", f"of={device}", f"bs={bs}", f"seek={seek}", f"count={count}",
         "oflag=direct")  # fmt: skip


async def test_volume_data_refuses_what_it_cannot_describe(both: LvmdClient) -> None:
    await both.lv.CreateLV(pb.CreateLVRequest(name="k", size_bytes=GiB))
    code, _ = await code_of(_all(both.data.ThinMappings(vd.ThinMappingsRequest(name="k"))))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    code, _ = await code_of(both.data.DescribeLV(vd.DescribeLVRequest(name="nope")))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = await code_of(both.data.DescribeLV(vd.DescribeLVRequest(name="--all")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    unknown = vd.DescribeLVRequest(name="k", device_class="nvme")
    code, _ = await code_of(both.data.DescribeLV(unknown))
    assert code == grpc.StatusCode.NOT_FOUND


def _run(*argv: str) -> str:
    """A quick command in the guest (the tests' view of LVM and device-mapper)."""
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


async def _all(stream: object) -> list[vd.ThinMappingsResponse]:
    return [m async for m in stream]  # type: ignore[attr-defined]


async def test_open_state_says_who_holds_a_volume_open(both: LvmdClient, tmp_path: Path) -> None:
    """OpenState (a move's final cut waits for it): device-mapper's open count of the LV, the
    mount points of a filesystem on it, and a device stacked on it; a COW cut of a thick
    volume does not count as opening it; an inactive LV is held by nothing."""
    await both.lv.CreateLV(pb.CreateLVRequest(name="k", size_bytes=64 * MiB))

    async def state(name: str = "k", dc: str = "") -> vd.OpenStateResponse:
        return await both.data.OpenState(vd.OpenStateRequest(name=name, device_class=dc))

    closed = await state()
    assert closed.active and closed.open_count == 0 and not closed.mounts and not closed.holders
    fd = os.open("/dev/vg1/k", os.O_RDONLY)
    try:
        held = await state()
        assert held.open_count == 1 and not held.mounts
    finally:
        os.close(fd)
    _run("mkfs.ext4", "-q", "/dev/vg1/k")
    where = tmp_path / "mnt point"
    where.mkdir()
    _run("mount", "/dev/vg1/k", str(where))
    try:
        mounted = await state()
        assert mounted.open_count >= 1 and list(mounted.mounts) == [str(where)]
        await both.data.CreateCut(vd.CreateCutRequest(name="k-cut", source_volume="k",
                                                      tags=["topolvm/cut"]))  # fmt: skip
        assert (await state()).open_count == mounted.open_count  # the cut opens "-real" only
    finally:
        _run("umount", str(where))
    assert (await state()).open_count == 0
    await both.lv.RemoveLV(pb.RemoveLVRequest(name="k-cut"))

    _run("dmsetup", "create", "k-on-top", "--table", f"0 {64 * MiB // 512} linear /dev/vg1/k 0")
    try:
        stacked = await state()
        assert stacked.open_count == 1 and list(stacked.holders) == ["k-on-top"]
    finally:
        _run("dmsetup", "remove", "k-on-top")

    await both.lv.CreateLV(pb.CreateLVRequest(name="t", device_class="thin", size_bytes=64 * MiB))
    lvm("lvchange", "-an", "vg1/t")
    inactive = await state("t", "thin")
    assert not inactive.active and inactive.open_count == 0
    code, _ = await code_of(state("nope"))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = await code_of(state("--all"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, _ = await code_of(state("k", "nvme"))
    assert code == grpc.StatusCode.NOT_FOUND


async def test_a_snapshot_whose_name_lvm_has_and_lvmd_had_not_seen_is_found(
    both: LvmdClient,
) -> None:
    """A thin cut made from lvmd's model without a report first (its source known, the model
    dirty from lvmd's own change) whose name LVM has already (a create that failed for lvmd, not
    for LVM: here made behind lvmd's back): lvmd reads LVM's state and answers with it, as a
    retried create expects, instead of LVM's "already exists"."""
    await both.lv.CreateLV(pb.CreateLVRequest(name="o", device_class="thin", size_bytes=64 * MiB))
    await both.vg.GetLVList(pb.GetLVListRequest(device_class="thin"))  # o as LVM has it
    await both.lv.CreateLVSnapshot(pb.CreateLVSnapshotRequest(
        name="o-a", device_class="thin", source_volume="o", access_type="ro"))  # fmt: skip
    lvm("lvcreate", "-s", "-k", "n", "-p", "r", "-n", "o-b", "vg1/o")
    calls = both.server.runner.calls
    made = await both.lv.CreateLVSnapshot(pb.CreateLVSnapshotRequest(
        name="o-b", device_class="thin", source_volume="o", access_type="ro"))  # fmt: skip
    assert made.snapshot.name == "o-b" and made.snapshot.size_bytes == 64 * MiB
    assert both.server.runner.calls == calls + 2  # the refused lvcreate, then a report

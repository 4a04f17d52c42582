"""CSI Node service against real LVM inside UML: publish, stats, expand and unpublish of
filesystem (ext4, xfs, btrfs) and block volumes."""

# ruff: noqa: F811  (the env fixture imported from tests.node_csi_helpers is a parameter here)

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from tests.lvm_fixtures import code_of
from tests.node_csi_helpers import (
    Code,
    Env,
    MiB,
    blkid_type,
    block_cap,
    env,  # noqa: F401
    mount_cap,
    mounts,
)
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import lvmd_pb2 as lvmd_pb

pytestmark = pytest.mark.uml

FS_CASES = [
    # fstype, device class, size, grown size, extra flag, super option it shows as
    ("ext4", "ssd", 128 * MiB, 256 * MiB, "commit=30", "commit=30"),
    ("xfs", "ssd", 320 * MiB, 512 * MiB, "noquota", "nouuid"),
    ("btrfs", "thin", 256 * MiB, 384 * MiB, "compress=zstd", "compress=zstd"),
]


@pytest.mark.parametrize(("fstype", "dc", "size", "grown", "flag", "shown"), FS_CASES)
async def test_filesystem_lifecycle(
    env: Env, fstype: str, dc: str, size: int, grown: int, flag: str, shown: str
) -> None:
    vid = f"vol-{fstype}"
    lv = await env.create(vid, size, dc)
    target = env.target(fstype)
    cap = mount_cap(fstype, ("noatime", flag))

    await env.publish(vid, target, cap)
    entries = mounts(target)
    assert len(entries) == 1
    entry = entries[0]
    assert entry.fstype == fstype
    assert "noatime" in entry.options and "rw" in entry.options
    assert any(o.startswith(shown) for o in entry.super_options), entry.super_options
    assert blkid_type(f"/dev/vg1/{vid}") == fstype
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o2777

    data = os.urandom(1 << 16)
    Path(target, "data.bin").write_bytes(data)

    # Publishing again (same target) is a no-op: still one mount.
    await env.publish(vid, target, cap)
    assert len(mounts(target)) == 1

    # Stats: bytes (and inodes where the filesystem counts them), healthy condition.
    st = await env.stats(vid, target)
    by_unit = {u.unit: u for u in st.usage}
    b = by_unit[csi.VolumeUsage.BYTES]
    assert 0 < b.total <= size and b.used > 0 and 0 < b.available <= b.total
    if fstype != "btrfs":
        i = by_unit[csi.VolumeUsage.INODES]
        assert i.total > 0 and 0 < i.used <= i.total and i.available == i.total - i.used
    assert st.HasField("volume_condition")
    assert not st.volume_condition.abnormal
    assert st.volume_condition.message == "volume is healthy and operating normally"

    # Online expansion with the data intact.
    before = os.statvfs(target)
    await env.resize(vid, grown)
    assert (await env.expand(vid, target, cap)) == csi.NodeExpandVolumeResponse()
    after = os.statvfs(target)
    assert after.f_blocks * after.f_frsize > before.f_blocks * before.f_frsize
    assert after.f_blocks * after.f_frsize > size
    assert Path(target, "data.bin").read_bytes() == data
    # Expanding again is harmless.
    await env.expand(vid, target)
    st2 = await env.stats(vid, target)
    assert {u.unit: u for u in st2.usage}[csi.VolumeUsage.BYTES].total > b.total

    # Unpublish removes the target; a second unpublish is fine.
    await env.unpublish(vid, target)
    assert not os.path.exists(target)
    assert not mounts(target)
    await env.unpublish(vid, target)

    # Never reformat: publishing again shows the same data.
    await env.publish(vid, target, cap)
    assert Path(target, "data.bin").read_bytes() == data
    await env.unpublish(vid, target)

    # Asking for another filesystem type is refused, and the data survives.
    other = "xfs" if fstype != "xfs" else "ext4"
    code, details = await code_of(env.publish(vid, target, mount_cap(other)))
    assert code == Code.INTERNAL and "already formatted with different filesystem" in details
    assert not mounts(target)
    assert blkid_type(lv.path or f"/dev/vg1/{vid}") == fstype
    await env.publish(vid, target, cap)
    assert Path(target, "data.bin").read_bytes() == data
    await env.unpublish(vid, target)
    assert not os.path.exists(target)


async def test_default_fstype_is_ext4_and_grows_larger_volume_at_publish(env: Env) -> None:
    await env.create("vol-d", 64 * MiB)
    target = env.target("d")
    await env.publish("vol-d", target, mount_cap())
    assert mounts(target)[0].fstype == "ext4"
    await env.unpublish("vol-d", target)
    # Offline growth (or a restore into a bigger volume): publish grows the filesystem.
    await env.resize("vol-d", 128 * MiB)
    await env.publish("vol-d", target, mount_cap())
    vfs = os.statvfs(target)
    assert vfs.f_blocks * vfs.f_frsize > 100 * MiB
    await env.unpublish("vol-d", target)


async def test_readonly_publish(env: Env) -> None:
    await env.create("vol-ro", 64 * MiB)
    rw_target, ro_target = env.target("rw"), env.target("ro")
    # A read-only publish never formats.
    code, details = await code_of(env.publish("vol-ro", ro_target, mount_cap("ext4"), True))
    assert code == Code.INTERNAL and "read-only" in details
    assert blkid_type("/dev/vg1/vol-ro") == ""

    await env.publish("vol-ro", rw_target, mount_cap("ext4"))
    Path(rw_target, "hello").write_text("world")
    await env.unpublish("vol-ro", rw_target)

    await env.publish("vol-ro", ro_target, mount_cap("ext4", ("noatime",)), readonly=True)
    entry = mounts(ro_target)[0]
    assert "ro" in entry.options
    assert Path(ro_target, "hello").read_text() == "world"
    with pytest.raises(OSError) as e:
        Path(ro_target, "new").write_text("x")
    assert e.value.errno == errno.EROFS
    # The same target asked for read-write while mounted read-only: incompatible.
    code, _ = await code_of(env.publish("vol-ro", ro_target, mount_cap("ext4")))
    assert code == Code.ALREADY_EXISTS
    await env.publish("vol-ro", ro_target, mount_cap("ext4"), readonly=True)  # idempotent
    assert len(mounts(ro_target)) == 1
    await env.unpublish("vol-ro", ro_target)
    assert not os.path.exists(ro_target)


async def test_xfs_snapshot_mounts_beside_its_origin(env: Env) -> None:
    await env.create("vol-origin", 320 * MiB, "thin")
    origin_target = env.target("origin")
    await env.publish("vol-origin", origin_target, mount_cap("xfs"))
    Path(origin_target, "f").write_text("snapshot me")
    os.sync()  # (LVM freezes the filesystem itself while it takes the snapshot)
    await env.lvmd.create_lv_snapshot(
        lvmd_pb.CreateLVSnapshotRequest(
            name="vol-snap",
            device_class="thin",
            source_volume="vol-origin",
            access_type="rw",
            size_bytes=320 * MiB,
        )
    )
    env.volumes.classes["vol-snap"] = "thin"
    snap_target = env.target("snap")
    await env.publish("vol-snap", snap_target, mount_cap("xfs"))  # same UUID: needs nouuid
    entry = mounts(snap_target)[0]
    assert "nouuid" in entry.super_options
    assert Path(snap_target, "f").read_text() == "snapshot me"
    assert len(mounts(origin_target)) == 1
    await env.unpublish("vol-snap", snap_target)
    await env.unpublish("vol-origin", origin_target)


async def test_block_volume(env: Env) -> None:
    lv = await env.create("vol-blk", 64 * MiB)
    target = env.target("blk")
    await env.publish("vol-blk", target, block_cap())
    st = os.stat(target)
    assert stat.S_ISBLK(st.st_mode)
    assert st.st_rdev == os.stat(lv.path or "/dev/vg1/vol-blk").st_rdev
    assert len(mounts(target)) == 1
    await env.publish("vol-blk", target, block_cap())  # idempotent
    assert len(mounts(target)) == 1

    payload = b"block data" * 100
    with open(target, "r+b") as f:
        f.write(payload)
    with open("/dev/vg1/vol-blk", "rb") as f:
        assert f.read(len(payload)) == payload

    stats = await env.stats("vol-blk", target)
    assert [(u.unit, u.total) for u in stats.usage] == [(csi.VolumeUsage.BYTES, 64 * MiB)]
    assert not stats.HasField("volume_condition")

    # Read-only publish of the same volume at another target.
    ro_target = env.target("blk-ro")
    await env.publish("vol-blk", ro_target, block_cap(), readonly=True)
    with open(ro_target, "rb") as f:
        assert f.read(len(payload)) == payload
    # (A read-only mount does not stop writes through a device node; kubelet's device cgroup
    # does. The bind mount itself must still be read-only.)
    assert mounts(ro_target)[0].readonly
    await env.unpublish("vol-blk", ro_target)
    assert not os.path.exists(ro_target)

    # Expansion of a block volume needs nothing on the node.
    await env.resize("vol-blk", 128 * MiB)
    assert await env.expand("vol-blk", target, block_cap()) == csi.NodeExpandVolumeResponse()
    assert await env.expand("vol-blk", target) == csi.NodeExpandVolumeResponse()
    stats = await env.stats("vol-blk", target)
    assert stats.usage[0].total == 128 * MiB

    await env.unpublish("vol-blk", target)
    assert not os.path.exists(target)
    await env.unpublish("vol-blk", target)
    with open("/dev/vg1/vol-blk", "rb") as f:
        assert f.read(len(payload)) == payload

"""CSI Identity and Node services against real LVM, filesystems and mounts inside UML.

A real lvmd serves a VG with a thick and a thin device class; LVs are created through it, and
the CSI services are called over their UNIX socket with grpc.aio stubs, as kubelet would.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
import subprocess
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from tests.lvm_fixtures import VolumeGroups
from topolvm.constants import LEGACY_DEVICE_DIR, Names, names
from topolvm.csi.identity import IdentityService
from topolvm.node import mounter
from topolvm.node.csi_node import NodeService
from topolvm.node.lvmd_client import SocketLvmd
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import csi_pb2_grpc as csi_grpc
from topolvm.proto import lvmd_pb2 as lvmd_pb
from topolvm.rpc.server import start_unix_server, stop_unix_server

pytestmark = pytest.mark.uml

MiB = 1 << 20
THICK = {"name": "ssd", "volume-group": "vg1", "default": True, "spare-gb": 0}
THIN = {
    "name": "thin",
    "volume-group": "vg1",
    "type": "thin",
    "spare-gb": 0,
    "thin-pool": {"name": "pool0", "overprovision-ratio": 5.0},
}
NO_LVMD: Any = None  # services that never reach lvmd
SNW = csi.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
Code = grpc.StatusCode


async def start_csi_server(
    sock: str, identity: csi_grpc.IdentityServicer, node: csi_grpc.NodeServicer
) -> grpc.aio.Server:
    def register(server: grpc.aio.Server) -> None:
        csi_grpc.add_IdentityServicer_to_server(identity, server)
        csi_grpc.add_NodeServicer_to_server(node, server)

    return await start_unix_server(sock, register)


class DictLookup:
    """VolumeLookup backed by a dict: volume id → device class."""

    def __init__(self) -> None:
        self.classes: dict[str, str] = {}

    async def device_class_of(self, volume_id: str) -> str | None:
        return self.classes.get(volume_id)


@dataclass
class Env:
    tmp: Path
    lvmd: SocketLvmd
    volumes: DictLookup
    socket: str
    service: NodeService
    identity: IdentityService
    server: grpc.aio.Server
    channel: grpc.aio.Channel
    node: csi_grpc.NodeAsyncStub
    ident: csi_grpc.IdentityAsyncStub
    servers: list[tuple[grpc.aio.Server, str]] = field(default_factory=list)

    async def create(self, name: str, size: int, dc: str = "ssd") -> lvmd_pb.LogicalVolume:
        resp = await self.lvmd.create_lv(
            lvmd_pb.CreateLVRequest(name=name, device_class=dc, size_bytes=size)
        )
        self.volumes.classes[name] = dc
        return resp.volume

    async def resize(self, name: str, size: int) -> None:
        dc = self.volumes.classes[name]
        await self.lvmd.resize_lv(
            lvmd_pb.ResizeLVRequest(name=name, device_class=dc, size_bytes=size)
        )

    def target(self, name: str) -> str:
        return str(self.tmp / "pods" / name / "target")

    async def publish(
        self,
        volume_id: str,
        target: str,
        capability: csi.VolumeCapability,
        readonly: bool = False,
    ) -> csi.NodePublishVolumeResponse:
        os.makedirs(os.path.dirname(target), exist_ok=True)  # the CO creates the parent
        return await self.node.NodePublishVolume(
            csi.NodePublishVolumeRequest(
                volume_id=volume_id,
                target_path=target,
                volume_capability=capability,
                readonly=readonly,
            )
        )

    async def unpublish(self, volume_id: str, target: str) -> None:
        await self.node.NodeUnpublishVolume(
            csi.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target)
        )

    async def stats(self, volume_id: str, path: str) -> csi.NodeGetVolumeStatsResponse:
        return await self.node.NodeGetVolumeStats(
            csi.NodeGetVolumeStatsRequest(volume_id=volume_id, volume_path=path)
        )

    async def expand(
        self, volume_id: str, path: str, capability: csi.VolumeCapability | None = None
    ) -> csi.NodeExpandVolumeResponse:
        req = csi.NodeExpandVolumeRequest(volume_id=volume_id, volume_path=path)
        if capability is not None:
            req.volume_capability.CopyFrom(capability)
        return await self.node.NodeExpandVolume(req)


def mount_cap(
    fstype: str = "", flags: tuple[str, ...] = (), mode: int = SNW
) -> csi.VolumeCapability:
    return csi.VolumeCapability(
        mount=csi.VolumeCapability.MountVolume(fs_type=fstype, mount_flags=list(flags)),
        access_mode=csi.VolumeCapability.AccessMode(mode=cast(Any, mode)),
    )


def block_cap() -> csi.VolumeCapability:
    return csi.VolumeCapability(
        block=csi.VolumeCapability.BlockVolume(),
        access_mode=csi.VolumeCapability.AccessMode(mode=SNW),
    )


async def code_of(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value.code(), e.value.details() or ""


def mounts(target: str) -> list[mounter.MountEntry]:
    return mounter.mounts_at(target)


async def sh(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(*argv)
    assert await proc.wait() == 0, argv


def blkid_type(device: str) -> str:
    out = subprocess.run(
        ["blkid", "-p", "-u", "filesystem", "-o", "export", device],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line).get("TYPE", "")


def unmount_all_under(root: Path) -> None:
    """Teardown safety net: leave no mount behind (the VG must be removable)."""
    prefix = str(root) + "/"
    for _ in range(100):
        left = [e for e in mounter.read_mountinfo() if e.mount_point.startswith(prefix)]
        if not left:
            return
        subprocess.run(["umount", "-l", left[-1].mount_point], check=False)


async def start_node(
    tmp: Path, lvmd: SocketLvmd, volumes: DictLookup, sock: str, nm: Names | None = None
) -> tuple[NodeService, IdentityService, grpc.aio.Server]:
    nm = nm or names(False)
    service = NodeService("node-1", nm, lvmd, volumes)
    identity = IdentityService(nm)
    server = await start_csi_server(sock, identity, service)
    return service, identity, server


@pytest.fixture
async def env(vgs: VolumeGroups, lvmd_factory: Any, tmp_path: Path) -> AsyncIterator[Env]:
    vgs.create("vg1", size_gib=6)
    vgs.thin_pool("vg1", "pool0", 2)
    client = await lvmd_factory([THICK, THIN])
    lvmd = SocketLvmd(client.server.config.socket_name)
    volumes = DictLookup()
    sock = str(tmp_path / "csi" / "csi.sock")
    service, identity, server = await start_node(tmp_path, lvmd, volumes, sock)
    channel = grpc.aio.insecure_channel(f"unix:{sock}")
    e = Env(
        tmp=tmp_path,
        lvmd=lvmd,
        volumes=volumes,
        socket=sock,
        service=service,
        identity=identity,
        server=server,
        channel=channel,
        node=csi_grpc.NodeStub(channel),
        ident=csi_grpc.IdentityStub(channel),
    )
    e.servers.append((server, sock))
    try:
        yield e
    finally:
        await e.channel.close(None)
        for srv, path in e.servers:
            await stop_unix_server(srv, path, grace=1)
        await lvmd.close()
        unmount_all_under(tmp_path)


# -- Identity ----------------------------------------------------------------------------------


@pytest.mark.parametrize("legacy", [False, True])
async def test_identity_plugin_info_and_capabilities(tmp_path: Path, legacy: bool) -> None:
    nm = names(legacy)
    identity = IdentityService(nm)
    sock = str(tmp_path / "sub" / "csi.sock")
    server = await start_csi_server(sock, identity, NodeService("n", nm, NO_LVMD, DictLookup()))
    try:
        async with grpc.aio.insecure_channel(f"unix:{sock}") as channel:
            stub = csi_grpc.IdentityStub(channel)
            info = await stub.GetPluginInfo(csi.GetPluginInfoRequest())
            assert info.name == ("topolvm.cybozu.com" if legacy else "topolvm.io")
            assert info.vendor_version
            caps = await stub.GetPluginCapabilities(csi.GetPluginCapabilitiesRequest())
            pc = csi.PluginCapability
            services = {c.service.type for c in caps.capabilities if c.HasField("service")}
            expansion = {
                c.volume_expansion.type for c in caps.capabilities if c.HasField("volume_expansion")
            }
            assert services == {
                pc.Service.CONTROLLER_SERVICE,
                pc.Service.VOLUME_ACCESSIBILITY_CONSTRAINTS,
            }
            assert expansion == {pc.VolumeExpansion.ONLINE, pc.VolumeExpansion.OFFLINE}
            node = csi_grpc.NodeStub(channel)
            got = await node.NodeGetInfo(csi.NodeGetInfoRequest())
            assert got.node_id == "n"
            key = "topology.topolvm.cybozu.com/node" if legacy else "topology.topolvm.io/node"
            assert dict(got.accessible_topology.segments) == {key: "n"}
            assert got.max_volumes_per_node == 0
    finally:
        await stop_unix_server(server, sock, grace=1)
    assert not os.path.exists(sock)


async def test_probe_transitions(tmp_path: Path) -> None:
    outcomes = ["lvmd is not serving", "", "CSIDriver not found", ""]
    calls: list[str] = []

    async def check() -> None:
        result = outcomes[min(len(calls), len(outcomes) - 1)]
        calls.append(result)
        if result:
            raise RuntimeError(result)

    identity = IdentityService(names(False), [check], interval=3600)
    sock = str(tmp_path / "csi.sock")
    server = await start_csi_server(
        sock, identity, NodeService("n", names(False), NO_LVMD, DictLookup())
    )
    try:
        async with grpc.aio.insecure_channel(f"unix:{sock}") as channel:
            stub = csi_grpc.IdentityStub(channel)
            resp = await stub.Probe(csi.ProbeRequest())  # nothing checked yet
            assert resp.HasField("ready") and resp.ready.value is False
            await identity.checker.check_once()  # fails: before any success
            code, details = await code_of(stub.Probe(csi.ProbeRequest()))
            assert (code, details) == (Code.FAILED_PRECONDITION, "lvmd is not serving")
            await identity.checker.check_once()  # succeeds
            assert (await stub.Probe(csi.ProbeRequest())).ready.value is True
            await identity.checker.check_once()  # fails again: the last error wins
            code, details = await code_of(stub.Probe(csi.ProbeRequest()))
            assert (code, details) == (Code.FAILED_PRECONDITION, "CSIDriver not found")
            await identity.checker.check_once()
            assert (await stub.Probe(csi.ProbeRequest())).ready.value is True
            # The background checker runs its first round at start.
            calls.clear()
            outcomes[:] = [""]
            fresh = IdentityService(names(False), [check], interval=0.05)
            await fresh.start()
            for _ in range(100):
                if fresh.checker.ready:
                    break
                await asyncio.sleep(0.02)
            assert fresh.checker.ready
            await asyncio.sleep(0.2)
            assert len(calls) >= 2  # runs again every interval
            await fresh.stop()
    finally:
        await stop_unix_server(server, sock, grace=1)


async def test_probe_check_timeout() -> None:
    async def hangs() -> None:
        await asyncio.sleep(10)

    identity = IdentityService(names(False), [hangs], check_timeout=0.05)
    await identity.checker.check_once()
    assert not identity.checker.ready
    assert "timed out" in str(identity.checker.error)


# -- Node: argument checks and error codes -------------------------------------------------


async def test_node_capabilities_info_and_stage_unimplemented(env: Env) -> None:
    caps = await env.node.NodeGetCapabilities(csi.NodeGetCapabilitiesRequest())
    rpc_cap = csi.NodeServiceCapability.RPC
    assert [c.rpc.type for c in caps.capabilities] == [
        rpc_cap.GET_VOLUME_STATS,
        rpc_cap.EXPAND_VOLUME,
        rpc_cap.VOLUME_CONDITION,
    ]
    info = await env.node.NodeGetInfo(csi.NodeGetInfoRequest())
    assert info.node_id == "node-1"
    assert dict(info.accessible_topology.segments) == {"topology.topolvm.io/node": "node-1"}
    code, _ = await code_of(
        env.node.NodeStageVolume(
            csi.NodeStageVolumeRequest(volume_id="v", staging_target_path="/tmp/x")
        )
    )
    assert code == Code.UNIMPLEMENTED
    code, _ = await code_of(
        env.node.NodeUnstageVolume(
            csi.NodeUnstageVolumeRequest(volume_id="v", staging_target_path="/tmp/x")
        )
    )
    assert code == Code.UNIMPLEMENTED


async def test_missing_fields_are_invalid_argument_before_not_found(env: Env) -> None:
    target = env.target("fake")
    pub = env.node.NodePublishVolume
    cases: list[Awaitable[Any]] = [
        pub(csi.NodePublishVolumeRequest(target_path=target, volume_capability=mount_cap())),
        pub(csi.NodePublishVolumeRequest(volume_id="fake-vol-id", volume_capability=mount_cap())),
        pub(csi.NodePublishVolumeRequest(volume_id="fake-vol-id", target_path=target)),
        pub(
            csi.NodePublishVolumeRequest(
                volume_id="fake-vol-id",
                target_path=target,
                volume_capability=csi.VolumeCapability(
                    access_mode=csi.VolumeCapability.AccessMode(mode=SNW)
                ),
            )
        ),  # neither block nor mount
        pub(  # rw flag with readonly
            csi.NodePublishVolumeRequest(
                volume_id="fake-vol-id",
                target_path=target,
                volume_capability=mount_cap("ext4", ("noatime", "rw")),
                readonly=True,
            )
        ),
        pub(  # unsupported filesystem
            csi.NodePublishVolumeRequest(
                volume_id="fake-vol-id",
                target_path=target,
                volume_capability=mount_cap("vfat"),
            )
        ),
        env.node.NodeUnpublishVolume(csi.NodeUnpublishVolumeRequest(target_path=target)),
        env.node.NodeUnpublishVolume(csi.NodeUnpublishVolumeRequest(volume_id="fake-vol-id")),
        env.node.NodeGetVolumeStats(csi.NodeGetVolumeStatsRequest(volume_path="some/path")),
        env.node.NodeGetVolumeStats(csi.NodeGetVolumeStatsRequest(volume_id="fake-vol-id")),
        env.node.NodeExpandVolume(csi.NodeExpandVolumeRequest(volume_path=str(env.tmp))),
        env.node.NodeExpandVolume(csi.NodeExpandVolumeRequest(volume_id="fake-vol-id")),
        env.node.NodeExpandVolume(
            csi.NodeExpandVolumeRequest(
                volume_id="fake-vol-id",
                volume_path="some/path",
                capacity_range=csi.CapacityRange(required_bytes=2 * MiB, limit_bytes=MiB),
            )
        ),
    ]
    for i, call in enumerate(cases):
        code, details = await code_of(call)
        assert code == Code.INVALID_ARGUMENT, (i, code, details)
    code, details = await code_of(
        pub(
            csi.NodePublishVolumeRequest(
                volume_id="fake-vol-id",
                target_path=target,
                volume_capability=mount_cap("ext4", ("rw",)),
                readonly=True,
            )
        )
    )
    assert details == 'mount option "rw" is specified even though read only mode is specified'
    assert not os.path.exists(target)


@pytest.mark.parametrize(
    "mode",
    [
        csi.VolumeCapability.AccessMode.UNKNOWN,
        csi.VolumeCapability.AccessMode.SINGLE_NODE_READER_ONLY,
        csi.VolumeCapability.AccessMode.MULTI_NODE_MULTI_WRITER,
        csi.VolumeCapability.AccessMode.SINGLE_NODE_SINGLE_WRITER,
    ],
)
async def test_unsupported_access_mode_is_failed_precondition(env: Env, mode: int) -> None:
    code, details = await code_of(
        env.publish("fake-vol-id", env.target("a"), mount_cap("", (), mode))
    )
    assert code == Code.FAILED_PRECONDITION
    assert "unsupported access mode" in details
    code, _ = await code_of(
        env.node.NodePublishVolume(
            csi.NodePublishVolumeRequest(
                volume_id="fake-vol-id",
                target_path=env.target("b"),
                volume_capability=csi.VolumeCapability(mount=csi.VolumeCapability.MountVolume()),
            )
        )
    )
    assert code == Code.FAILED_PRECONDITION  # access mode unset


async def test_unknown_volumes_are_not_found(env: Env) -> None:
    target = env.target("x")
    assert (await code_of(env.publish("fake-vol-id", target, mount_cap())))[0] == Code.NOT_FOUND
    assert (await code_of(env.publish("fake-vol-id", target, block_cap())))[0] == Code.NOT_FOUND
    assert (await code_of(env.stats("fake-vol-id", "some/path")))[0] == Code.NOT_FOUND
    assert (await code_of(env.expand("fake-vol-id", "some/path")))[0] == Code.NOT_FOUND
    # The LogicalVolume is known but lvmd has no such LV.
    env.volumes.classes["ghost"] = "thin"
    assert (await code_of(env.publish("ghost", target, mount_cap())))[0] == Code.NOT_FOUND
    assert (await code_of(env.expand("ghost", str(env.tmp))))[0] == Code.NOT_FOUND
    # Stats: the path is checked first, then the volume.
    assert (await code_of(env.stats("ghost", str(env.tmp / "missing"))))[0] == Code.NOT_FOUND
    assert (await code_of(env.stats("ghost", str(env.tmp))))[0] == Code.NOT_FOUND
    # An unknown device class is lvmd's error: INTERNAL with lvmd's message.
    env.volumes.classes["odd"] = "no-such-class"
    code, details = await code_of(env.publish("odd", target, mount_cap()))
    assert code == Code.INTERNAL and "device-class not found" in details


async def test_stats_on_missing_path_of_real_volume_is_not_found(env: Env) -> None:
    await env.create("vol-s", 64 * MiB)
    target = env.target("s")
    await env.publish("vol-s", target, mount_cap("ext4"))
    assert (await code_of(env.stats("vol-s", "some/path")))[0] == Code.NOT_FOUND
    assert (await code_of(env.stats("vol-s", target + "-missing")))[0] == Code.NOT_FOUND
    await env.unpublish("vol-s", target)


# -- Node: filesystems ------------------------------------------------------------------------

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


# -- Node: block volumes -----------------------------------------------------------------------


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


# -- Node: safety --------------------------------------------------------------------------------


async def test_concurrent_publishes_mount_once(env: Env) -> None:
    await env.create("vol-c", 64 * MiB)
    other = await env.create("vol-c2", 64 * MiB)
    target = env.target("c")
    results = await asyncio.gather(
        *(env.publish("vol-c", target, mount_cap("ext4")) for _ in range(10)),
        env.publish("vol-c2", env.target("c2"), mount_cap("ext4")),
    )
    assert len(results) == 11
    assert len(mounts(target)) == 1
    assert len(mounts(env.target("c2"))) == 1
    assert other.name == "vol-c2"
    await asyncio.gather(
        *(env.unpublish("vol-c", target) for _ in range(5)),
        env.unpublish("vol-c2", env.target("c2")),
    )
    assert not mounts(target) and not os.path.exists(target)
    assert len(env.service.locks) == 0


async def test_target_mounted_from_another_device(env: Env) -> None:
    await env.create("vol-a", 64 * MiB)
    await env.create("vol-b", 64 * MiB)
    target = env.target("ab")
    await env.publish("vol-a", target, mount_cap("ext4"))
    code, details = await code_of(env.publish("vol-b", target, mount_cap("ext4")))
    assert code == Code.ALREADY_EXISTS, details
    assert len(mounts(target)) == 1
    # Expanding a path that shows another volume is refused too.
    code, _ = await code_of(env.expand("vol-b", target))
    assert code == Code.INTERNAL
    await env.unpublish("vol-a", target)
    code, details = await code_of(env.expand("vol-a", target))
    assert code == Code.INTERNAL and "not mounted" in details


async def test_restart_with_existing_mount(env: Env) -> None:
    await env.create("vol-r", 64 * MiB)
    target = env.target("r")
    await env.publish("vol-r", target, mount_cap("ext4", ("noatime",)))
    Path(target, "keep").write_text("me")
    # The node plugin restarts: a new service instance on a new server, same socket path.
    await env.channel.close(None)
    await stop_unix_server(env.server, env.socket, grace=1)
    env.servers.clear()
    _, _, server = await start_node(env.tmp, env.lvmd, env.volumes, env.socket)
    env.servers.append((server, env.socket))
    env.channel = grpc.aio.insecure_channel(f"unix:{env.socket}")
    env.node = csi_grpc.NodeStub(env.channel)
    await env.publish("vol-r", target, mount_cap("ext4", ("noatime",)))
    assert len(mounts(target)) == 1
    assert Path(target, "keep").read_text() == "me"
    await env.unpublish("vol-r", target)
    assert not mounts(target) and not os.path.exists(target)


async def test_unpublish_unmounts_stacked_mounts(env: Env) -> None:
    await env.create("vol-st", 64 * MiB)
    target = env.target("st")
    await env.publish("vol-st", target, mount_cap("ext4"))
    # Mounts stacked on the target by an older, buggy release.
    await sh("mount", "--bind", target, target)
    await sh("mount", "-t", "tmpfs", "tmpfs", target)
    assert len(mounts(target)) == 3
    await env.unpublish("vol-st", target)
    assert not mounts(target)
    assert not os.path.exists(target)


async def test_unpublish_never_published_and_legacy_device(env: Env) -> None:
    await env.unpublish("fake-vol-id", env.target("never"))
    os.makedirs(LEGACY_DEVICE_DIR, exist_ok=True)
    legacy = Path(LEGACY_DEVICE_DIR, "legacy-vol")
    legacy.write_text("")
    try:
        await env.unpublish("legacy-vol", env.target("legacy"))
        assert not legacy.exists()
    finally:
        legacy.unlink(missing_ok=True)
    # A target that is left unmounted (published by someone else, say) is just removed.
    plain = Path(env.target("plain"))
    plain.mkdir(parents=True)
    await env.unpublish("vol-x", str(plain))
    assert not plain.exists()
    # Never a recursive delete: a non-empty, unmounted directory stays, with an error.
    full = Path(env.target("full"))
    full.mkdir(parents=True)
    (full / "precious").write_text("x")
    code, _ = await code_of(env.unpublish("vol-x", str(full)))
    assert code == Code.INTERNAL
    assert (full / "precious").read_text() == "x"


async def test_rpcs_are_logged(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="topolvm.rpc.status")
    await env.unpublish("fake-vol-id", env.target("log"))
    await code_of(env.stats("fake-vol-id", "some/path"))
    records = [r for r in caplog.records if r.name == "topolvm.rpc.status"]
    by_rpc = {getattr(r, "rpc", ""): r for r in records}
    ok = by_rpc["NodeUnpublishVolume"]
    assert (getattr(ok, "volume_id", None), getattr(ok, "code", None)) == ("fake-vol-id", "OK")
    assert getattr(ok, "target", None) == env.target("log")
    assert isinstance(getattr(ok, "secs", None), float)
    failed = by_rpc["NodeGetVolumeStats"]
    assert getattr(failed, "code", None) == "NOT_FOUND"


async def test_target_path_with_spaces(env: Env) -> None:
    await env.create("vol-sp", 64 * MiB)
    target = str(env.tmp / "pods" / "with space\tand tab" / "target")
    await env.publish("vol-sp", target, mount_cap("ext4"))
    await env.publish("vol-sp", target, mount_cap("ext4"))
    assert len(mounts(target)) == 1
    assert (await env.stats("vol-sp", target)).usage
    await env.unpublish("vol-sp", target)
    assert not mounts(target) and not os.path.exists(target)

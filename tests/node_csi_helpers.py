"""Helpers for the CSI Node and Identity tests against real LVM in UML (tests/test_node_csi_*.py):
a real lvmd serving a VG with a thick and a thin device class, and the CSI services on a UNIX
socket with grpc.aio stubs, as kubelet calls them."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from tests.lvm_fixtures import VolumeGroups
from topolvm.constants import Names, names
from topolvm.csi.identity import IdentityService
from topolvm.node import mounter
from topolvm.node.csi_node import NodeService
from topolvm.node.lvmd_client import SocketLvmd
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import csi_pb2_grpc as csi_grpc
from topolvm.proto import lvmd_pb2 as lvmd_pb
from topolvm.rpc.server import start_unix_server, stop_unix_server
from topolvm.rpc.transport import Service, UnixServer

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


async def start_csi_server(sock: str, identity: object, node: object) -> UnixServer:
    services = csi.DESCRIPTOR.services_by_name
    return await start_unix_server(
        sock, [Service(services["Identity"], identity), Service(services["Node"], node)]
    )


class DictLookup:
    """VolumeLookup backed by a dict: volume id → device class."""

    def __init__(self) -> None:
        self.classes: dict[str, str] = {}
        self.filling: dict[str, str] = {}  # volume id -> what its copy does

    async def device_class_of(self, volume_id: str) -> str | None:
        return self.classes.get(volume_id)

    async def unfilled(self, volume_id: str) -> str | None:
        return self.filling.get(volume_id)


@dataclass
class Env:
    tmp: Path
    lvmd: SocketLvmd
    volumes: DictLookup
    socket: str
    service: NodeService
    identity: IdentityService
    server: UnixServer
    channel: grpc.aio.Channel
    node: csi_grpc.NodeAsyncStub
    ident: csi_grpc.IdentityAsyncStub
    servers: list[tuple[UnixServer, str]] = field(default_factory=list)

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
) -> tuple[NodeService, IdentityService, UnixServer]:
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

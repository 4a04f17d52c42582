"""Fixtures for the real-LVM tier: fresh VGs on the UML disks, and a running lvmd."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from tests import uml_tier
from topolvm.config import lvmd as lvmd_file
from topolvm.lvmd.server import LvmdServer, Options
from topolvm.proto import lvmd_pb2_grpc as pb_grpc
from topolvm.proto import volumedata_pb2_grpc as vd_grpc

GiB = 1 << 30
THICK_DC: dict[str, Any] = {"name": "ssd", "volume-group": "vg1", "default": True}
# Device classes on vg1 with 1 GiB spare: thick (the default) and thin on pool0 (ratio 5).
THICK: dict[str, Any] = {**THICK_DC, "spare-gb": 1}
THIN: dict[str, Any] = {
    "name": "thin",
    "volume-group": "vg1",
    "type": "thin",
    "spare-gb": 1,
    "thin-pool": {"name": "pool0", "overprovision-ratio": 5.0},
}
LVM = "/sbin/lvm"


def lvm(*args: str, check: bool = True) -> str:
    """Run an lvm command directly (the test's view of the truth)."""
    proc = subprocess.run([LVM, *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"lvm {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout


@dataclass
class VolumeGroups:
    """Creates VGs on free UML disks and removes them (and wipes the disks) afterwards."""

    free: list[str]
    made: dict[str, list[str]] = field(default_factory=dict)

    def create(self, name: str, size_gib: float = 20, pvs: int = 1) -> list[str]:
        if len(self.free) < pvs:
            raise AssertionError(f"not enough UML disks for {pvs} PVs (free: {self.free})")
        disks = [self.free.pop(0) for _ in range(pvs)]
        each = int(size_gib * GiB / pvs)
        for d in disks:
            lvm("pvcreate", "-ff", "-y", "--setphysicalvolumesize", f"{each}b", d)
        lvm("vgcreate", "-s", "4m", name, *disks)
        self.made[name] = disks
        return disks

    def thin_pool(self, vg: str, pool: str, size_gib: float) -> None:
        lvm("lvcreate", "-T", f"{vg}/{pool}", "-L", f"{int(size_gib * GiB)}b", "-y")

    def cleanup(self) -> None:
        for name, disks in self.made.items():
            lvm("vgremove", "-ff", "-y", name, check=False)
            for d in disks:
                lvm("pvremove", "-ff", "-y", d, check=False)
                subprocess.run(["wipefs", "-a", "-q", d], check=False)
            self.free.extend(disks)
        self.made.clear()


@pytest.fixture
def vgs() -> Iterator[VolumeGroups]:
    if not uml_tier.IN_UML:
        pytest.fail("the vgs fixture only works inside UML (mark the test with @pytest.mark.uml)")
    groups = VolumeGroups(free=list(uml_tier.guest_disks()))
    try:
        yield groups
    finally:
        groups.cleanup()


def lvmd_config(socket: Path, classes: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "socket-name": str(socket),
        "device-classes": classes,
        "lvm-command-prefix": [LVM],
        **extra,
    }


@dataclass
class LvmdClient:
    server: LvmdServer
    channel: grpc.aio.Channel
    lv: pb_grpc.LVServiceAsyncStub
    vg: pb_grpc.VGServiceAsyncStub
    data: vd_grpc.VolumeDataAsyncStub


async def start_lvmd(raw: dict[str, Any], **options: Any) -> LvmdClient:
    config = lvmd_file.lvmd_config(raw)
    server = LvmdServer(config, Options(**options))
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix:{config.socket_name}")
    return LvmdClient(
        server,
        channel,
        pb_grpc.LVServiceStub(channel),
        pb_grpc.VGServiceStub(channel),
        vd_grpc.VolumeDataStub(channel),
    )


@pytest.fixture
async def lvmd_factory(tmp_path: Path) -> AsyncIterator[Any]:
    """``await lvmd_factory(classes, **config)`` starts an in-process lvmd on a fresh socket."""
    started: list[LvmdClient] = []

    async def make(
        classes: list[dict[str, Any]], options: dict[str, Any] | None = None, **extra: Any
    ) -> LvmdClient:
        raw = lvmd_config(tmp_path / f"lvmd{len(started)}.sock", classes, **extra)
        client = await start_lvmd(raw, **(options or {}))
        started.append(client)
        return client

    yield make
    for c in started:
        await c.channel.close(None)
        await c.server.stop()


def write_config(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


async def code_of(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    """The status code and details of a gRPC call that must fail."""
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value.code(), e.value.details() or ""

"""lvmd's server against real LVM inside User-Mode Linux: cached reads, parallel creates,
start-up checks of the VGs and pools, the socket and a graceful stop."""

# ruff: noqa: F811  (fixtures imported from tests.lvmd_lvm_helpers are parameters here)

from __future__ import annotations

import asyncio
import os
import stat
from typing import Any

import grpc
import pytest

from tests.lvm_fixtures import THICK, THIN, GiB, LvmdClient, VolumeGroups
from tests.lvmd_lvm_helpers import (
    MiB,
    lv_report,
    thick,  # noqa: F401
)
from topolvm.config.lvmd import lvmd_config
from topolvm.daemon import StartupError
from topolvm.lvmd.server import LvmdServer
from topolvm.proto import lvmd_pb2 as pb

pytestmark = pytest.mark.uml

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
    config = lvmd_config(
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

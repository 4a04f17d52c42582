"""CSI Node service against real LVM inside UML: capabilities, argument checks and the error
codes of every RPC."""

# ruff: noqa: F811  (the env fixture imported from tests.node_csi_helpers is a parameter here)

from __future__ import annotations

import os
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.lvm_fixtures import code_of
from tests.node_csi_helpers import (
    SNW,
    Code,
    DictLookup,
    Env,
    MiB,
    block_cap,
    env,  # noqa: F401
    mount_cap,
    start_node,
)
from topolvm.node.lvmd_client import SocketLvmd
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import csi_pb2_grpc as csi_grpc
from topolvm.rpc.server import stop_unix_server

pytestmark = pytest.mark.uml


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


async def test_lvmd_unreachable_is_unavailable_so_the_kubelet_retries(tmp_path: Path) -> None:
    """lvmd restarting (its socket refuses): NodePublishVolume and NodeExpandVolume answer
    UNAVAILABLE naming lvmd, not INTERNAL (the chaos campaign's SIGKILL of lvmd found this)."""
    lvmd = SocketLvmd(str(tmp_path / "lvmd.sock"))  # nothing listens there
    volumes = DictLookup()
    volumes.classes["vol-1"] = "ssd"
    sock = str(tmp_path / "csi.sock")
    _, _, server = await start_node(tmp_path, lvmd, volumes, sock)
    try:
        async with grpc.aio.insecure_channel(f"unix:{sock}") as channel:
            node = csi_grpc.NodeStub(channel)
            target = str(tmp_path / "pods" / "p" / "mount")
            publish = csi.NodePublishVolumeRequest(
                volume_id="vol-1", target_path=target, volume_capability=mount_cap()
            )
            code, details = await code_of(node.NodePublishVolume(publish))
            assert code == Code.UNAVAILABLE and "lvmd is unavailable" in details, details
            expand = csi.NodeExpandVolumeRequest(volume_id="vol-1", volume_path=target)
            code, details = await code_of(node.NodeExpandVolume(expand))
            assert code == Code.UNAVAILABLE and "lvmd is unavailable" in details, details
    finally:
        await stop_unix_server(server, sock, grace=1)
        await lvmd.close()

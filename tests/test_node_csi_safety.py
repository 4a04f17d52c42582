"""CSI Node service against real LVM inside UML: concurrent publishes, foreign and stacked
mounts, restarts, legacy devices, logging and odd target paths."""

# ruff: noqa: F811  (the env fixture imported from tests.node_csi_helpers is a parameter here)

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import grpc
import pytest

from tests.lvm_fixtures import code_of
from tests.node_csi_helpers import (
    Code,
    Env,
    MiB,
    env,  # noqa: F401
    mount_cap,
    mounts,
    sh,
    start_node,
)
from topolvm.constants import LEGACY_DEVICE_DIR
from topolvm.proto import csi_pb2_grpc as csi_grpc
from topolvm.rpc.server import stop_unix_server

pytestmark = pytest.mark.uml


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
    for attempt in range(5):  # as the kubelet does: UNAVAILABLE (the new socket's first
        try:  # connection may meet the old one's end under load) is tried again
            await env.publish("vol-r", target, mount_cap("ext4", ("noatime",)))
            break
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or attempt == 4:
                raise
            await asyncio.sleep(0.5)
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

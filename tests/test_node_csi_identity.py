"""CSI Identity service inside UML: plugin info, capabilities and Probe with its checks."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import pytest

from tests.lvm_fixtures import code_of
from tests.node_csi_helpers import NO_LVMD, Code, DictLookup, start_csi_server
from topolvm.constants import names
from topolvm.csi.identity import IdentityService
from topolvm.node.csi_node import NodeService
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import csi_pb2_grpc as csi_grpc
from topolvm.rpc.server import stop_unix_server

pytestmark = pytest.mark.uml


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

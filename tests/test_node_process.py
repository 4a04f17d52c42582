"""``topolvm node`` as a real process (UML): emulator API, real LVM, CSI over its socket."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import IO, Any

import aiohttp
import grpc
import pytest
import yaml

from tests.helpers import eventually
from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import kube, write_kubeconfig  # noqa: F401
from tests.lvm_fixtures import THICK, VolumeGroups, lvm, lvmd_config
from topolvm.constants import NORMAL
from topolvm.k8s import api
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import csi_pb2_grpc as csi_grpc

pytestmark = pytest.mark.uml
NODE = "node1"


class NodeProcess:
    def __init__(self, proc: asyncio.subprocess.Process, log: Path, out: IO[str], csi_socket: str):
        self.proc = proc
        self.log = log
        self.out = out
        self.csi_socket = csi_socket

    async def until(self, what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
        return await eventually(
            what,
            check,
            timeout,
            gave_up=lambda: self.proc.returncode is not None,
            details=lambda: f"log:\n{self.log.read_text()}",
        )

    async def stop(self) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 60)
            except TimeoutError:
                self.proc.kill()  # never leave a node (and its embedded lvmd) running
                await self.proc.wait()
                self.out.close()
                raise AssertionError(
                    f"topolvm-node ignored SIGTERM for 60 s; log:\n{self.log.read_text()}"
                ) from None
        self.out.close()
        assert self.proc.returncode is not None
        return self.proc.returncode


@pytest.fixture
async def cluster(kube: KubeEmulator, tmp_path: Path) -> AsyncIterator[KubeEmulator]:  # noqa: F811
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    kube.create(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIDriver",
            "metadata": {"name": "topolvm.io"},
            "spec": {"attachRequired": False, "podInfoOnMount": True},
        }
    )
    yield kube


async def start_node(emu: KubeEmulator, tmp_path: Path, *args: str) -> NodeProcess:
    kc = write_kubeconfig(tmp_path / "kubeconfig", emu.url)
    sock = str(tmp_path / "csi" / "csi.sock")
    log = tmp_path / "node.log"
    out = log.open("w")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "topolvm", "--log-format", "text", "node",
        "--nodename", NODE, "--kubeconfig", str(kc), "--csi-socket", sock,
        "--metrics-bind-address", "127.0.0.1:18081", *args,
        stdout=out, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    node = NodeProcess(proc, log, out, sock)
    await node.until("the CSI socket", lambda: Path(sock).exists())
    return node


def lv_status(emu: KubeEmulator, name: str) -> dict[str, Any]:
    return dict((emu.get("logicalvolumes", name, group="topolvm.io") or {}).get("status") or {})


MOUNT = csi.VolumeCapability(
    mount=csi.VolumeCapability.MountVolume(fs_type="xfs"),
    access_mode=csi.VolumeCapability.AccessMode(
        mode=csi.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
    ),
)


async def test_embedded_lvmd_end_to_end(
    cluster: KubeEmulator, vgs: VolumeGroups, tmp_path: Path
) -> None:
    vgs.create("vg1", size_gib=4)
    cfg = tmp_path / "lvmd.yaml"
    cfg.write_text(yaml.safe_dump(lvmd_config(tmp_path / "unused.sock", [THICK])))
    node = await start_node(cluster, tmp_path, "--embed-lvmd", "--config", str(cfg))
    client = api.make_client(server=cluster.url)
    res = api.logicalvolume_resource(NORMAL)
    try:
        await client.create(
            res.from_dict(
                {
                    "apiVersion": "topolvm.io/v1",
                    "kind": "LogicalVolume",
                    "metadata": {"name": "pvc-e2e"},
                    "spec": {"name": "pvc-e2e", "nodeName": NODE, "size": "512Mi"},
                }
            )
        )
        status = await node.until("status", lambda: lv_status(cluster, "pvc-e2e"))
        uid = status["volumeID"]
        assert status == {"volumeID": uid, "currentSize": "512Mi"}
        target = str(tmp_path / "pod" / "vol")
        async with grpc.aio.insecure_channel(f"unix:{node.csi_socket}") as ch:
            stub, ident = csi_grpc.NodeStub(ch), csi_grpc.IdentityStub(ch)
            probe = await ident.Probe(csi.ProbeRequest())
            assert probe.ready.value is True  # embedded: only the CSIDriver check runs
            await stub.NodePublishVolume(
                csi.NodePublishVolumeRequest(
                    volume_id=uid, target_path=target, volume_capability=MOUNT
                )
            )
            mounts = Path("/proc/self/mountinfo").read_text()
            assert f" {target} " in mounts and " xfs " in mounts
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.NodePublishVolume(
                    csi.NodePublishVolumeRequest(
                        volume_id="fake-vol-id-0000",
                        target_path=target + "x",
                        volume_capability=MOUNT,
                    )
                )
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
            await stub.NodeUnpublishVolume(
                csi.NodeUnpublishVolumeRequest(volume_id=uid, target_path=target)
            )
            assert not Path(target).exists()
        async with (
            aiohttp.ClientSession() as http,
            http.get("http://127.0.0.1:18081/metrics") as r,
        ):
            text = await r.text()
        assert f'topolvm_volumegroup_available_bytes{{device_class="ssd",node="{NODE}"}}' in text
        await client.delete(res, "pvc-e2e")
        await node.until(
            "object gone",
            lambda: cluster.get("logicalvolumes", "pvc-e2e", group="topolvm.io") is None,
        )
        assert uid not in lvm("lvs", "--noheadings", "-o", "lv_name", "vg1")
    finally:
        await client.close()
        code = await node.stop()
    assert code == 0, node.log.read_text()
    assert "topolvm-node stopped" in node.log.read_text()


async def test_socket_mode_with_a_separate_lvmd(
    cluster: KubeEmulator, vgs: VolumeGroups, lvmd_factory: Any, tmp_path: Path
) -> None:
    vgs.create("vg1", size_gib=4)
    lvmd = await lvmd_factory([THICK])
    node = await start_node(cluster, tmp_path, "--lvmd-socket", lvmd.server.config.socket_name)
    try:

        def annotations() -> dict[str, str]:
            meta = (cluster.get("nodes", NODE) or {}).get("metadata", {})
            return dict(meta.get("annotations") or {})

        annos = await node.until("capacity annotations", annotations)
        assert int(annos["capacity.topolvm.io/ssd"]) > 2 << 30  # 4 GiB VG - 1 GiB spare
        async with grpc.aio.insecure_channel(f"unix:{node.csi_socket}") as ch:
            probe = await csi_grpc.IdentityStub(ch).Probe(csi.ProbeRequest())
            assert probe.ready.value is True  # lvmd health + CSIDriver
    finally:
        assert await node.stop() == 0

"""The chaos campaign's eyes and hands: one observation of the cluster for the invariant checker
(tests/invariants.py), waiting until it holds, and the data a volume carries (written and read
back through the node's CSI socket as the kubelet would publish it, checked by SHA-256)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from lightkube import ALL_NS, AsyncClient
from lightkube.resources.core_v1 import PersistentVolume
from lightkube.resources.storage_v1 import CSIStorageCapacity

from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import node_annotations
from tests.helpers import eventually
from tests.invariants import ClusterView, DeviceClass, Lv, NodeView, violations
from topolvm.constants import NORMAL, Names
from topolvm.k8s import api
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import csi_pb2_grpc as csi_grpc

MIB = 1 << 20
TARGETS = "/run/kubelet/chaos"  # the guest's tmpfs: the campaign publishes, no kubelet runs
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED)


def device_class(raw: dict[str, Any]) -> DeviceClass:
    """An lvmd config device class, as the checker sees it."""
    pool = raw.get("thin-pool") or {}
    return DeviceClass(raw["name"], raw["volume-group"], int(raw.get("spare-gb", 10)) << 30,
                       pool.get("name"), float(pool.get("overprovision-ratio", 1.0)))  # fmt: skip


def _node_lvm(node: UmlNode, vgs: set[str]) -> tuple[dict[str, dict[str, Lv]], dict[str, int]]:
    lvs = {}
    for vg in sorted(vgs):
        lvs[vg] = {name: Lv(int(r["lv_size"]), r["lv_attr"], r.get("pool_lv") or "")
                   for name, r in node.lvs(vg).items()}  # fmt: skip
    out = node.lvm("vgs", "--reportformat", "json", "--units", "b", "--nosuffix",
                   "-o", "vg_name,vg_free")  # fmt: skip
    free = {r["vg_name"]: int(r["vg_free"]) for r in json.loads(out)["report"][0]["vg"]}
    return lvs, free


async def observe(
    client: AsyncClient, nodes: list[UmlNode], classes: list[DeviceClass],
    storage_classes: dict[str, str], names: Names = NORMAL,
) -> ClusterView:  # fmt: skip
    vgs = {dc.vg for dc in classes}
    views = {}
    for node in nodes:
        lvs, free = await asyncio.to_thread(_node_lvm, node, vgs)
        views[node.name] = NodeView(node.name, lvs, free, await node_annotations(client, node.name))
    pvs, _ = await api.list_all(client, PersistentVolume)
    lv_objects, _ = await api.list_all(client, api.logicalvolume_resource(names))
    capacities, _ = await api.list_all(client, CSIStorageCapacity, namespace=ALL_NS)
    return ClusterView(views, classes, pvs, lv_objects, capacities, storage_classes, names)


async def settled(
    client: AsyncClient, nodes: list[UmlNode], classes: list[DeviceClass],
    storage_classes: dict[str, str], timeout: float = 120,
    details: Callable[[], str] = lambda: "",
) -> float:  # fmt: skip
    """Wait until every invariant holds; return the seconds it took. On timeout the assertion
    lists what was still broken."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    last: list[str] = []

    async def holds() -> bool:
        nonlocal last
        last = violations(await observe(client, nodes, classes, storage_classes))
        return not last

    await eventually("every invariant to hold", holds, timeout=timeout, interval=1,
                     details=lambda: "\n  ".join(["still broken:", *last, details()]))  # fmt: skip
    return loop.time() - start


@dataclass
class Volume:
    """A filesystem PVC the campaign wrote data into."""

    claim: str
    device_class: str
    size_mib: int
    checksum: str = ""
    node: str = ""  # the node that holds it: the campaign's node unless a copy put it elsewhere
    # grown by the controller, the filesystem's part left to a kubelet that mounts it; until
    # then Kubernetes holds a further resize of the claim (NodeResizePending), so none is asked
    expanded: bool = False


async def _publish(node: UmlNode, pv: dict[str, Any], target: str) -> None:
    source = pv["spec"]["csi"]
    await node.aexec("mkdir", "-p", target.rsplit("/", 1)[0])
    mode = csi.VolumeCapability.AccessMode(mode=csi.VolumeCapability.AccessMode.SINGLE_NODE_WRITER)
    cap = csi.VolumeCapability(mount=csi.VolumeCapability.MountVolume(
        fs_type=source.get("fsType", "")), access_mode=mode)  # fmt: skip
    async with grpc.aio.insecure_channel(node.csi_target) as ch:
        await csi_grpc.NodeStub(ch).NodePublishVolume(
            csi.NodePublishVolumeRequest(volume_id=source["volumeHandle"], target_path=target,
                                         volume_capability=cap,
                                         volume_context=source.get("volumeAttributes", {})),
            timeout=120,
        )  # fmt: skip


async def _unpublish(node: UmlNode, pv: dict[str, Any], target: str) -> None:
    async with grpc.aio.insecure_channel(node.csi_target) as ch:
        await csi_grpc.NodeStub(ch).NodeUnpublishVolume(
            csi.NodeUnpublishVolumeRequest(volume_id=pv["spec"]["csi"]["volumeHandle"],
                                           target_path=target), timeout=60)  # fmt: skip


async def with_data(client: AsyncClient, node: UmlNode, pv_name: str, script: str) -> str:
    """Publish the PV on ``node``, run ``script`` (sh, in the mounted folder), unpublish; return
    the script's output."""
    pv = await api.get(client, PersistentVolume, pv_name)
    assert pv is not None, f"PV {pv_name} is gone"
    target = f"{TARGETS}/{pv_name}/mount"

    async def published() -> bool:  # the kubelet retries what the node says is transient
        try:
            await _publish(node, pv, target)
        except grpc.aio.AioRpcError as e:
            if e.code() in RETRIED:
                return False
            raise
        return True

    await eventually(f"{pv_name} published", published, timeout=120, interval=0.5)
    try:
        res = await node.aexec("sh", "-c", f"cd {target} && {script}")
    finally:
        await _unpublish(node, pv, target)
    return res.stdout


WRITE = ("dd if=/dev/urandom of=data bs=1M count=4 status=none && sync data && "
         "sha256sum data | cut -d' ' -f1")  # fmt: skip
READ = "sha256sum data | cut -d' ' -f1"

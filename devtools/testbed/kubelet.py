"""A STAND-IN FOR THE KUBELET. The test bed has no kubelet; this plays the parts of it that a
CSI driver sees, for a pod that kube-scheduler has bound to a UML node:

- ``start_pod``: for each PVC volume of the pod, NodePublishVolume on that node's CSI socket
  with the kubelet's target paths and volume context (``podInfoOnMount`` keys included), then
  the pod's status set to Running/Ready;
- ``stop_pod``: NodeUnpublishVolume for each volume (the pod object is left to the caller);
- ``expand_pvc``: after the resizer grew the PV, NodeExpandVolume on the published path and the
  PVC status update the kubelet makes (capacity, condition removed).

It does not run containers, stage volumes, enforce fsGroup, report node status or heartbeats,
evict, or garbage-collect orphaned mounts. docs/testing.md says the same.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim, Pod

from devtools.testbed.kubenode import KUBELET_DIR
from topolvm.k8s import api
from topolvm.k8s.lvobject import parse_quantity
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import csi_pb2_grpc as csi_grpc

KUBELET = KUBELET_DIR  # the real kubelet's root (--root-dir), which the paths mirror
Mode = csi.VolumeCapability.AccessMode


def mount_target(pod_uid: str, pv: str, root: str = KUBELET) -> str:
    return f"{root}/pods/{pod_uid}/volumes/kubernetes.io~csi/{pv}/mount"


def block_target(pod_uid: str, pv: str, root: str = KUBELET) -> str:
    return f"{root}/plugins/kubernetes.io/csi/volumeDevices/publish/{pv}/{pod_uid}"


@dataclass
class Published:
    pvc: str
    pv: str
    volume_id: str
    target: str
    block: bool


MakeDir = Callable[[str, str], Awaitable[None]]
"""``mkdir(node, path)``: create ``path`` (and its parents) on that node."""


class KubeletStandIn:
    """``csi_targets`` maps node names to ``host:port`` of that node's CSI socket bridge;
    ``mkdir`` makes folders on a node (the CO creates the target's parent, as the CSI spec
    requires of it); ``root`` stands for /var/lib/kubelet."""

    def __init__(
        self,
        client: AsyncClient,
        csi_targets: dict[str, str],
        mkdir: MakeDir,
        root: str = KUBELET,
    ) -> None:
        self.client = client
        self.csi_targets = csi_targets
        self.mkdir = mkdir
        self.root = root
        self._channels: dict[str, grpc.aio.Channel] = {}

    def node_stub(self, node: str) -> csi_grpc.NodeAsyncStub:
        if node not in self._channels:
            self._channels[node] = grpc.aio.insecure_channel(self.csi_targets[node])
        return csi_grpc.NodeStub(self._channels[node])

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close(None)
        self._channels.clear()

    def _target(self, pod_uid: str, pv: str, block: bool) -> str:
        if block:
            return block_target(pod_uid, pv, self.root)
        return mount_target(pod_uid, pv, self.root)

    async def _volumes(self, pod: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        ns = pod["metadata"]["namespace"]
        found = []
        for vol in pod["spec"].get("volumes", []):
            if "persistentVolumeClaim" in vol:
                claim = vol["persistentVolumeClaim"]["claimName"]
            elif "ephemeral" in vol:  # generic ephemeral volume: the claim is <pod>-<volume>
                claim = f"{pod['metadata']['name']}-{vol['name']}"
            else:
                continue
            pvc = await api.get(self.client, PersistentVolumeClaim, claim, namespace=ns)
            if pvc is None or not pvc["spec"].get("volumeName"):
                raise AssertionError(f"kubelet stand-in: PVC {ns}/{claim} is not bound")
            found.append((claim, pvc))
        return found

    async def start_pod(self, name: str, namespace: str = "default") -> list[Published]:
        """Publish the pod's PVC volumes on its node and mark it Running."""
        pod = await api.get(self.client, Pod, name, namespace=namespace)
        assert pod is not None, f"pod {namespace}/{name} not found"
        node = pod["spec"].get("nodeName")
        if not node:
            raise AssertionError(f"kubelet stand-in: pod {namespace}/{name} is not scheduled")
        uid = pod["metadata"]["uid"]
        stub = self.node_stub(node)
        published = []
        for claim, pvc in await self._volumes(pod):
            pv = await api.get(self.client, PersistentVolume, pvc["spec"]["volumeName"])
            assert pv is not None
            source = pv["spec"]["csi"]
            block = pv["spec"].get("volumeMode") == "Block"
            target = self._target(uid, pv["metadata"]["name"], block)
            await self.mkdir(node, target.rsplit("/", 1)[0])
            cap = csi.VolumeCapability(access_mode=Mode(mode=Mode.SINGLE_NODE_WRITER))
            if block:
                cap.block.SetInParent()
            else:
                cap.mount.fs_type = source.get("fsType", "")
                cap.mount.mount_flags.extend(pv["spec"].get("mountOptions", []))
            context = {
                **source.get("volumeAttributes", {}),
                "csi.storage.k8s.io/pod.name": name,
                "csi.storage.k8s.io/pod.namespace": namespace,
                "csi.storage.k8s.io/pod.uid": uid,
                "csi.storage.k8s.io/serviceAccount.name": pod["spec"].get(
                    "serviceAccountName", "default"
                ),
                "csi.storage.k8s.io/ephemeral": "false",
            }
            await stub.NodePublishVolume(
                csi.NodePublishVolumeRequest(
                    volume_id=source["volumeHandle"],
                    target_path=target,
                    volume_capability=cap,
                    readonly=bool(source.get("readOnly", False)),
                    volume_context=context,
                ),
                timeout=120,
            )
            published.append(
                Published(claim, pv["metadata"]["name"], source["volumeHandle"], target, block)
            )
        await api.patch_merge(
            self.client,
            Pod.Status,
            name,
            {
                "status": {
                    "phase": "Running",
                    "conditions": [
                        {"type": "Ready", "status": "True"},
                        {"type": "ContainersReady", "status": "True"},
                        {"type": "PodScheduled", "status": "True"},
                    ],
                }
            },
            namespace=namespace,
        )
        return published

    async def stop_pod(self, name: str, namespace: str = "default") -> None:
        """Unpublish the pod's volumes (as the kubelet does before a pod's deletion completes)."""
        pod = await api.get(self.client, Pod, name, namespace=namespace)
        if pod is None or not pod["spec"].get("nodeName"):
            return
        uid = pod["metadata"]["uid"]
        stub = self.node_stub(pod["spec"]["nodeName"])
        for _, pvc in await self._volumes(pod):
            pv = await api.get(self.client, PersistentVolume, pvc["spec"]["volumeName"])
            assert pv is not None
            block = pv["spec"].get("volumeMode") == "Block"
            pv_name = pv["metadata"]["name"]
            await stub.NodeUnpublishVolume(
                csi.NodeUnpublishVolumeRequest(
                    volume_id=pv["spec"]["csi"]["volumeHandle"],
                    target_path=self._target(uid, pv_name, block),
                ),
                timeout=60,
            )

    async def expand_pvc(self, pod: str, claim: str, namespace: str = "default") -> None:
        """NodeExpandVolume for ``claim`` as mounted in ``pod``; then the PVC status update.
        (The response's capacity_bytes is optional in CSI; the kubelet does not rely on it.)"""
        pod_obj = await api.get(self.client, Pod, pod, namespace=namespace)
        pvc = await api.get(self.client, PersistentVolumeClaim, claim, namespace=namespace)
        assert pod_obj is not None and pvc is not None
        pv = await api.get(self.client, PersistentVolume, pvc["spec"]["volumeName"])
        assert pv is not None
        uid = pod_obj["metadata"]["uid"]
        pv_name = pv["metadata"]["name"]
        block = pv["spec"].get("volumeMode") == "Block"
        size = pv["spec"]["capacity"]["storage"]
        await self.node_stub(pod_obj["spec"]["nodeName"]).NodeExpandVolume(
            csi.NodeExpandVolumeRequest(
                volume_id=pv["spec"]["csi"]["volumeHandle"],
                volume_path=self._target(uid, pv_name, block),
                capacity_range=csi.CapacityRange(required_bytes=parse_quantity(size)),
            ),
            timeout=120,
        )
        conditions = [
            c
            for c in (pvc.get("status") or {}).get("conditions", [])
            if c.get("type") not in ("FileSystemResizePending", "Resizing")
        ]
        await api.patch_merge(
            self.client,
            PersistentVolumeClaim.Status,
            claim,
            {
                "status": {
                    "capacity": {"storage": size},
                    "conditions": conditions or None,
                    "allocatedResourceStatuses": None,
                }
            },
            namespace=namespace,
        )

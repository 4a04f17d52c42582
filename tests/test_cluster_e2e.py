"""A pod with a TopoLVM PVC, end to end on the real control plane and UML nodes with real LVM:
kube-scheduler + topolvm-scheduler pick the node with the most free space, a LogicalVolume for
that node (written by the test, as topolvm-controller will) becomes an LV in its VG, and the
kubelet stand-in mounts it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, PersistentVolume, PersistentVolumeClaim, Pod

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.kubelet import KubeletStandIn
from devtools.testbed.process import Child
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import GROUP_LABEL, UmlNodes, unique
from tests.helpers import eventually_async
from tests.lvm_fixtures import THICK
from topolvm.constants import NORMAL
from topolvm.k8s import api

pytestmark = pytest.mark.cluster
GiB = 1 << 30
LV = api.logicalvolume_resource(NORMAL)
SELECTED_NODE = "volume.kubernetes.io/selected-node"


async def provision_as_the_controller_will(
    client: AsyncClient, pvc_name: str, storage_class: str, fs_type: str
) -> tuple[str, str, str]:
    """Stand-in for topolvm-controller (not built yet): once kube-scheduler has selected a
    node, write a LogicalVolume for it, wait for the node to create the LV, then write the PV
    that binds the claim. Returns (node, LogicalVolume name, volume id)."""

    async def selected() -> dict[str, Any] | None:
        pvc = await api.get(client, PersistentVolumeClaim, pvc_name, namespace="default")
        annotations = (pvc or {}).get("metadata", {}).get("annotations") or {}
        return pvc if SELECTED_NODE in annotations else None

    pvc = await eventually_async(f"{SELECTED_NODE} on {pvc_name}", selected)
    node = pvc["metadata"]["annotations"][SELECTED_NODE]
    size = int(pvc["spec"]["resources"]["requests"]["storage"].removesuffix("Gi")) * GiB
    name = f"pvc-{pvc['metadata']['uid']}"
    await client.create(
        LV.from_dict(
            {
                "apiVersion": f"{NORMAL.group}/v1",
                "kind": "LogicalVolume",
                "metadata": {"name": name},
                "spec": {"name": name, "nodeName": node, "size": str(size), "deviceClass": "ssd"},
            }
        )
    )

    async def created() -> str | None:
        obj = await api.get(client, LV, name)
        status = (obj or {}).get("status") or {}
        assert not status.get("code"), f"the node failed to create the LV: {status}"
        return status.get("volumeID")

    volume_id: str = await eventually_async(f"LogicalVolume {name} created", created)
    await client.create(
        cast(
            PersistentVolume,
            PersistentVolume.from_dict(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": {"name": name},
                    "spec": {
                        "capacity": {"storage": f"{size // GiB}Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Delete",
                        "storageClassName": storage_class,
                        "volumeMode": "Filesystem",
                        "claimRef": {
                            "namespace": "default",
                            "name": pvc_name,
                            "uid": pvc["metadata"]["uid"],
                        },
                        "csi": {
                            "driver": "topolvm.io",
                            "volumeHandle": volume_id,
                            "fsType": fs_type,
                            "volumeAttributes": {"topolvm.io/device-class": "ssd"},
                        },
                        "nodeAffinity": {
                            "required": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "topology.topolvm.io/node",
                                                "operator": "In",
                                                "values": [node],
                                            }
                                        ]
                                    }
                                ]
                            }
                        },
                    },
                }
            ),
        )
    )
    return node, name, volume_id


async def test_pod_with_pvc_lands_on_the_roomiest_uml_node_and_gets_a_mounted_volume(
    control_plane: ControlPlane,
    extenders: dict[str, Child],
    uml_nodes: UmlNodes,
    kubelet: Callable[[list[UmlNode]], KubeletStandIn],
    cluster_client: AsyncClient,
) -> None:
    # Free space after the 1 GiB spare: about 2, 11 and 4 GiB, so the extender's scores
    # (floor(log2(GiB))) are 1, 3 and 2: the middle node must win.
    nodes = uml_nodes(3, vg_gib=[3, 12, 5])
    for n in nodes:
        n.start_topolvm_node(control_plane, [THICK])

    async def all_annotated() -> bool:
        for n in nodes:
            obj = await api.get(cluster_client, Node, n.name)
            if "capacity.topolvm.io/ssd" not in (obj or {}).get("metadata", {}).get(
                "annotations", {}
            ):
                return False
        return True

    await eventually_async("capacity annotations on every UML node", all_annotated)
    roomiest = nodes[1]
    sc, pvc, pod = unique("topolvm-xfs"), unique("data"), unique("app")
    group = nodes[0].name.rsplit("-n", 1)[0]
    control_plane.apply(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": sc},
            "provisioner": "topolvm.io",
            "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": True,
            "parameters": {
                "topolvm.io/device-class": "ssd",
                "csi.storage.k8s.io/fstype": "xfs",
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": pvc, "namespace": "default"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": sc,
                "resources": {"requests": {"storage": "2Gi"}},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod,
                "namespace": "default",
                # What topolvm-controller's pod webhook will write for a 2Gi ssd claim.
                "annotations": {"capacity.topolvm.io/ssd": str(2 * GiB)},
            },
            "spec": {
                "schedulerName": "topolvm-extender",
                "nodeSelector": {GROUP_LABEL: group},
                "containers": [
                    {
                        "name": "app",
                        "image": "registry.invalid/app:1",
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }
                ],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": pvc}}],
            },
        },
    )
    try:
        node_name, lv_name, volume_id = await provision_as_the_controller_will(
            cluster_client, pvc, sc, "xfs"
        )
        assert node_name == roomiest.name
        lvs = roomiest.lvs("vg1")
        assert int(lvs[volume_id]["lv_size"]) == 2 * GiB
        for other in (nodes[0], nodes[2]):
            assert other.lvs("vg1") == {}

        async def bound() -> str | None:
            obj = await api.get(cluster_client, Pod, pod, namespace="default")
            node = (obj or {}).get("spec", {}).get("nodeName")
            return str(node) if node else None

        assert await eventually_async(f"{pod} bound", bound, timeout=90) == roomiest.name
        published = await kubelet(nodes).start_pod(pod)
        (vol,) = published
        mounts = roomiest.mounts()
        assert mounts[vol.target]["fstype"] == "xfs"
        roomiest.exec("sh", "-c", f"echo hello > {vol.target}/file && sync")
        assert roomiest.exec("cat", f"{vol.target}/file").stdout == "hello\n"
        running = await api.get(cluster_client, Pod, pod, namespace="default")
        assert running is not None and running["status"]["phase"] == "Running"

        await kubelet(nodes).stop_pod(pod)
        assert vol.target not in roomiest.mounts()
    finally:
        control_plane.kubectl(
            "delete", "pod", pod, "-n", "default", "--grace-period=0", "--force",
            "--ignore-not-found", check=False,
        )  # fmt: skip
        control_plane.kubectl("delete", "pvc", pvc, "-n", "default", "--wait=false", check=False)
    # Without topolvm-controller nothing deletes the volume behind a released PV: do its part.
    await cluster_client.delete(PersistentVolume, lv_name)
    await cluster_client.delete(LV, lv_name)

    async def lv_removed() -> bool:
        return await api.get(cluster_client, LV, lv_name) is None

    await eventually_async("LogicalVolume removed", lv_removed)
    assert roomiest.lvs("vg1") == {}
    control_plane.kubectl("delete", "storageclass", sc, check=False)

"""A pod with TopoLVM PVCs in extender mode, end to end on the real control plane and UML nodes
with real LVM: kube-scheduler + topolvm-scheduler pick the node with the most free space,
csi-provisioner + topolvm-controller provision the claims there, the node makes the LVs, and the
node's kubelet runs the pod's container with them (a filesystem and a block volume); the
filesystem then grows online under the running container (csi-resizer, ControllerExpandVolume,
the kubelet's NodeExpandVolume)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim, Pod

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.process import Child
from tests.cluster_fixtures import GROUP_LABEL, UmlNodes, node_annotations, pod_node, unique
from tests.helpers import eventually
from tests.lvm_fixtures import THICK
from tests.provisioning import Scenario, busybox
from topolvm.constants import NORMAL
from topolvm.k8s import api

pytestmark = pytest.mark.cluster
GiB = 1 << 30
LV = api.logicalvolume_resource(NORMAL)
SELECTED_NODE = "volume.kubernetes.io/selected-node"


def claim(name: str, sc: str, size: str, block: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": sc,
            "volumeMode": "Block" if block else "Filesystem",
            "resources": {"requests": {"storage": size}},
        },
    }


async def bound_volume(client: AsyncClient, pvc_name: str) -> tuple[str, str, str]:
    """(node, PV = LogicalVolume name, volume id) once csi-provisioner and topolvm-controller
    have provisioned the claim on the node kube-scheduler selected."""

    async def check() -> dict[str, Any] | None:
        pvc = await api.get(client, PersistentVolumeClaim, pvc_name, namespace="default")
        return pvc if pvc and pvc.get("status", {}).get("phase") == "Bound" else None

    pvc = await eventually(f"{pvc_name} Bound", check, timeout=120)
    pv = await api.get(client, PersistentVolume, pvc["spec"]["volumeName"])
    assert pv is not None
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    node = terms[0]["matchExpressions"][0]["values"][0]
    return str(node), str(pv["metadata"]["name"]), str(pv["spec"]["csi"]["volumeHandle"])


async def test_pod_with_pvcs_lands_on_the_roomiest_uml_node_and_gets_its_volumes(
    control_plane: ControlPlane,
    extenders: dict[str, Child],
    driver: DriverStack,
    uml_nodes: UmlNodes,
    cluster_client: AsyncClient,
) -> None:
    # Free space after the 1 GiB spare: about 2, 11 and 4 GiB, so the extender's scores
    # (floor(log2(GiB))) are 1, 3 and 2: the middle node must win.
    nodes = uml_nodes(3, vg_gib=[3, 12, 5], kubelet=True)
    for n in nodes:
        n.start_topolvm_node(control_plane, [THICK])

    async def all_annotated() -> bool:
        found = [await node_annotations(cluster_client, n.name) for n in nodes]
        return all("capacity.topolvm.io/ssd" in a for a in found)

    await eventually("capacity annotations on every UML node", all_annotated)
    roomiest = nodes[1]
    group = nodes[0].labels[GROUP_LABEL]
    sc, data, raw, pod = unique("topolvm-xfs"), unique("data"), unique("raw"), unique("app")
    s = Scenario(control_plane, cluster_client, nodes)
    volumes: list[str] = []  # LogicalVolume = PV names
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
        }
    )
    try:
        # The pod is created only once kube-scheduler can see every node's capacity for the class:
        # before that, VolumeBinding rejects the nodes still without a CSIStorageCapacity.
        await s.capacities_published(sc, "ssd")
        control_plane.apply(
            claim(data, sc, "2Gi"),
            claim(raw, sc, "1Gi", block=True),
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod,
                    "namespace": "default",
                    # What topolvm-controller's pod webhook will write for 2Gi + 1Gi of ssd.
                    "annotations": {"capacity.topolvm.io/ssd": str(3 * GiB)},
                },
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "schedulerName": "topolvm-extender",
                    "nodeSelector": {GROUP_LABEL: group},
                    "containers": [
                        {
                            "name": "app",
                            "image": busybox(),
                            "command": ["sleep", "1000000"],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                            "volumeDevices": [{"name": "raw", "devicePath": "/dev/raw"}],
                        }
                    ],
                    "volumes": [
                        {"name": "data", "persistentVolumeClaim": {"claimName": data}},
                        {"name": "raw", "persistentVolumeClaim": {"claimName": raw}},
                    ],
                },
            },
        )
        node_name, data_lv, data_id = await bound_volume(cluster_client, data)
        volumes.append(data_lv)
        assert node_name == roomiest.name
        raw_node, raw_lv, raw_id = await bound_volume(cluster_client, raw)
        volumes.append(raw_lv)
        assert raw_node == roomiest.name
        lvs = roomiest.lvs("vg1")
        assert int(lvs[data_id]["lv_size"]) == 2 * GiB and int(lvs[raw_id]["lv_size"]) == GiB
        for other in (nodes[0], nodes[2]):
            assert other.lvs("vg1") == {}

        assert (
            await eventually(f"{pod} bound", lambda: pod_node(cluster_client, pod), timeout=90)
            == roomiest.name
        )
        fs, dev = sorted(await s.running(pod), key=lambda v: v.block)
        assert roomiest.mounts()[fs.target]["fstype"] == "xfs"
        s.exec(pod, "echo hello > /data/file && sync")  # in the container
        assert roomiest.exec("cat", f"{fs.target}/file").stdout == "hello\n"
        assert roomiest.exec("test", "-b", dev.target, check=False).rc == 0
        assert int(s.exec(pod, "blockdev --getsize64 /dev/raw")) == GiB
        running = await api.get(cluster_client, Pod, pod, namespace="default")
        assert running is not None and running["status"]["phase"] == "Running"

        # Online resize of the filesystem: csi-resizer raises the LV, then the kubelet has the
        # node grow xfs under the running container.
        await api.patch_merge(cluster_client, PersistentVolumeClaim, data,
                              {"spec": {"resources": {"requests": {"storage": "3Gi"}}}},
                              namespace="default")  # fmt: skip
        await s.expanded(data)
        df = s.exec(pod, "df -k /data | tail -1").split()[-5]
        assert int(df) * 1024 > 2 * GiB + GiB // 2  # xfs grew (minus its own metadata)
        assert s.exec(pod, "cat /data/file") == "hello\n"
        claimed = await api.get(cluster_client, PersistentVolumeClaim, data, namespace="default")
        assert claimed is not None and claimed["status"]["capacity"]["storage"] == "3Gi"
        assert not [
            c for c in claimed["status"].get("conditions") or []
            if c["type"] == "FileSystemResizePending"
        ]  # fmt: skip

        await s.delete_pod(pod)  # the kubelet unpublishes both volumes
        assert fs.target not in roomiest.mounts()
        assert roomiest.exec("test", "-e", dev.target, check=False).rc != 0
    finally:
        with contextlib.suppress(Exception):
            await s.delete_pod(pod)  # a failed test may have left it running
        control_plane.kubectl(
            "delete", "pvc", data, raw, "-n", "default", "--wait=false", check=False
        )
        control_plane.kubectl("delete", "storageclass", sc, check=False)

    async def volumes_gone() -> bool:
        return all([await api.get(cluster_client, LV, name) is None for name in volumes])

    await eventually("PVs and LogicalVolumes deleted", volumes_gone, timeout=120)
    assert roomiest.lvs("vg1") == {}

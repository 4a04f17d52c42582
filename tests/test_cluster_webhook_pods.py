"""The pod webhook behind the real kube-apiserver: pods get capacity annotations, and the
marker resource only in marker mode; a bound TopoLVM PVC leaves the pod alone."""

from __future__ import annotations

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim

from devtools.testbed.controlplane import ControlPlane
from tests.cluster_fixtures import unique
from tests.cluster_webhook_helpers import (
    HOOK_NAME,
    GiB,
    capacity,
    claim,
    create,
    ephemeral,
    marker,
    pod,
    pvc,
    served_by_api_server,
    webhook,
)
from tests.helpers import eventually
from topolvm.k8s import api

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("marker_mode", [False, True], ids=["annotations", "marker"])
async def test_pods_get_capacity_annotations_and_the_marker_only_in_marker_mode(
    control_plane: ControlPlane, cluster_client: AsyncClient, marker_mode: bool
) -> None:
    async with webhook(control_plane, cluster_client, marker_mode=marker_mode) as hook:
        await served_by_api_server(hook)
        sc = hook.classes
        for obj in (pvc("data", sc["ssd"], "3Gi"), pvc("shared", sc["foreign"], "9Gi")):
            await create(cluster_client, {**obj, "metadata": {"name": obj["metadata"]["name"],
                                                              "namespace": hook.ns}})  # fmt: skip
        app = pod(
            "app", claim("data"), claim("shared"), claim("not-yet-created"),
            ephemeral("scratch", sc["plain"], "2Gi"), {"name": "tmp", "emptyDir": {}},
        )  # fmt: skip
        code, stderr = await hook.create(app)
        assert code == 0, stderr
        stored = await hook.pod("app")
        assert capacity(stored) == {
            "capacity.topolvm.io/ssd": str(3 * GiB),
            "capacity.topolvm.io/00default": str(2 * GiB),
        }
        if marker_mode:
            assert marker(stored) == [("c0", "1", "1"), ("c1", None, None)]
            assert "Warning: topolvm.io/capacity added: capacity-aware placement needs " \
                "topolvm-scheduler as a kube-scheduler extender" in stderr  # fmt: skip
            assert "Warning: topolvm-node advertises topolvm.io/capacity" in stderr
        else:
            assert marker(stored) == [("c0", None, None), ("c1", None, None)]
            assert "Warning" not in stderr
        assert hook.decisions("mutated") >= 2  # the probe(s) and the pod

        code, stderr = await hook.create(pod("plain", {"name": "tmp", "emptyDir": {}}))
        assert code == 0, stderr
        plain = await hook.pod("plain")
        assert capacity(plain) == {} and marker(plain)[0] == ("c0", None, None)

        code, stderr = await hook.create(pod("empty", containers=0))
        assert code != 0
        assert f'admission webhook "{HOOK_NAME}" denied the request: pod has no containers' in (
            stderr
        )
        assert hook.decisions("denied") == 1


async def test_a_bound_topolvm_pvc_leaves_the_pod_unmutated(
    control_plane: ControlPlane, cluster_client: AsyncClient
) -> None:
    async with webhook(control_plane, cluster_client, marker_mode=True) as hook:
        pv = unique("wh-pv")
        try:
            await create(cluster_client, {
                "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
                "spec": {
                    "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                    "storageClassName": hook.classes["ssd"], "hostPath": {"path": "/tmp/x"},
                    "persistentVolumeReclaimPolicy": "Delete",
                    "claimRef": {"namespace": hook.ns, "name": "bound"},
                },
            })  # fmt: skip
            bound = pvc("bound", hook.classes["ssd"], "1Gi", volume=pv)
            bound["metadata"]["namespace"] = hook.ns
            await create(cluster_client, bound)

            async def is_bound() -> bool:
                obj = await api.get(
                    cluster_client, PersistentVolumeClaim, "bound", namespace=hook.ns
                )
                return bool((obj or {}).get("status", {}).get("phase") == "Bound")

            await eventually("the PVC bound by kube-controller-manager", is_bound)
            await served_by_api_server(hook)
            app = pod("app", ephemeral("e", hook.classes["ssd"], "5Gi"), claim("bound"))
            code, stderr = await hook.create(app)
            assert code == 0, stderr
            stored = await hook.pod("app")
            assert capacity(stored) == {}
            assert marker(stored) == [("c0", None, None), ("c1", None, None)]
            assert "Warning" not in stderr
        finally:
            await api.delete(cluster_client, PersistentVolume, pv)

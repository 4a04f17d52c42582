"""The LogicalVolume CRDs (both groups) on the real kube-apiserver, and the test bed itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node
from lightkube.resources.storage_v1 import CSINode

from devtools import gobuild
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.process import Child, HarnessError
from tests.cluster_fixtures import unique
from tests.helpers import free_port
from topolvm.constants import LEGACY, NORMAL, Names
from topolvm.k8s import api

pytestmark = pytest.mark.cluster


def full_lv(names: Names, name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{names.group}/v1",
        "kind": "LogicalVolume",
        "metadata": {"name": name, "finalizers": [names.lv_finalizer]},
        "spec": {
            "name": name,
            "nodeName": "node-x",
            "size": "1073741824",
            "deviceClass": "thin",
            "lvcreateOptionClass": "raid1",
            "source": "src-volume",
            "accessType": "rw",
        },
    }


@pytest.mark.parametrize("names", [NORMAL, LEGACY], ids=["topolvm.io", "topolvm.cybozu.com"])
async def test_logicalvolume_round_trips_every_field(
    cluster_client: AsyncClient, names: Names
) -> None:
    res = api.logicalvolume_resource(names)
    name = unique("roundtrip")
    created = api.to_dict(await cluster_client.create(res.from_dict(full_lv(names, name))))
    assert created["spec"] == full_lv(names, name)["spec"]
    status = {
        "volumeID": "0d1e2f",
        "code": 8,
        "message": "no enough space left on VG: free=1, requested=2",
        "currentSize": "1Gi",
    }

    def set_status(obj: dict[str, Any]) -> bool:
        obj["status"] = status
        return True

    stored = await api.modify(cluster_client, res, name, set_status, status=True)
    assert stored is not None and stored["status"] == status
    again = await api.get(cluster_client, res, name)
    assert again is not None
    assert again["spec"] == created["spec"] and again["status"] == status
    # spec writes do not touch status; status writes do not touch spec (status subresource).
    stored = await api.modify(
        cluster_client, res, name, lambda o: bool(o["spec"].update(size="2147483648")) or True
    )
    assert stored is not None and stored["status"] == status
    # The finalizer holds the object in deletion until it is removed.
    await cluster_client.delete(res, name)
    pending = await api.get(cluster_client, res, name)
    assert pending is not None and pending["metadata"].get("deletionTimestamp")
    await api.set_finalizer(cluster_client, res, name, names.lv_finalizer, present=False)
    assert await api.get(cluster_client, res, name) is None


async def test_writes_from_a_stale_object_lose_nothing(cluster_client: AsyncClient) -> None:
    """``known`` saves a read; when it is out of date the write conflicts and is redone on the
    current object, keeping what another writer stored in between."""
    res = api.logicalvolume_resource(NORMAL)
    name = unique("stale")
    created = api.to_dict(await cluster_client.create(res.from_dict(full_lv(NORMAL, name))))

    def label(key: str) -> api.Mutation:
        def mutate(obj: api.Obj) -> bool:
            obj["metadata"]["labels"] = {**(obj["metadata"].get("labels") or {}), key: "y"}
            return True

        return mutate

    fresh = await api.modify(cluster_client, res, name, label("first"), known=created)
    assert fresh is not None and fresh["metadata"]["labels"] == {"first": "y"}  # no conflict
    # ``created`` is now out of date: the second write must not drop the first label
    stored = await api.modify(cluster_client, res, name, label("second"), known=created)
    assert stored is not None and stored["metadata"]["labels"] == {"first": "y", "second": "y"}
    await api.set_finalizer(cluster_client, res, name, "example.com/other", True, known=stored)
    await api.set_finalizer(
        cluster_client,
        res,
        name,
        NORMAL.lv_finalizer,
        False,
        known=stored,  # stale again
    )
    now = await api.get(cluster_client, res, name)
    assert now is not None and now["metadata"]["finalizers"] == ["example.com/other"]
    assert now["metadata"]["labels"] == {"first": "y", "second": "y"}
    await api.set_finalizer(cluster_client, res, name, "example.com/other", False)
    await cluster_client.delete(res, name)
    assert await api.get(cluster_client, res, name) is None


async def test_crd_rejects_a_wrong_type(cluster_client: AsyncClient) -> None:
    res = api.logicalvolume_resource(NORMAL)
    bad = full_lv(NORMAL, unique("badtype"))
    bad["spec"]["size"] = "ten gigabytes"
    with pytest.raises(ApiError) as err:
        await cluster_client.create(res.from_dict(bad))
    assert err.value.status.code == 422
    assert "spec.size" in (err.value.status.message or "")


async def test_simulated_node_is_ready_with_kubelet_labels(
    control_plane: ControlPlane, cluster_client: AsyncClient
) -> None:
    name = unique("simnode")
    control_plane.add_node(name)
    try:
        node = await api.get(cluster_client, Node, name)
        assert node is not None
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == name
        assert node["metadata"]["labels"]["topology.topolvm.io/node"] == name
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"
        assert not node["spec"].get("taints")
        csinode = await api.get(cluster_client, CSINode, name)
        assert csinode is not None
        assert csinode["spec"]["drivers"][0]["topologyKeys"] == ["topology.topolvm.io/node"]
    finally:
        control_plane.kubectl("delete", "node,csinode", name, "--ignore-not-found")


def test_control_plane_components_are_running(control_plane: ControlPlane) -> None:
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        assert control_plane.children[name].running(), name
    version = json.loads(control_plane.kubectl("version", "-o", "json"))
    pinned = gobuild.versions()["k8s.io/kubernetes/cmd/kube-apiserver"]
    assert version["serverVersion"]["gitVersion"] == pinned
    # RBAC is on: a service account without bindings may not list nodes.
    out = control_plane.kubectl(
        "auth", "can-i", "list", "nodes", "--as=system:serviceaccount:default:nobody", check=False
    )
    assert out.strip() == "no"


def test_start_failure_names_the_component_and_shows_its_log(tmp_path: Path) -> None:
    bogus = tmp_path / "etcd"
    bogus.write_text(
        "#!/bin/sh\necho 'etcd: cannot open data dir: permission denied' >&2\nexit 3\n"
    )
    bogus.chmod(0o755)
    with pytest.raises(HarnessError) as err:
        ControlPlane(tmp_path / "cp", {"etcd": bogus}, etcd_port=free_port()).start()
    text = str(err.value)
    assert text.startswith("etcd: exited before healthy (exited with 3)")
    assert "cannot open data dir: permission denied" in text


def test_child_stop_kills_a_process_that_ignores_sigterm(tmp_path: Path) -> None:
    child = Child("stubborn", ["sh", "-c", "trap '' TERM; sleep 600"], tmp_path / "log").start()
    assert child.running()
    child.stop(grace=0.5)
    assert not child.running()

"""topolvm-controller's node cleanup (§8.1) against the real kube-apiserver and
kube-controller-manager: a deleted Node takes its PVCs and LogicalVolumes (setup in
tests/cluster_controllers_helpers.py)."""

# ruff: noqa: F811  (fixtures imported from tests.cluster_controllers_fixtures are parameters
# here)

from __future__ import annotations

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, PersistentVolumeClaim

from tests.cluster_controllers_fixtures import bed, client, no_other_reconcilers  # noqa: F401
from tests.cluster_controllers_helpers import HOLD, LV, Bed, gone, obj_of, rules, store
from tests.cluster_fixtures import unique
from tests.helpers import eventually
from topolvm.constants import NORMAL
from topolvm.controller.nodecleanup import NodeCleanupReconciler

pytestmark = pytest.mark.cluster


async def test_deleted_node_takes_its_pvcs_and_logicalvolumes(
    bed: Bed, client: AsyncClient
) -> None:
    node, other = await bed.node(), unique("elsewhere")
    sc, foreign = await bed.storage_class(), await bed.storage_class("other.example.com")
    selected = await bed.pvc(sc, node)
    immediate = await bed.pvc(sc)  # Immediate binding: no selected-node annotation
    foreign_pvc, other_pvc = await bed.pvc(foreign, node), await bed.pvc(sc, other)
    held = await bed.lv(node, [NORMAL.lv_finalizer, HOLD])
    plain, bare = await bed.lv(node, [NORMAL.lv_finalizer]), await bed.lv(node)
    elsewhere = await bed.lv(other, [NORMAL.lv_finalizer])
    bed.start(NodeCleanupReconciler(client, NORMAL, store(client), bed.metrics).run())

    await bed.admin.delete(Node, node)
    await eventually("Node removed", lambda: gone(bed.admin, Node, node), 30)
    await eventually(
        "PVC deleted", lambda: gone(bed.admin, PersistentVolumeClaim, selected, bed.ns)
    )
    for kept in (immediate, foreign_pvc, other_pvc):
        pvc = await obj_of(bed.admin, PersistentVolumeClaim, kept, bed.ns)
        assert pvc is not None and not pvc["metadata"].get("deletionTimestamp"), kept
    lv = await obj_of(bed.admin, LV, held)
    assert lv is not None and lv["metadata"].get("deletionTimestamp")
    assert lv["metadata"]["annotations"][NORMAL.pending_deletion] == "true"
    assert lv["metadata"]["finalizers"] == [HOLD]
    assert await gone(bed.admin, LV, plain) and await gone(bed.admin, LV, bare)
    kept_lv = await obj_of(bed.admin, LV, elsewhere)
    assert kept_lv is not None and not kept_lv["metadata"].get("deletionTimestamp")
    assert NORMAL.pending_deletion not in (kept_lv["metadata"].get("annotations") or {})
    assert bed.sample("reconciles_total", controller="node", result="ok") >= 1


async def test_skip_node_finalize_only_releases_the_node(bed: Bed, client: AsyncClient) -> None:
    node, sc = await bed.node(), await bed.storage_class()
    pvc, lv = await bed.pvc(sc, node), await bed.lv(node, [NORMAL.lv_finalizer])
    reconciler = NodeCleanupReconciler(client, NORMAL, store(client), skip_node_finalize=True)
    bed.start(reconciler.run())
    await bed.admin.delete(Node, node)
    await eventually("Node removed", lambda: gone(bed.admin, Node, node), 30)
    claim = await obj_of(bed.admin, PersistentVolumeClaim, pvc, bed.ns)
    assert claim is not None and not claim["metadata"].get("deletionTimestamp")
    obj = await obj_of(bed.admin, LV, lv)
    assert obj is not None and not obj["metadata"].get("deletionTimestamp")
    assert obj["metadata"]["finalizers"] == [NORMAL.lv_finalizer]


async def test_failed_cleanup_holds_the_node_and_is_retried(bed: Bed) -> None:
    """Without permission to delete PVCs the Node stays (finalizer kept, errors counted);
    once the permission is granted, the retry (with backoff) completes the cleanup."""
    node, sc = await bed.node(), await bed.storage_class()
    pvc = await bed.pvc(sc, node)
    limited = [r for r in rules() if r["resources"] != ["persistentvolumeclaims"]]
    limited.append({"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["list"]})
    client = bed.sa_client(limited)
    bed.start(NodeCleanupReconciler(client, NORMAL, store(client), bed.metrics).run())
    await bed.admin.delete(Node, node)
    await eventually("failed reconciles",
                     lambda: bed.sample("reconciles_total", controller="node", result="error")
                     >= 2)  # fmt: skip
    obj = await obj_of(bed.admin, Node, node)
    assert obj is not None and NORMAL.node_finalizer in obj["metadata"]["finalizers"]
    role = next(name for kind, name, _ in bed.made if kind == "clusterrole")
    bed.cp.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                  "metadata": {"name": role}, "rules": rules()})  # fmt: skip
    await eventually("Node removed after the retry", lambda: gone(bed.admin, Node, node), 90)
    await eventually("PVC deleted", lambda: gone(bed.admin, PersistentVolumeClaim, pvc, bed.ns))

"""topolvm-controller's PVC reconciler (§8.2) against the real kube-apiserver and
kube-controller-manager: deprecated finalizers, and pods nudged for a pending filesystem
resize (setup in tests/cluster_controllers_helpers.py)."""

# ruff: noqa: F811  (fixtures imported from tests.cluster_controllers_fixtures are parameters
# here)

from __future__ import annotations

import asyncio
import re

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolumeClaim, Pod
from lightkube.types import PatchType

from tests.cluster_controllers_fixtures import bed, client, no_other_reconcilers  # noqa: F401
from tests.cluster_controllers_helpers import HOLD, Bed, gone, obj_of
from tests.helpers import eventually
from topolvm.constants import NORMAL, RESIZEFS_REQUESTED_AT
from topolvm.controller.pvcresize import PersistentVolumeClaimReconciler, parse_rfc3339
from topolvm.k8s import api

pytestmark = pytest.mark.cluster


async def test_deprecated_pvc_finalizers_are_removed(bed: Bed, client: AsyncClient) -> None:
    sc = await bed.storage_class()
    old = ["topolvm.io/pvc", "topolvm.cybozu.com/pvc"]
    live = await bed.pvc(sc, finalizers=[*old, HOLD])
    deleting = await bed.pvc(sc, finalizers=["topolvm.io/pvc"])
    await bed.admin.delete(PersistentVolumeClaim, deleting, namespace=bed.ns)
    bed.start(PersistentVolumeClaimReconciler(client, NORMAL, bed.metrics).run())

    async def cleaned() -> bool:
        obj = await obj_of(bed.admin, PersistentVolumeClaim, live, bed.ns)
        return not set(old) & set(api.finalizers(obj))

    await eventually("deprecated finalizers removed", cleaned)
    obj = await obj_of(bed.admin, PersistentVolumeClaim, live, bed.ns)
    assert HOLD in api.finalizers(obj) and not obj["metadata"].get("deletionTimestamp")
    await eventually("deleted PVC released",
                     lambda: gone(bed.admin, PersistentVolumeClaim, deleting, bed.ns))  # fmt: skip


async def set_resize_pending(bed: Bed, pvc: str, since: str) -> None:
    cond = {
        "type": "FileSystemResizePending",
        "status": "True",
        "lastTransitionTime": since,
        "message": "Waiting for user to (re-)start a pod to finish file system resize",
    }
    await bed.admin.patch(PersistentVolumeClaim.Status, pvc, {"status": {"conditions": [cond]}},
                          namespace=bed.ns, patch_type=PatchType.MERGE)  # fmt: skip


async def annotation(bed: Bed, pod: str) -> str | None:
    obj = await obj_of(bed.admin, Pod, pod, bed.ns)
    value = (obj["metadata"].get("annotations") or {}).get(RESIZEFS_REQUESTED_AT)
    return None if value is None else str(value)


async def test_resize_pending_nudges_pods_using_the_claim(bed: Bed, client: AsyncClient) -> None:
    sc, foreign = await bed.storage_class(), await bed.storage_class("other.example.com")
    claim, other_claim = await bed.pvc(sc), await bed.pvc(foreign)
    user, stranger = await bed.pod(claim), await bed.pod()
    stale = await bed.pod(claim, {RESIZEFS_REQUESTED_AT: "2001-01-01T00:00:00.5Z"})
    future = "2999-01-01T00:00:00.123456789Z"
    recent = await bed.pod(claim, {RESIZEFS_REQUESTED_AT: future})
    foreign_user = await bed.pod(other_claim)
    bed.start(PersistentVolumeClaimReconciler(client, NORMAL, bed.metrics).run())
    since = "2020-06-01T12:00:00Z"
    await set_resize_pending(bed, claim, since)
    await set_resize_pending(bed, other_claim, since)

    first = await eventually("pod annotated", lambda: annotation(bed, user))
    stamp = parse_rfc3339(first)
    assert stamp is not None and stamp > (parse_rfc3339(since) or 0), first
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d*[1-9])?Z", first), (
        first
    )  # RFC3339Nano

    async def renewed() -> bool:
        return await annotation(bed, stale) not in (None, "2001-01-01T00:00:00.5Z")

    await eventually("stale annotation renewed", renewed)
    assert await annotation(bed, recent) == future
    assert await annotation(bed, stranger) is None and await annotation(bed, foreign_user) is None
    # Another event on the claim (a label) does not nudge again for the same resize.
    await bed.admin.patch(PersistentVolumeClaim, claim, {"metadata": {"labels": {"x": "y"}}},
                          namespace=bed.ns, patch_type=PatchType.MERGE)  # fmt: skip
    await asyncio.sleep(1.5)
    assert await annotation(bed, user) == first

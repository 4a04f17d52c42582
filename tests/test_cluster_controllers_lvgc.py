"""topolvm-controller's LogicalVolume garbage collector against the real kube-apiserver and
kube-controller-manager: off, dry-run and delete modes, snapshots, the grace period (setup
in tests/cluster_controllers_helpers.py)."""

# ruff: noqa: F811  (fixtures imported from tests.cluster_controllers_fixtures are parameters
# here)

from __future__ import annotations

import asyncio
import logging

import pytest
from lightkube import AsyncClient
from lightkube.generic_resource import create_global_resource
from lightkube.resources.core_v1 import PersistentVolume
from lightkube.types import PatchType

from devtools import gobuild
from devtools.testbed.controlplane import ControlPlane
from tests.cluster_controllers_fixtures import bed, client, no_other_reconcilers  # noqa: F401
from tests.cluster_controllers_helpers import LV, Bed, P, gone, obj_of, store
from tests.cluster_fixtures import unique
from tests.helpers import eventually
from topolvm.constants import NORMAL
from topolvm.controller.lvgc import LogicalVolumeGC, VolumeSnapshotContent

pytestmark = pytest.mark.cluster

NOT_INSTALLED = create_global_resource("snapshot.invalid", "v1", "Nothing", "nothings")


async def pv_for(bed: Bed, handle: str, driver: str = P) -> str:
    name = unique("pv")
    spec = {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
            "csi": {"driver": driver, "volumeHandle": handle}}  # fmt: skip
    await bed.create(PersistentVolume, {"metadata": {"name": name}, "spec": spec}, "pv")
    return name


async def test_gc_off_never_deletes(bed: Bed, client: AsyncClient) -> None:
    orphan = await bed.lv("gc-nowhere", volume_id=unique("vid"))
    gc = LogicalVolumeGC(client, NORMAL, store(client), bed.metrics, grace=0, interval=0.05)
    await asyncio.wait_for(gc.run(), 5)  # "off" returns at once
    assert await obj_of(bed.admin, LV, orphan) is not None
    assert bed.sample("gc_orphan_logicalvolumes") == 0


async def test_gc_dry_run_reports_orphans_only(
    bed: Bed, client: AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    orphan, bound_id = await bed.lv("gc-nowhere", volume_id=unique("vid")), unique("vid")
    bound = await bed.lv("gc-nowhere", volume_id=bound_id)
    await pv_for(bed, bound_id)
    foreign_id = unique("vid")
    foreign = await bed.lv("gc-nowhere", volume_id=foreign_id)
    await pv_for(bed, foreign_id, driver="other.example.com")
    # Without the snapshot API, snapshot LVs (accessType ro) are never orphans.
    snap = await bed.lv("gc-nowhere", volume_id=unique("vid"), access_type="ro", source=bound)
    gc = LogicalVolumeGC(client, NORMAL, store(client), bed.metrics, mode="dry-run", grace=1,
                         interval=0.2, snapshot_contents=NOT_INSTALLED)  # fmt: skip
    with caplog.at_level(logging.INFO, logger="topolvm.controller"):
        bed.start(gc.run())
        await eventually("orphans found", lambda: {orphan, foreign} <= set(gc.orphans), 20)
    assert bound not in gc.orphans and snap not in gc.orphans
    assert bed.sample("gc_orphan_logicalvolumes") == len(gc.orphans)
    for name in (orphan, bound, foreign, snap):
        assert await obj_of(bed.admin, LV, name) is not None, name
    logged = [r for r in caplog.records if "dry run" in r.getMessage()]
    assert {getattr(r, "lv", "") for r in logged} >= {orphan, foreign}
    assert bed.sample("gc_deleted_logicalvolumes_total") == 0


def install_snapshot_crds(cp: ControlPlane) -> None:
    crds = gobuild.ensure("snapshot-crds")["snapshot-crds"]
    for f in sorted(crds.glob("snapshot.storage.k8s.io_*.yaml")):
        cp.kubectl("apply", "--server-side", "-f", str(f))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
               "crd/volumesnapshotcontents.snapshot.storage.k8s.io")  # fmt: skip


async def snapshot_content(bed: Bed, handle: str, pre_provisioned: bool) -> None:
    name = unique("vsc")
    source = {"snapshotHandle": handle} if pre_provisioned else {"volumeHandle": "some-volume"}
    spec = {"deletionPolicy": "Retain", "driver": P, "source": source,
            "volumeSnapshotRef": {"name": "snap", "namespace": bed.ns}}  # fmt: skip
    obj = {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
           "metadata": {"name": name}, "spec": spec}  # fmt: skip
    await bed.create(VolumeSnapshotContent, obj, "volumesnapshotcontent")
    if not pre_provisioned:
        await bed.admin.patch(VolumeSnapshotContent.Status, name,
                              {"status": {"snapshotHandle": handle, "readyToUse": True}},
                              patch_type=PatchType.MERGE)  # fmt: skip


async def test_gc_delete_collects_only_orphans_seen_twice(bed: Bed, client: AsyncClient) -> None:
    install_snapshot_crds(bed.cp)
    ids = {k: unique("vid") for k in ("orphan", "bound", "snap1", "snap2", "snap3", "late")}
    lvs = {k: await bed.lv("gc-nowhere", volume_id=v,
                           access_type="ro" if k.startswith("snap") else "")
           for k, v in ids.items()}  # fmt: skip
    await pv_for(bed, ids["bound"])
    await snapshot_content(bed, ids["snap1"], pre_provisioned=False)
    await snapshot_content(bed, ids["snap2"], pre_provisioned=True)
    creating = await bed.lv("gc-nowhere", source=lvs["orphan"])  # being created from "orphan"
    gc = LogicalVolumeGC(client, NORMAL, store(client), bed.metrics, mode="delete", grace=1)
    await asyncio.sleep(2.1)  # every LV is past the grace period now

    assert not set(lvs.values()) & set(await gc.scan())  # first sighting: nothing deleted
    await pv_for(bed, ids["late"])  # referenced from the second scan on
    orphans = set(await gc.scan())
    assert {lvs["snap3"], creating} <= orphans
    assert not {lvs["orphan"], lvs["bound"], lvs["snap1"], lvs["snap2"], lvs["late"]} & orphans
    for key in ("orphan", "bound", "snap1", "snap2", "late"):
        assert await obj_of(bed.admin, LV, lvs[key]) is not None, key
    assert await gone(bed.admin, LV, lvs["snap3"]) and await gone(bed.admin, LV, creating)
    # Its dependant gone, "orphan" is an orphan after two more scans.
    assert lvs["orphan"] not in await gc.scan()
    assert lvs["orphan"] in await gc.scan()
    assert await gone(bed.admin, LV, lvs["orphan"])
    assert bed.sample("gc_deleted_logicalvolumes_total") >= 3


async def test_gc_spares_young_logicalvolumes(bed: Bed, client: AsyncClient) -> None:
    gc = LogicalVolumeGC(client, NORMAL, store(client), bed.metrics, mode="delete", grace=4,
                         interval=0.2)  # fmt: skip
    bed.start(gc.run())
    young = await bed.lv("gc-nowhere")  # still being created: no volume id yet
    await asyncio.sleep(2)
    assert await obj_of(bed.admin, LV, young) is not None
    await eventually("old orphan deleted", lambda: gone(bed.admin, LV, young), 20)

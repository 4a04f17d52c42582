"""Device classes, lvcreate option classes, thin provisioning, snapshots and clones through
the whole driver (spec §13: multiple-vg, lvcreate-options, thin-provisioning,
thin-snapshot-restore, thin-volume-cloning), on one UML node with three VGs' worth of disks:

- vg1 (10 GiB, disk 0): ``ssd`` (thick, default, 1 GiB spare) and ``thin`` (pool0, 4 GiB, ratio 5)
- vg2 (two 3 GiB PVs, disks 1 and 2): ``raid`` (lvcreate-options ``--type=raid1 -m1``)
- vg3 (two 3 GiB PVs, disks 3 and 4): ``hdd`` (thick, no spare); option class ``raid1``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import unique
from tests.helpers import eventually
from tests.lvm_fixtures import THICK, THIN
from tests.provisioning import (
    NS,
    GiB,
    Scenario,
    bound,
    claim,
    events_for,
    pod,
    pvc,
    scheduled,
    shared_nodes,
)
from topolvm.k8s import api

pytestmark = pytest.mark.cluster

HDD = {"name": "hdd", "volume-group": "vg3", "spare-gb": 0}
RAID = {"name": "raid", "volume-group": "vg2", "spare-gb": 0,
        "lvcreate-options": ["--type=raid1", "-m1"]}  # fmt: skip
OPTION_CLASSES = [{"name": "raid1", "options": ["--type=raid1", "-m1"]}]
SNAPSHOT = {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot"}


def _prepare(node: UmlNode) -> None:
    node.lvm("lvcreate", "-T", "vg1/pool0", "-L", "4g")
    for vg, devs in (("vg2", node.disk_devices[1:3]), ("vg3", node.disk_devices[3:5])):
        for dev in devs:
            node.lvm("pvcreate", "-ff", "-y", "--setphysicalvolumesize", f"{3 * GiB}b", dev)
        node.lvm("vgcreate", "-s", "4m", vg, *devs)
    node.lvmd_options = {"lvcreate-option-classes": OPTION_CLASSES}


@pytest.fixture(scope="module")
def classes_node(
    control_plane: ControlPlane, driver: DriverStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[UmlNode]]:
    with shared_nodes(
        control_plane, tmp_path_factory.mktemp("dc"), "dc", [10], [THICK, THIN, HDD, RAID],
        disks=5, prepare=_prepare,
    ) as nodes:  # fmt: skip
        yield nodes


@pytest.fixture
async def one(
    control_plane: ControlPlane,
    classes_node: list[UmlNode],
    cluster_client: AsyncClient,
) -> AsyncIterator[Scenario]:
    s = Scenario(control_plane, cluster_client, classes_node)
    await s.record()
    try:
        yield s
    finally:
        await s.clean()
        node = classes_node[0]
        assert set(node.lvs("vg1")) == {"pool0"}, node.lvs("vg1")
        assert node.lvs("vg2") == {} and node.lvs("vg3") == {}


def _lv(node: UmlNode, vg: str, volume_id: str) -> dict[str, str]:
    lvs = node.lvs(vg)
    assert volume_id in lvs, f"{volume_id} not in {vg}: {sorted(lvs)}"
    return lvs[volume_id]


async def _volume_id(s: Scenario, claim_name: str) -> str:
    obj = await bound(s.client, claim_name)
    pv = await api.get(s.client, PersistentVolume, obj["spec"]["volumeName"])
    assert pv is not None
    return str(pv["spec"]["csi"]["volumeHandle"])


async def test_each_device_class_lands_in_its_volume_group(one: Scenario) -> None:
    s = one
    node = s.nodes[0]
    ssd, hdd, default = s.sc(), s.sc(device_class="hdd"), s.sc(device_class=None)
    a, b, c = unique("ssd"), unique("hdd"), unique("dflt")
    s.apply(claim(a, ssd, "1Gi"), claim(b, hdd, "1Gi"), claim(c, default, "1Gi"))
    app = unique("app")
    s.apply(pod(app, s.group, [a, b, c]))
    await scheduled(s.client, app)
    _lv(node, "vg1", await _volume_id(s, a))
    _lv(node, "vg3", await _volume_id(s, b))
    _lv(node, "vg1", await _volume_id(s, c))  # the default class is ssd


async def test_lvcreate_options_and_option_classes_make_raid1(one: Scenario) -> None:
    s = one
    node = s.nodes[0]
    by_class = s.sc(device_class="raid", binding="Immediate")
    by_option = s.sc(device_class="hdd", binding="Immediate",
                     extra={"topolvm.io/lvcreate-option-class": "raid1"})  # fmt: skip
    a, b = unique("raid"), unique("opt")
    s.apply(claim(a, by_class, "512Mi"), claim(b, by_option, "512Mi"))
    assert _lv(node, "vg2", await _volume_id(s, a))["lv_attr"][0] == "r"
    assert _lv(node, "vg3", await _volume_id(s, b))["lv_attr"][0] == "r"


async def test_thin_overprovisioning_and_its_limit(one: Scenario) -> None:
    s = one
    node = s.nodes[0]
    thin = s.sc(device_class="thin", binding="Immediate")
    # pool0 is 4 GiB with ratio 5: 20 GiB of thin volumes fit, more than the pool holds
    claims = [unique("thin") for _ in range(4)]
    s.apply(*(claim(c, thin, "5Gi") for c in claims))
    for c in claims:
        lv = _lv(node, "vg1", await _volume_id(s, c))
        assert lv["pool_lv"] == "pool0"
    extra = unique("over")
    s.apply(claim(extra, thin, "1Gi"))

    async def refused() -> str | None:
        for e in await events_for(s.client, "PersistentVolumeClaim", extra):
            if "ResourceExhausted" in e or "RESOURCE_EXHAUSTED" in e:
                return e
        return None

    await eventually("the claim past the thin limit refused", refused, timeout=90)
    obj = await pvc(s.client, extra)
    assert obj is not None and obj["status"]["phase"] == "Pending"


def _snapshot_class(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshotClass",
        "metadata": {"name": name},
        "driver": "topolvm.io",
        "deletionPolicy": "Delete",
    }


async def _ready_snapshot(s: Scenario, name: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        out = s.cp.kubectl("get", "volumesnapshot", name, "-n", NS, "-o", "json", check=False)
        if not out.strip():
            return None
        obj: dict[str, Any] = json.loads(out)
        return obj if (obj.get("status") or {}).get("readyToUse") else None

    result: dict[str, Any] = await eventually(f"snapshot {name} ready", check, timeout=120)
    return result


async def test_thin_snapshot_restores_and_clone_outlive_their_source(one: Scenario) -> None:
    s = one
    node = s.nodes[0]
    thin = s.sc(device_class="thin", fs_type="xfs", binding="Immediate")
    vsc = unique("vsc")
    s.apply(_snapshot_class(vsc))
    src, app = unique("src"), unique("app")
    s.apply(claim(src, thin, "1Gi"), pod(app, s.group, [src]))
    await scheduled(s.client, app)
    [fs] = await s.running(app)
    s.exec(app, f"echo snap > /{src}/file && sync")

    snap = unique("snap")
    s.apply({**SNAPSHOT, "metadata": {"name": snap, "namespace": NS},
             "spec": {"volumeSnapshotClassName": vsc,
                      "source": {"persistentVolumeClaimName": src}}})  # fmt: skip
    ready = await _ready_snapshot(s, snap)
    restore_size = ready["status"]["restoreSize"]
    source = {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": snap}
    equal, larger, clone = unique("eq"), unique("big"), unique("clone")
    s.apply(
        claim(equal, thin, restore_size, source=source),
        claim(larger, thin, "2Gi", source=source),
        claim(clone, thin, "1Gi", source={"kind": "PersistentVolumeClaim", "name": src}),
    )
    ids = {c: await _volume_id(s, c) for c in (equal, larger, clone)}
    for volume_id in ids.values():
        assert _lv(node, "vg1", volume_id)["pool_lv"] == "pool0"
    big = await pvc(s.client, larger)
    assert big is not None
    assert int(_lv(node, "vg1", ids[larger])["lv_size"]) >= 2 * GiB

    # standalone: the source, its pod and the snapshot go; the copies stay and keep the data
    await s.delete_pod(app)
    s.cp.kubectl("delete", "volumesnapshot", snap, "-n", NS, check=False)
    s.cp.kubectl("delete", "pvc", src, "-n", NS, check=False)

    async def source_gone() -> bool:
        return fs.volume_id not in node.lvs("vg1")

    await eventually("the source LV removed", source_gone, timeout=90)
    reader = unique("reader")
    s.apply(pod(reader, s.group, [equal, larger, clone]))
    await scheduled(s.client, reader)
    await s.running(reader)
    for c in (equal, larger, clone):
        assert s.exec(reader, f"cat /{c}/file") == "snap\n", c
    df = int(s.exec(reader, f"df -k /{larger} | tail -1").split()[-5]) * 1024
    assert df > GiB + GiB // 2  # the larger restore's filesystem was grown on publish

"""What the node-to-node copy's cluster tests share: a workload's data (random bytes and a
filesystem tree) written by a pod on one node and checksummed, read back by a pod on another;
snapshot classes and snapshots; the copy's state in LogicalVolume status and node metrics."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from devtools.testbed.umlnode import UmlNode
from tests import provisioning
from tests.cluster_fixtures import unique
from tests.helpers import eventually
from tests.provisioning import NS, Scenario, pod
from topolvm.k8s import api
from topolvm.k8s.lvobject import LogicalVolumeObject

SNAPSHOT = {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot"}
MiB = 1 << 20

# random bytes, then a small tree of directories and files, all checksummed; the sums of
# every file but themselves, sorted, are what a reader on another node must reproduce
WRITE = (
    "set -e; cd /{claim}; dd if=/dev/urandom of=random bs=1M count={mib} 2>/dev/null; "
    "mkdir -p tree/a/b tree/c; for i in 1 2 3 4 5; do echo file $i > tree/a/f$i; "
    "head -c 70000 /dev/urandom > tree/c/r$i; done; ln -s ../c/r1 tree/a/b/link; sync"
)
SUMS = "cd /{claim} && find . -type f ! -name lost+found | sort | xargs sha256sum && ls -l tree/a/b"


def on_node(name: str, group: str, node: str, claims: list[str], **kw: Any) -> dict[str, Any]:
    """A busybox pod with ``claims`` mounted, that only ``node`` may run."""
    p = pod(name, group, claims, **kw)
    p["spec"]["nodeSelector"]["kubernetes.io/hostname"] = node
    return p


def write_data(s: Scenario, pod_name: str, claim: str, mib: int) -> str:
    """Write ``mib`` MiB of random bytes and a tree into the claim; its checksums."""
    s.exec(pod_name, WRITE.format(claim=claim, mib=mib))
    return read_sums(s, pod_name, claim)


def read_sums(s: Scenario, pod_name: str, claim: str) -> str:
    return s.exec(pod_name, SUMS.format(claim=claim))


def snapshot_class(name: str, parameters: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
            "metadata": {"name": name}, "driver": "topolvm.io", "deletionPolicy": "Delete",
            "parameters": parameters or {}}  # fmt: skip


def snapshot(name: str, vsc: str, claim: str) -> dict[str, Any]:
    return {**SNAPSHOT, "metadata": {"name": name, "namespace": NS},
            "spec": {"volumeSnapshotClassName": vsc,
                     "source": {"persistentVolumeClaimName": claim}}}  # fmt: skip


def from_snapshot(name: str) -> dict[str, str]:
    return {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": name}


def from_claim(name: str) -> dict[str, str]:
    return {"kind": "PersistentVolumeClaim", "name": name}


async def ready_snapshot(s: Scenario, name: str, timeout: float = 240) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        out = s.cp.kubectl("get", "volumesnapshot", name, "-n", NS, "-o", "json", check=False)
        if not out.strip():
            return None
        obj: dict[str, Any] = json.loads(out)
        return obj if (obj.get("status") or {}).get("readyToUse") else None

    def details() -> str:
        return s.cp.kubectl("describe", "volumesnapshot", name, "-n", NS, check=False)[-2000:]

    result: dict[str, Any] = await eventually(
        f"snapshot {name} ready", check, timeout=timeout, details=details
    )
    return result


@dataclass(frozen=True)
class Snapshotted:
    claim: str  # the source claim, written on its node
    writer: str  # the pod that wrote it (still running there)
    sums: str  # read_sums of what it wrote
    snapshot: str
    ready: dict[str, Any]  # the VolumeSnapshot, readyToUse


async def snapshotted(
    s: Scenario,
    sc: str,
    node: str,
    size: str,
    mib: int,
    snapshot_params: dict[str, str] | None = None,
) -> Snapshotted:
    """A claim of ``size`` of StorageClass ``sc`` on ``node``, ``mib`` MiB written into it by a
    pod that stays there, and a ready VolumeSnapshot of it in a class of its own (with
    ``snapshot_params``)."""
    vsc, src, writer, snap = unique("vsc"), unique("src"), unique("writer"), unique("snap")
    s.apply(snapshot_class(vsc, snapshot_params))
    s.apply(provisioning.claim(src, sc, size), on_node(writer, s.group, node, [src]))
    await s.running(writer)
    sums = write_data(s, writer, src, mib=mib)
    s.apply(snapshot(snap, vsc, src))
    return Snapshotted(src, writer, sums, snap, await ready_snapshot(s, snap))


async def logical_volume_of(s: Scenario, handle: str) -> LogicalVolumeObject:
    """The LogicalVolume whose volume id is ``handle``."""
    items, _ = await api.list_all(s.client, api.logicalvolume_resource(s.names))
    found = [o for o in items if (o.get("status") or {}).get("volumeID") == handle]
    assert len(found) == 1, f"volume id {handle}: {[o['metadata']['name'] for o in found]}"
    return LogicalVolumeObject.from_dict(found[0])


def metric(node: UmlNode, name: str, **labels: str) -> float:
    """A sample of topolvm-node's /metrics on ``node`` (0 when absent)."""
    text = node.http_get(8080, "/metrics")
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if m and all(part in m.group(1).split(",") for part in want.split(",") if part):
            total += float(m.group(2))
    return total

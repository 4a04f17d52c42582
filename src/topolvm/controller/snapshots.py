"""CreateSnapshot's work: where a snapshot lives and when it is ready (docs/mobility.md).

A thin volume's snapshot is a thin snapshot on its node, ready at once. A thick volume's is an
independent LV on its node, filled from a short-lived COW cut: the snapshot has its id from the
start and is ready (``ready_to_use``) once the copy is verified; csi-snapshotter asks again
until then. A VolumeSnapshotClass may keep the snapshot on another node (``copies.Placement``),
filled by a copy from the source's node: it survives that node.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime

from topolvm.constants import Names
from topolvm.controller import copies
from topolvm.controller.ledger import CapacityLedger, NodeView
from topolvm.k8s.lvobject import LogicalVolumeObject
from topolvm.k8s.lvstore import LogicalVolumeStore, VolumeRequest
from topolvm.proto import csi_pb2 as csi
from topolvm.rpc import status

# how long CreateSnapshot waits for a copy to fill the snapshot before it answers "not ready yet"
# (csi-snapshotter asks again: its default timeout is a minute)
SNAPSHOT_WAIT = 20.0


def _timestamp(text: str) -> int | None:
    """An RFC 3339 creationTimestamp as seconds since the epoch."""
    try:
        return int(datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return None


class Snapshots:
    def __init__(
        self, names: Names, store: LogicalVolumeStore, nodes: NodeView, ledger: CapacityLedger
    ) -> None:
        self.names = names
        self.store = store
        self.nodes = nodes
        self.ledger = ledger

    async def create(
        self, request: csi.CreateSnapshotRequest, name: str, where: copies.Placement
    ) -> csi.Snapshot:
        """The snapshot ``name`` of the request's source (made now, or found from before);
        the caller holds the name's lock."""
        src = await self.store.find_by_volume_id(request.source_volume_id)
        if src is None:
            raise status.NotFound(f"source volume {request.source_volume_id} is not found")
        size = src.current_size or src.size
        await self.store.create(await self._request(request, name, src, size, where))
        # the LV exists (its id is the snapshot's); a copy may still fill it: ready later
        lv = await self.store.wait_created(name, filled=False)
        with contextlib.suppress(TimeoutError):
            lv = await asyncio.wait_for(self.store.wait_created(name), SNAPSHOT_WAIT)
        snapshot = csi.Snapshot(
            size_bytes=lv.current_size or size,
            snapshot_id=lv.volume_id,
            source_volume_id=request.source_volume_id,
            ready_to_use=lv.copy_done,
        )
        created = _timestamp(lv.created)
        if created is None:
            snapshot.creation_time.GetCurrentTime()
            snapshot.creation_time.nanos = 0
        else:  # the same on every call for the same snapshot
            snapshot.creation_time.seconds = created
        return snapshot

    async def _request(
        self, request: csi.CreateSnapshotRequest, name: str, src: LogicalVolumeObject, size: int,
        where: copies.Placement,
    ) -> VolumeRequest:  # fmt: skip
        """On the source's node (its node makes a thin snapshot, or copies a thick volume), or
        on another one that the class chooses, filled by a copy."""
        waiting = copies.waiting_object(request.parameters, copies.SNAPSHOT_NAME,
                                        copies.SNAPSHOT_NAMESPACE)  # fmt: skip
        annotations = ((self.names.snapshot_annotation, waiting),) if waiting else ()
        dc = src.device_class
        if not where.off_node:
            return VolumeRequest(name, src.node_name, size, dc, "", src.name, "ro",
                                 annotations=annotations)  # fmt: skip
        existing = await self.store.get(name)
        node = existing.node_name if existing is not None else None
        if node is None:
            names = self.nodes.names()
            free = {n: self.ledger.free_bytes(n, dc) for n in names
                    if self.ledger.annotation(n, dc) is not None}  # fmt: skip
            labels = {n: self.nodes.labels(n) or {} for n in names}
            node = copies.snapshot_node(where, src.node_name, free, labels, size)
        if node is None:
            raise status.ResourceExhausted(
                f"no node but the source's ({src.node_name}) has {size} bytes free in device "
                f"class {dc!r} for the snapshot, on {where.describe()}"
            )
        return VolumeRequest(name, node, size, dc, access_type="ro", copy_source=src.name,
                             annotations=annotations)  # fmt: skip

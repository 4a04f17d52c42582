"""Opt-in garbage collector for LogicalVolumes nothing references (not in upstream, whose
limitations.md asks operators to find such orphans by hand: external-provisioner can lose a
DeleteVolume when a PVC is created and deleted in quick succession, and the LV stays).

A LogicalVolume is *referenced* when
- a PersistentVolume has ``spec.csi.driver == <p>`` and ``spec.csi.volumeHandle ==
  status.volumeID`` (the CSI volume id is the LV's UID), or
- a VolumeSnapshotContent (``snapshot.storage.k8s.io/v1``) has ``status.snapshotHandle`` (or
  ``spec.source.snapshotHandle``, for pre-provisioned snapshots) == ``status.volumeID``. When
  that API is not installed or cannot be read, snapshots are *unknown* and no LogicalVolume with
  ``spec.accessType: ro`` (a snapshot) is ever collected, or
- it is the ``spec.source`` of a LogicalVolume whose node has not created it yet, or the
  source of a copy in progress (docs/mobility.md), or
- a copy is still filling it (its PersistentVolume or VolumeSnapshotContent comes after), or
  it is a move's target between its pre-copy and its final copy.

An *orphan* is a LogicalVolume that is not being deleted, was created more than ``grace``
seconds ago (``metadata.creationTimestamp``; this also spares volumes still being created, whose
``status.volumeID`` is empty) and was unreferenced on two consecutive scans (state kept by
UID). Each scan lists LogicalVolumes first and references second, so a reference made after the
list is seen.

Modes: ``off`` does nothing; ``dry-run`` logs each orphan and sets the gauge
``topolvm_controller_gc_orphan_logicalvolumes``; ``delete`` also deletes them (the node's
finalizer then removes the LV) and counts ``topolvm_controller_gc_deleted_logicalvolumes_total``.
Runs only on the leader; the two-scan state starts afresh each time :meth:`run` starts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume

from topolvm.constants import Names
from topolvm.controller.metrics import ControllerMetrics
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import InvalidQuantity, LogicalVolumeObject
from topolvm.k8s.lvstore import LogicalVolumeStore

log = logging.getLogger(__name__)

CONTROLLER_NAME = "logicalvolume-gc"
DEFAULT_GRACE = 3600.0
DEFAULT_INTERVAL = 600.0

VolumeSnapshotContent = api.VolumeSnapshotContent


class GcMode(StrEnum):
    OFF = "off"
    DRY_RUN = "dry-run"
    DELETE = "delete"


def _created_at(obj: api.Obj) -> float | None:
    stamp = str((obj.get("metadata") or {}).get("creationTimestamp") or "")
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass
class References:
    """What refers to LogicalVolumes right now (volume ids); ``snapshots`` None = unknown."""

    volumes: set[str] = field(default_factory=set)
    snapshots: set[str] | None = None
    pending_sources: set[str] = field(default_factory=set)  # LV names

    def holds(self, lv: LogicalVolumeObject) -> str | None:
        """Why ``lv`` must be kept, or None when nothing refers to it."""
        if lv.volume_id and lv.volume_id in self.volumes:
            return "PersistentVolume"
        if self.snapshots is None and lv.access_type == "ro":
            return "snapshot references unknown"
        if self.snapshots is not None and lv.volume_id and lv.volume_id in self.snapshots:
            return "VolumeSnapshotContent"
        if lv.name in self.pending_sources:
            return "source of a volume being created"
        if not lv.copy_done and not lv.code:
            return "a copy is filling it"  # its PV or content comes once the copy is verified
        if lv.copy_keep_cut and lv.copy_round < 2 and not lv.code:
            return "a move fills it"  # its final copy comes when the pod stops, then its PV
        return None


class LogicalVolumeGC:
    """Periodic orphan scan. Start :meth:`run` as a task on the leader; cancel it to stop.
    In mode ``off`` :meth:`run` returns at once."""

    def __init__(
        self,
        client: AsyncClient,
        names: Names,
        volumes: LogicalVolumeStore,
        metrics: ControllerMetrics | None = None,
        *,
        mode: GcMode | str = GcMode.OFF,
        grace: float = DEFAULT_GRACE,
        interval: float = DEFAULT_INTERVAL,
        snapshot_contents: api.Resource = VolumeSnapshotContent,
        clock: Callable[[], float] = time.time,
    ):
        self.client = client
        self.names = names
        self.volumes = volumes
        self.metrics = metrics
        self.mode = GcMode(mode)
        self.grace = grace
        self.interval = interval
        self.snapshot_contents = snapshot_contents
        self.clock = clock
        self._unreferenced: set[str] = set()  # UIDs unreferenced on the previous scan
        self.orphans: list[str] = []  # names of the orphans found by the last scan

    async def run(self) -> None:
        if self.mode is GcMode.OFF:
            log.debug("LogicalVolume garbage collector is off")
            return
        self._unreferenced = set()
        log.info(
            "LogicalVolume garbage collector started",
            extra={"mode": str(self.mode), "grace_seconds": self.grace,
                   "interval_seconds": self.interval},
        )  # fmt: skip
        try:
            while True:
                try:
                    await self.scan()
                    self._count("ok")
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    self._count("error")
                    log.warning(
                        f"LogicalVolume garbage collection scan failed: {kube.describe(e)}",
                        extra={"retry_in": self.interval},
                        exc_info=not isinstance(e, kube.KubeError),
                    )
                await asyncio.sleep(self.interval)
        finally:
            # Only the leader scans: a replica that stopped must not show stale orphans.
            self.orphans = []
            if self.metrics is not None:
                self.metrics.gc_candidates.set(0)

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.reconciles.labels(controller=CONTROLLER_NAME, result=result).inc()

    # -- one scan -----------------------------------------------------------------------------
    async def scan(self) -> list[str]:
        """One pass: find orphans, log them and (mode ``delete``) delete them. Returns the
        names of the orphans found (deleted or not)."""
        items, _ = await api.list_all(self.client, self.volumes.resource)
        refs = await self._references(items)
        now = self.clock()
        unreferenced: dict[str, LogicalVolumeObject] = {}
        for obj in items:
            lv = self._candidate(obj, refs, now)
            if lv is not None:
                unreferenced[lv.uid] = lv
        confirmed = [lv for uid, lv in unreferenced.items() if uid in self._unreferenced]
        for uid in unreferenced.keys() - self._unreferenced:
            lv = unreferenced[uid]
            log.info(
                "LogicalVolume is unreferenced; an orphan if still so on the next scan",
                extra={"lv": lv.name, "uid": uid, "volume_id": lv.volume_id, "node": lv.node_name},
            )
        self._unreferenced = set(unreferenced)
        self.orphans = sorted(lv.name for lv in confirmed)
        if self.metrics is not None:
            self.metrics.gc_candidates.set(len(confirmed))
        for lv in confirmed:
            await self._collect(lv)
        return self.orphans

    def _candidate(self, obj: api.Obj, refs: References, now: float) -> LogicalVolumeObject | None:
        try:
            lv = LogicalVolumeObject.from_dict(obj)
        except (InvalidQuantity, KeyError, TypeError, ValueError):
            return None  # the node logs malformed objects; never delete what we cannot read
        if lv.deleting or not lv.uid:
            return None
        created = _created_at(obj)
        if created is None or now - created < self.grace:
            return None
        if refs.holds(lv) is not None:
            return None
        return lv

    async def _references(self, items: list[api.Obj]) -> References:
        refs = References()
        pvs, _ = await api.list_all(self.client, PersistentVolume)
        for pv in pvs:
            csi = (pv.get("spec") or {}).get("csi") or {}
            if csi.get("driver") == self.names.plugin and csi.get("volumeHandle"):
                refs.volumes.add(str(csi["volumeHandle"]))
        refs.snapshots = await self._snapshot_handles()
        for obj in items:
            spec, status = obj.get("spec") or {}, obj.get("status") or {}
            deleting = (obj.get("metadata") or {}).get("deletionTimestamp")
            if spec.get("source") and not status.get("volumeID") and not deleting:
                refs.pending_sources.add(str(spec["source"]))
            copy = status.get("copy") or {}
            reading = (spec.get("copy") or {}).get("source") or (copy and spec.get("source"))
            if reading and copy.get("phase") != "Done" and not deleting:
                refs.pending_sources.add(str(reading))  # a copy in progress reads it
        return refs

    async def _snapshot_handles(self) -> set[str] | None:
        try:
            contents, _ = await api.list_all(self.client, self.snapshot_contents)
        except kube.KubeError as e:
            level = logging.DEBUG if isinstance(e, kube.NotFound) else logging.WARNING
            log.log(
                level,
                "cannot list VolumeSnapshotContents; snapshot LogicalVolumes (accessType ro) "
                f"are kept: {kube.describe(e)}",
            )
            return None
        handles: set[str] = set()
        for content in contents:
            for part in ((content.get("status") or {}),
                         ((content.get("spec") or {}).get("source") or {})):  # fmt: skip
                if part.get("snapshotHandle"):
                    handles.add(str(part["snapshotHandle"]))
        return handles

    async def _collect(self, lv: LogicalVolumeObject) -> None:
        ctx = {"lv": lv.name, "uid": lv.uid, "volume_id": lv.volume_id, "node": lv.node_name,
               "mode": str(self.mode)}  # fmt: skip
        if self.mode is not GcMode.DELETE:
            log.warning("orphan LogicalVolume (dry run: not deleted)", extra=ctx)
            return
        # The object must still be the one we judged: same UID, same volume id, not deleting.
        current = await self.volumes.get(lv.name, fresh=True)
        if current is None or current.uid != lv.uid or current.volume_id != lv.volume_id:
            log.info("orphan LogicalVolume changed or went away; not deleting it", extra=ctx)
            return
        if current.deleting:
            return
        await self.volumes.delete(lv.name)
        if self.metrics is not None:
            self.metrics.gc_deleted.inc()
        log.warning("deleted orphan LogicalVolume", extra=ctx)

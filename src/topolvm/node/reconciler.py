"""Makes LogicalVolume objects for this node real through lvmd (spec §5.1, node side).

The reconcile is level-triggered and idempotent: it acts on the object as the informer's cache
holds it, as controller-runtime does (but reads it from the API while the cache is older than
this node's own last write to it), and lvmd's CreateLV succeeds for an LV that already exists
with the same size, so a restart at any point neither creates an LV twice nor loses one. An LV
is removed only after its LogicalVolume has a deletionTimestamp, and the finalizer is removed
only after the LV is gone.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from grpclib.const import Status
from lightkube import AsyncClient

from topolvm.constants import CREATED_BY_LABEL, Names
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import CopyStatus, InvalidQuantity, LogicalVolumeObject, status_dict
from topolvm.k8s.runtime import Controller, Informer, ReconcileError, Result, resource_version
from topolvm.node.copies import CopyJobs
from topolvm.node.copyreport import copy_patch
from topolvm.node.lvmd_client import LvmdCallError, LvmdClient
from topolvm.node.verify import VerifyJobs
from topolvm.proto import lvmd_pb2 as pb

log = logging.getLogger(__name__)


class LogicalVolumeReconciler:
    def __init__(
        self, client: AsyncClient, names: Names, node_name: str, lvmd: LvmdClient,
        copies: CopyJobs | None = None, verifier: VerifyJobs | None = None,
    ):  # fmt: skip
        self.client = client
        self.names = names
        self.node_name = node_name
        self.lvmd = lvmd
        self.copies = copies  # fills volumes from a copy (docs/mobility.md); None: never
        self.verifier = verifier  # digests asked for by spec.verify; None: never
        self.resource = api.logicalvolume_resource(names)
        # name -> resourceVersion of this node's last write to it: a cached copy older than
        # that is out of date.
        self._floor: dict[str, int] = {}
        # name -> resourceVersion of this node's last write whose pass went on from the object
        # as stored (the finalizer write) or whose stored object needs nothing more (a status
        # write): that version and older ones need no reconcile of their own.
        self._acted: dict[str, int] = {}
        self._informer: Informer | None = None  # set by watch(); without it, reads are GETs

    # -- wiring -------------------------------------------------------------------------------
    def watch(self, informer: Informer, controller: Controller) -> None:
        """Queue this node's LogicalVolumes when a change the informer sees may need work, and
        read them from its cache from then on."""
        self._informer = informer

        def on_event(event: str, obj: api.Obj) -> None:
            name, version = obj["metadata"]["name"], resource_version(obj)
            if event == "DELETED":
                self._floor.pop(name, None)
                self._acted.pop(name, None)
                return
            superseded = 0 < version <= self._acted.get(name, 0)
            if not superseded and self.needs_work(obj):
                controller.enqueue(name)

        informer.add_handler(on_event)

    def needs_work(self, obj: api.Obj) -> bool:
        """Whether an object the informer saw may need this node to act. False for other nodes'
        objects and for one that is done: finalized, created, as large as asked and not being
        deleted (the echo of this node's own status write, every resync). A deleted object
        needs nothing either: its finalizer went only after its LV."""
        try:
            lv = LogicalVolumeObject.from_dict(obj)
        except (InvalidQuantity, KeyError, TypeError, ValueError):
            return (obj.get("spec") or {}).get("nodeName") == self.node_name  # reconcile logs it
        if lv.node_name != self.node_name:
            return False
        filled = lv.copy_done or bool(lv.code) or self.copies is None
        verified = self.verifier is None or not lv.verify_pending
        done = (self._marked(lv) and bool(lv.volume_id) and _as_large_as_asked(lv) and filled
                and verified)  # fmt: skip
        return lv.deleting or not done

    def _marked(self, lv: LogicalVolumeObject) -> bool:
        """It carries this node's finalizer and the created-by label."""
        label, value = CREATED_BY_LABEL
        return self.names.lv_finalizer in lv.finalizers and lv.labels.get(label) == value

    # -- reconcile ----------------------------------------------------------------------------
    async def _read(self, name: str) -> api.Obj | None:
        """The object from the informer's cache once it has listed (only events from it queue
        work, so the cache holds at least the version that queued this reconcile), else a GET;
        a GET too while the cache is older than this node's own last write to the object: its
        status writes are merge patches without a resourceVersion, so acting on an older copy
        could write a failure over a volume that exists."""
        informer = self._informer
        if informer is not None and informer.synced.is_set():
            cached = informer.get(name)
            if cached is None or resource_version(cached) >= self._floor.get(name, 0):
                return cached
        return await api.get(self.client, self.resource, name)

    async def reconcile(self, name: str) -> Result | None:
        obj = await self._read(name)
        if obj is None:
            return None
        return await self._reconcile(obj)

    async def _reconcile(self, obj: api.Obj, marked: bool = False) -> Result | None:
        name = str(obj["metadata"]["name"])
        try:
            lv = LogicalVolumeObject.from_dict(obj)
        except (InvalidQuantity, KeyError, TypeError, ValueError) as e:
            log.error("ignoring malformed LogicalVolume", extra={"lv": name, "error": str(e)})
            return None
        if lv.node_name != self.node_name:
            return None
        ctx = {"lv": name, "uid": lv.uid}
        if self.names.pending_deletion in lv.annotations:
            log.info("LogicalVolume is pending deletion with its node; skipping", extra=ctx)
            return None
        if lv.deleting:
            await self._finalize(lv, obj)
            return None
        if not self._marked(lv):
            if marked:  # the write this pass just made did not stick: start over
                raise ReconcileError(f"the finalizer or label of {name} did not stick")
            stored = await self._mark(name, obj)
            if stored is None:
                return None
            # on from the object as stored, which has both (and whatever else changed since
            # the copy this pass started from): so the echo of that write needs nothing
            return await self._reconcile(stored, marked=True)
        if not lv.volume_id:
            await self._create(lv)
        elif not lv.copy_done:
            if self.copies is not None and not lv.code:
                self.copies.ensure(lv)  # (again, after a restart) the job that fills it
        else:
            if self.verifier is not None and lv.verify_pending:
                self.verifier.ensure(lv)  # (again, after a restart) the digest asked for
            await self._expand(lv)
        return None

    async def _mark(self, name: str, obj: api.Obj) -> api.Obj | None:
        """Add the finalizer and the created-by label in one conflict-safe write, starting from
        ``obj``; the object as stored (None if it is gone)."""
        label, value = CREATED_BY_LABEL
        wrote = False

        def mark(o: api.Obj) -> bool:
            nonlocal wrote
            wrote = False
            meta = o["metadata"]
            finalizers = list(meta.get("finalizers") or [])
            labels = dict(meta.get("labels") or {})
            if self.names.lv_finalizer in finalizers and labels.get(label) == value:
                return False
            if self.names.lv_finalizer not in finalizers:
                meta["finalizers"] = [*finalizers, self.names.lv_finalizer]
            meta["labels"] = {**labels, label: value}
            wrote = True
            return True

        stored = await api.modify(self.client, self.resource, name, mark, known=obj)
        # not another writer's version (a retry that found nothing to change); the caller goes
        # on from the stored object, so that version is acted on
        if stored is not None and wrote:
            self._floor[name] = self._acted[name] = resource_version(stored)
        return stored

    async def _finalize(self, lv: LogicalVolumeObject, obj: api.Obj) -> None:
        if self.names.lv_finalizer not in lv.finalizers:
            return
        if (reader := self._copy_reading(lv)) is not None:
            # a copy reads it (or a cut of it): it goes once that copy is done or given up
            raise ReconcileError(f"LV {lv.uid} is the source of a copy in progress ({reader})")
        if self.copies is not None:
            await self.copies.cancel(lv.name)  # its thread no longer writes the LV
            if lv.copy is not None:
                await self.copies.drop_cut(lv)
        if self.verifier is not None and (lv.verify_id or lv.verify is not None):
            try:  # its job stopped, its cut removed (a COW cut keeps the LV from going)
                await self.verifier.forget(lv)
            except LvmdCallError as e:
                raise ReconcileError(f"cannot remove the verification cut of {lv.uid}: {e}") from e
        try:
            await self.lvmd.remove_lv(pb.RemoveLVRequest(name=lv.uid, device_class=lv.device_class))
            log.info("removed LV", extra={"lv": lv.name, "uid": lv.uid})
        except LvmdCallError as e:
            if e.code != Status.NOT_FOUND:
                raise ReconcileError(f"failed to remove LV {lv.uid}: {e}") from e
            log.info("LV already removed", extra={"lv": lv.name, "uid": lv.uid})
        await api.set_finalizer(
            self.client, self.resource, lv.name, self.names.lv_finalizer, False, known=obj
        )

    def _copy_reading(self, lv: LogicalVolumeObject) -> str | None:
        """The LogicalVolume a copy in progress fills from ``lv``, if any."""
        if self._informer is None:
            return None
        for obj in self._informer.values():
            spec = obj.get("spec") or {}
            copy_source = (spec.get("copy") or {}).get("source")
            local = spec.get("source") == lv.name and (obj.get("status") or {}).get("copy")
            if copy_source != lv.name and not local:
                continue
            try:
                target = LogicalVolumeObject.from_dict(obj)
            except (InvalidQuantity, KeyError, TypeError, ValueError):
                continue
            if not target.copy_done and not target.deleting and not target.code:
                return f"{target.name} on node {target.node_name}"
        return None

    async def _create(self, lv: LogicalVolumeObject) -> None:
        if lv.code != 0:
            return  # a failed create is final: the controller deletes the object
        if self.copies is not None and (lv.copy_source or await self._thick_source(lv)):
            await self._create_copy_target(lv)
            return
        try:
            if lv.source:
                size = await self._create_snapshot(lv)
            else:
                resp = await self.lvmd.create_lv(
                    pb.CreateLVRequest(
                        name=lv.uid,
                        device_class=lv.device_class,
                        lvcreate_option_class=lv.lvcreate_option_class,
                        size_bytes=lv.size,
                    )
                )
                size = resp.volume.size_bytes
        except LvmdCallError as e:
            # lvmd answers a retried create of the same LV with the LV itself; ALREADY_EXISTS
            # means it exists with another shape (created before a crash, then spec.size
            # grew): adopt it, and the expand path takes it from there.
            existing = await self._find_lv(lv) if e.code == Status.ALREADY_EXISTS else None
            if existing is not None:
                log.info("adopting existing LV", extra={"lv": lv.name, "uid": lv.uid})
                await self._set_status(lv.name, lv.uid, 0, "", existing.size_bytes)
                # in this pass, from the copy just adopted (the expand's status write is the
                # last one)
                await self._expand(replace(lv, volume_id=lv.uid, current_size=existing.size_bytes))
                return
            await self._set_failure(lv, e.code, e.message)
            raise ReconcileError(f"failed to create LV {lv.uid}: {e}") from e
        log.info("created LV", extra={"lv": lv.name, "uid": lv.uid, "size_bytes": size})
        await self._set_status(lv.name, lv.uid, 0, "", size)

    async def _thick_source(self, lv: LogicalVolumeObject) -> bool:
        """A snapshot or clone here of a thick volume: an independent LV filled by a copy
        (LVM's own thick snapshots slow their origin down and die when they fill up)."""
        if not lv.source:
            return False
        src_obj = await api.get(self.client, self.resource, lv.source)
        src = None if src_obj is None else LogicalVolumeObject.from_dict(src_obj)
        if src is None or not src.volume_id:
            return False  # the snapshot path reports it
        try:
            described = await self.lvmd.describe_lv(src.volume_id, src.device_class)
        except LvmdCallError as e:
            if e.code in (Status.UNIMPLEMENTED, Status.NOT_FOUND):
                return False  # upstream's lvmd: its own answer (thick: not implemented)
            raise ReconcileError(f"cannot tell what {src.volume_id} is: {e}") from e
        return not described.thin

    async def _create_copy_target(self, lv: LogicalVolumeObject) -> None:
        """An empty LV, reported with ``status.copy`` in the same write as its volume id (so
        no reader takes it for a filled volume), then the job that fills it."""
        assert self.copies is not None
        try:
            resp = await self.lvmd.create_lv(
                pb.CreateLVRequest(
                    name=lv.uid,
                    device_class=lv.device_class,
                    lvcreate_option_class=lv.lvcreate_option_class,
                    size_bytes=lv.size,
                )
            )
        except LvmdCallError as e:
            await self._set_failure(lv, e.code, e.message)
            raise ReconcileError(f"failed to create LV {lv.uid} for a copy: {e}") from e
        size = resp.volume.size_bytes
        log.info("created LV for a copy", extra={"lv": lv.name, "uid": lv.uid, "size_bytes": size})
        pending = CopyStatus(message="about to start")
        await self._set_status(lv.name, lv.uid, 0, "", size, copy=copy_patch(pending))
        self.copies.ensure(replace(lv, volume_id=lv.uid, current_size=size, copy=pending))

    async def _create_snapshot(self, lv: LogicalVolumeObject) -> int:
        if lv.access_type not in ("ro", "rw"):
            raise ReconcileError(f"invalid accessType {lv.access_type!r}: must be ro or rw")
        src_obj = await api.get(self.client, self.resource, lv.source)
        if src_obj is None:
            raise ReconcileError(f"source LogicalVolume {lv.source!r} not found")
        src = LogicalVolumeObject.from_dict(src_obj)
        if not src.volume_id:
            raise ReconcileError(f"source LogicalVolume {lv.source!r} has no volume yet")
        if src.current_size is not None and lv.size < src.current_size:
            raise LvmdCallError(
                Status.OUT_OF_RANGE,
                f"cannot create new LV, requested size {lv.size} is smaller than source LV size "
                f"{src.current_size}",
            )
        resp = await self.lvmd.create_lv_snapshot(
            pb.CreateLVSnapshotRequest(
                name=lv.uid,
                device_class=lv.device_class,
                source_volume=src.volume_id,
                size_bytes=lv.size,
                access_type=lv.access_type,
            )
        )
        return int(resp.snapshot.size_bytes)

    async def _expand(self, lv: LogicalVolumeObject) -> None:
        if _as_large_as_asked(lv):
            return
        try:
            resp = await self.lvmd.resize_lv(
                pb.ResizeLVRequest(
                    name=lv.volume_id, size_bytes=lv.size, device_class=lv.device_class
                )
            )
        except LvmdCallError as e:
            await self._set_failure(lv, e.code, e.message)
            raise ReconcileError(f"failed to resize LV {lv.volume_id}: {e}") from e
        log.info("resized LV", extra={"lv": lv.name, "uid": lv.uid, "size_bytes": resp.size_bytes})
        await self._set_status(lv.name, lv.volume_id, 0, "", int(resp.size_bytes))

    async def _find_lv(self, lv: LogicalVolumeObject) -> pb.LogicalVolume | None:
        try:
            volumes = await self.lvmd.get_lv_list(lv.device_class)
        except LvmdCallError as e:
            if e.code == Status.NOT_FOUND:  # unknown device class: CreateLV reports it
                return None
            raise ReconcileError(f"failed to list LVs: {e}") from e
        return next((v for v in volumes if v.name == lv.uid), None)

    async def _set_failure(self, lv: LogicalVolumeObject, code: Status, message: str) -> None:
        await self._set_status(lv.name, lv.volume_id, code.value, message, lv.current_size)

    async def _set_status(
        self, name: str, volume_id: str, code: int, message: str, current_size: int | None,
        copy: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        wanted: dict[str, Any] = {"volumeID": None, "code": None, "message": None,
                                  "currentSize": None}  # fmt: skip
        wanted.update(
            status_dict(volume_id=volume_id, code=code, message=message, current_size=current_size)
        )
        if copy is not None:
            wanted["copy"] = copy
        # one merge patch of the status subresource: set fields are written, the others
        # (null) removed; only this node writes the status of its LogicalVolumes
        try:
            stored = await api.patch_merge(
                self.client, self.resource.Status, name, {"status": wanted}
            )
        except kube.NotFound:
            return
        # The patch carries no resourceVersion, so the stored object may hold another writer's
        # change (a larger spec.size, a deletionTimestamp) that this pass did not act on: then
        # its echo must be reconciled.
        version = resource_version(stored)
        self._floor[name] = version
        if not self.needs_work(stored):
            self._acted[name] = version


def _as_large_as_asked(lv: LogicalVolumeObject) -> bool:
    return lv.current_size is not None and lv.size <= lv.current_size

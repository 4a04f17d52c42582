"""The two ends of a move that delete (see :mod:`.moves`): the old volume once the pod runs
on the target, and the move's own volume when it rolls back. Each delete is fenced
(:mod:`topolvm.move.fence`, docs/mobility.md "Fencing"): what it deletes is found from objects
it can check, not from the VolumeMove's status, and is deleted with its UID (and, where the
binding lives on it, its resourceVersion) as the API server's preconditions."""

from __future__ import annotations

import logging

from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim, Pod

from topolvm.controller.moveprepull import PrePull
from topolvm.controller.movesteps import Fenced, Steps
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import LogicalVolumeObject
from topolvm.k8s.moveobject import VolumeMoveObject
from topolvm.move import fence

log = logging.getLogger(__name__)


class Ends:
    def __init__(self, steps: Steps, prepull: PrePull) -> None:
        self.steps = steps
        self.prepull = prepull
        self.client = steps.client
        self.store = steps.store
        self.driver = steps.names.plugin

    async def remove_old(self, vm: VolumeMoveObject) -> str:
        """The pod runs on the target and the copy is verified: the old PV (the claim's before
        the move, bound to no claim now) goes first, with its UID and resourceVersion as
        preconditions, so that a PV someone bound meanwhile stops it with its LV untouched;
        then the source LogicalVolume: the one whose volume id is the old PV's volumeHandle,
        which carries this move's ``spec.verify`` (so that a pass after a crash, the PV gone,
        still knows it, and a status naming another LogicalVolume finds nothing to delete).
        "" once both are gone, else what it waits for; :class:`Fenced` if the PV the status
        names is not the claim's old one, or the LogicalVolume is not the one verified."""
        name, made = vm.status.old_pv, vm.made_name
        pv = await api.get(self.client, PersistentVolume, name) if name else None
        if pv is not None and pv["metadata"].get("deletionTimestamp"):
            return f"waiting for the old PV {name} to be deleted"
        if pv is not None:
            pv = await self.steps.old_volume(vm)
            pvc = await api.get(self.client, PersistentVolumeClaim, vm.claim,
                                namespace=vm.namespace)  # fmt: skip
            if why := fence.released(pv, pvc, vm.status.claim_uid):
                return f"waiting to remove the old volume: {why}"
            handle = fence.handle_of(pv)
            source = await self.store.find_by_volume_id(handle) if handle else None
            if source is not None and source.name != made:
                if source.verify_id != vm.uid or source.name != vm.status.source_volume:
                    raise Fenced(f"the source LogicalVolume {source.name} is kept: it is not "
                                 "the one this move verified")  # fmt: skip
                await self._unreferenced(source, but=name)
            meta = pv["metadata"]
            try:
                await api.delete(self.client, PersistentVolume, name, uid=meta["uid"],
                                 resource_version=meta["resourceVersion"])  # fmt: skip
            except kube.PreconditionFailed:
                return f"the old PV {name} changed since it was read: looking again"
            log.info("old PV removed", extra={"move": f"{vm.namespace}/{vm.name}",
                                              "pv": name})  # fmt: skip
            if await api.get(self.client, PersistentVolume, name) is not None:
                return f"waiting for the old PV {name} to be deleted"  # its finalizers
        lv = await self.store.get(vm.status.source_volume, fresh=True) \
            if vm.status.source_volume else None  # fmt: skip
        if lv is None or lv.deleting:
            return ""
        if lv.name == made or lv.verify_id != vm.uid:  # not the source this move verified
            log.warning("the LogicalVolume the status names as the source is left alone",
                        extra={"move": f"{vm.namespace}/{vm.name}", "logicalvolume": lv.name,
                               "verify_id": lv.verify_id})  # fmt: skip
            return ""
        await self._unreferenced(lv, but="")
        await self.store.delete(lv.name, uid=lv.uid)
        log.info("old LogicalVolume removed", extra={"move": f"{vm.namespace}/{vm.name}",
                                                     "logicalvolume": lv.name})  # fmt: skip
        return ""

    async def _unreferenced(self, lv: LogicalVolumeObject, but: str) -> None:
        """:class:`Fenced` if a PV (but the PV ``but``) refers to ``lv``'s volume."""
        pvs, _ = await api.list_all(self.client, PersistentVolume)
        others = [p for p in pvs if p["metadata"]["name"] != but]
        if why := fence.unreferenced(lv.volume_id, others, self.driver):
            raise Fenced(f"the source LogicalVolume {lv.name} is kept: {why}")

    async def rollback(self, vm: VolumeMoveObject) -> None:
        """Undo what the move made: the new PV (only while no claim is bound to it and no pod
        uses it), the target LogicalVolume (only while no PV refers to it); the old PV's
        reclaim policy restored; the claim's pods let go. :class:`Fenced` if a claim is bound
        to the new PV: the move cannot roll back."""
        made = vm.made_name
        pv = await api.get(self.client, PersistentVolume, made)
        if pv is not None:  # a terminating one too: a bound PV stays terminating (pv-protection)
            pvc = await api.get(self.client, PersistentVolumeClaim, vm.claim,
                                namespace=vm.namespace)  # fmt: skip
            pods, _ = await api.list_all(self.client, Pod, namespace=vm.namespace)
            if why := fence.unbound(pv, pvc, pods):
                raise Fenced(f"cannot roll back: {why}")
        if pv is not None and not pv["metadata"].get("deletionTimestamp"):
            meta = pv["metadata"]
            await api.delete(self.client, PersistentVolume, made, uid=meta["uid"],
                             resource_version=meta["resourceVersion"])  # fmt: skip
        target = await self.store.get(made, fresh=True)
        if target is not None and not target.deleting:
            pvs, _ = await api.list_all(self.client, PersistentVolume)
            left = [p for p in pvs if not (p["metadata"]["name"] == made
                                           and p["metadata"].get("deletionTimestamp"))]  # fmt: skip
            if why := fence.unreferenced(target.volume_id, left, self.driver):
                raise Fenced(f"cannot roll back: {why}")
            await self.store.delete(made, uid=target.uid)
        if vm.status.reclaim_policy:
            await self.steps.retain(vm, vm.status.reclaim_policy)
        await self.steps.ungate(vm)
        await self.prepull.remove(vm)
        log.info("move rolled back", extra={"move": f"{vm.namespace}/{vm.name}",
                                            "reason": vm.status.reason})  # fmt: skip

"""What this node's LVM holds that nothing accounts for (docs/troubleshooting.md, "LVs that no
LogicalVolume claims"). Every ``interval`` seconds the LVs of each device class (lvmd's
GetLVList) are set against this node's LogicalVolumes (the informer's cache):

- an LV named after a LogicalVolume's volume id (or its UID, while its node creates it) is
  that volume's;
- a cut (``cut.<UID>``, a move's second ``cut.<UID>.r2``) of a copy still running is that
  copy's, and so is a verification's cut (``verify.<UID>``) until its digest is reported;
- a cut that this node tagged as its own (``topolvm/cut``) whose copy ended (its target was
  filled, failed or deleted) is this node's leftover: it is removed;
- any other LV named like TopoLVM's (a LogicalVolume UID, a cut) is an *orphan*: an old volume
  whose LogicalVolume went first, a restore by hand, another cluster's. It is logged (a warning
  when first found), counted in ``topolvm_orphan_logical_volumes`` and
  ``topolvm_orphan_logical_volume_bytes`` (labels ``node``, ``device_class``) and listed on the
  Node (:mod:`topolvm.k8s.orphanlvs`, for ``topolvm doctor``). It is never removed: whose it
  is, this node cannot tell.

LVs named otherwise (an administrator's, in a VG shared with TopoLVM) are not TopoLVM's and not
counted. An LV is judged on two scans in a row, so that a LogicalVolume the cache has not seen
yet (or a cut made for a job that just started) is never taken for an orphan or a leftover.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncGenerator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from topolvm.constants import Names
from topolvm.k8s import api, orphanlvs
from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import InvalidQuantity, LogicalVolumeObject
from topolvm.k8s.orphanlvs import Kind, OrphanLv
from topolvm.k8s.runtime import Informer
from topolvm.node.exporter import NodeMetrics
from topolvm.node.lvmd_client import LvmdClient
from topolvm.node.volumes import CUT_TAG, ROUND_TWO, Cuts, job_of_cut, job_of_round
from topolvm.transfer.errors import TransferError

log = logging.getLogger(__name__)
INTERVAL = 60.0
VERIFY_PREFIX = "verify."  # a verification's cut (topolvm.node.verifyread)
UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class NodeLv:
    """An LV as lvmd lists it for a device class."""

    name: str
    vg: str
    device_class: str
    size_bytes: int
    tags: tuple[str, ...] = ()

    def orphan(self, kind: str) -> OrphanLv:
        return OrphanLv(self.name, self.vg, self.device_class, self.size_bytes, kind)


@dataclass(frozen=True)
class Accounting:
    orphans: tuple[OrphanLv, ...] = ()
    ended_cuts: tuple[NodeLv, ...] = ()  # this node's cuts whose copy ended: it removes them


def copy_running(lv: LogicalVolumeObject, second: bool = False) -> bool:
    """A copy still fills ``lv``, so its cut (with ``second``, a move's second cut) is read.
    A move's first cut is the base of its final copy: it is kept from the pre-copy's end until
    the final copy is done."""
    if not (lv.copy_source or lv.copy is not None) or lv.deleting or lv.code:
        return False
    if second:
        return final_pending(lv)
    return not lv.copy_done or (lv.copy_keep_cut and lv.copy_round < 2)


def final_pending(lv: LogicalVolumeObject) -> bool:
    """A move's final copy into ``lv`` is to come or runs: its second cut is that copy's. The
    cut is made once the source closes, which may be before the final copy is asked for (the
    pre-copy done, ``spec.copy.round`` still 1)."""
    if not lv.copy_source or lv.deleting or lv.code:
        return False
    if lv.copy_round >= 2:
        return not lv.copy_done
    return lv.copy_keep_cut and lv.copy_done


def _verify_pending(raw: Mapping[str, Any]) -> bool:
    """``spec.verify.id`` asks for a digest its node has not reported yet."""
    asked = ((raw.get("spec") or {}).get("verify") or {}).get("id")
    told = (raw.get("status") or {}).get("verify") or {}
    if not asked or (raw.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return bool(told.get("id") != asked or told.get("phase") not in ("Done", "Failed"))


def account(lvs: Iterable[NodeLv], objects: Iterable[Mapping[str, Any]], node: str) -> Accounting:
    """Pure: which of ``lvs`` (this node's) no LogicalVolume of ``objects`` accounts for."""
    claimed: set[str] = set()
    copies: dict[str, LogicalVolumeObject] = {}
    verifying: set[str] = set()
    unreadable: set[str] = set()  # UIDs and volume ids of objects that do not parse
    for raw in objects:
        try:
            obj = LogicalVolumeObject.from_dict(dict(raw))
        except (InvalidQuantity, KeyError, TypeError, ValueError):
            # the reconciler logs a malformed object; what it names is not judged here
            meta, status = raw.get("metadata") or {}, raw.get("status") or {}
            unreadable.update(str(v) for v in (meta.get("uid"), status.get("volumeID")) if v)
            continue
        copies[obj.uid] = obj  # a copy's target may be on another node than its cut
        if obj.node_name == node:
            claimed.update(v for v in (obj.volume_id, obj.uid) if v)
            if _verify_pending(raw):
                verifying.add(obj.uid)
    orphans: list[OrphanLv] = []
    ended: list[NodeLv] = []
    for lv in lvs:
        if lv.name in claimed or lv.name in unreadable:
            continue
        if lv.name.startswith(VERIFY_PREFIX):
            if lv.name[len(VERIFY_PREFIX) :] not in verifying:
                orphans.append(lv.orphan(Kind.VERIFY_CUT))
            continue
        job = job_of_cut(lv.name)
        if job is None:
            if UID.fullmatch(lv.name):
                orphans.append(lv.orphan(Kind.VOLUME))
            continue
        if job_of_round(job) in unreadable:
            continue
        target = copies.get(job_of_round(job))
        if target is not None and copy_running(target, job.endswith(ROUND_TWO)):
            continue
        if CUT_TAG in lv.tags:
            ended.append(lv)
        else:
            orphans.append(lv.orphan(Kind.CUT))
    return Accounting(tuple(sorted(orphans)), tuple(ended))


class LvAccounting:
    """Runs :func:`account` on this node, removes its own ended cuts, reports the orphans."""

    def __init__(
        self, client: AsyncClient, names: Names, node: str, lvmd: LvmdClient, informer: Informer,
        metrics: NodeMetrics, cuts: Cuts, interval: float = INTERVAL,
    ) -> None:  # fmt: skip
        self.client = client
        self.names = names
        self.node = node
        self.lvmd = lvmd
        self.informer = informer
        self.metrics = metrics
        self.cuts = cuts
        self.interval = interval
        self.classes: tuple[str, ...] = ()
        self.reported: tuple[OrphanLv, ...] | None = None  # None: nothing published yet
        self._suspects: set[tuple[str, str]] = set()  # (vg, name) unaccounted at the last scan

    async def run(self) -> None:
        """Scan every ``interval`` seconds until cancelled. A failed scan is logged and tried
        again: the accounting only reports, so it never stops topolvm-node."""
        while True:
            try:
                await self.scan()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # lvmd, the API, a stream that ended: all the same here
                log.warning("LV accounting: scan failed; trying again",
                            extra={"node": self.node, "error": kube.describe(e),
                                   "retry_in": self.interval})  # fmt: skip
            await asyncio.sleep(self.interval)

    async def _device_classes(self) -> tuple[str, ...]:
        """This node's device classes, from lvmd's first Watch message (once)."""
        if not self.classes:
            stream = self.lvmd.watch()
            try:
                msg = await anext(stream)
            finally:
                if isinstance(stream, AsyncGenerator):
                    await stream.aclose()
            self.classes = tuple(sorted({i.device_class for i in msg.items}))
        return self.classes

    async def _lvs(self) -> list[NodeLv]:
        """Every LV of every device class; one listed by two classes on one VG counts once."""
        seen: dict[tuple[str, str], NodeLv] = {}
        for dc in await self._device_classes():
            for v in await self.lvmd.get_lv_list(dc):
                vg = v.path.split("/")[2] if v.path.startswith("/dev/") else ""
                seen.setdefault((vg, v.name), NodeLv(v.name, vg, dc, int(v.size_bytes),
                                                     tuple(v.tags)))  # fmt: skip
        return list(seen.values())

    async def scan(self) -> Accounting | None:
        """One look; None while the informer has not listed yet. LVs are listed before the
        LogicalVolumes are read: a volume made in between has its object in the cache."""
        if not self.informer.synced.is_set():
            return None
        lvs = await self._lvs()
        found = account(lvs, self.informer.values(), self.node)
        now = {(o.vg, o.name) for o in found.orphans} | {(c.vg, c.name) for c in found.ended_cuts}
        twice, self._suspects = self._suspects & now, now
        for cut in found.ended_cuts:
            if (cut.vg, cut.name) in twice:
                await self._remove(cut)
        orphans = tuple(o for o in found.orphans if (o.vg, o.name) in twice)
        await self._report(orphans)
        return Accounting(orphans, tuple(c for c in found.ended_cuts if (c.vg, c.name) in twice))

    async def _remove(self, cut: NodeLv) -> None:
        job = job_of_cut(cut.name)
        assert job is not None
        self.cuts.end(job_of_round(job))  # never made again for that job
        try:
            if await self.cuts.remove(job, cut.device_class):
                log.info("removed a cut whose copy ended",
                         extra={"node": self.node, "lv": f"{cut.vg}/{cut.name}",
                                "size_bytes": cut.size_bytes})  # fmt: skip
        except TransferError as e:
            log.warning("cannot remove a cut whose copy ended; trying again at the next scan",
                        extra={"node": self.node, "lv": f"{cut.vg}/{cut.name}",
                               "error": str(e)})  # fmt: skip

    async def _report(self, orphans: tuple[OrphanLv, ...]) -> None:
        before = set(self.reported or ())
        for o in orphans:
            if o not in before:
                log.warning(
                    "an LV that no LogicalVolume claims (topolvm-node never removes it: see "
                    "topolvm doctor)", extra={"node": self.node, "lv": o.full_name,
                                              "device_class": o.device_class,
                                              "size_bytes": o.size_bytes, "kind": o.kind},
                )  # fmt: skip
        for o in before - set(orphans):
            log.info("an LV no LogicalVolume claimed is gone",
                     extra={"node": self.node, "lv": o.full_name})  # fmt: skip
        self.metrics.orphans(self.classes, orphans)
        if orphans == self.reported:
            return
        patch = {"metadata": {"annotations": {
            orphanlvs.annotation(self.names): orphanlvs.encode(orphans)}}}  # fmt: skip
        try:
            await api.patch_merge(self.client, Node, self.node, patch)
        except kube.NotFound:
            log.warning("Node object not found; orphan LVs not published",
                        extra={"node": self.node})  # fmt: skip
            return
        self.reported = orphans

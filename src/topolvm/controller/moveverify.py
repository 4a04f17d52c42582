"""A move verified before its old volume goes (docs/mobility.md, "Verified before the source
goes"); the rules are :mod:`topolvm.move.verdict`, this is their API work.

- In FinalCopy, once the claim's last round is copied, the target LogicalVolume is asked for
  a digest (``spec.verify``: the VolumeMove's UID, the bytes the copy went through): nothing
  but the pod writes it, and the pod starts only after the swap, so its node cuts it while the
  group's other copies and the swap run. In Swapping, once the group committed (the pod down,
  the data final), the source is asked too: its cut holds whatever reached it until then (a
  pod back on the old node, written to and deleted before the commit), which a digest taken
  earlier would miss. Each node cuts its volume at once and reads the cut later.
- In Starting the pod is let go only once the target is cut (:meth:`Verify.cut_waiting`), so
  the downtime grows by no more than making a snapshot.
- In Verifying, the pod running on the target: the digests are compared. Equal, the condition
  ``Verified`` is written True first, then (a next pass) the old PV and LV are removed, or kept
  ``spec.keepSourceSeconds`` longer (``status.keepSourceUntil``; removed by :meth:`after`, or
  when the VolumeMove is deleted). Different, or a digest that failed: ``Unverified``, the
  old volume kept for good (a person decides, ``topolvm doctor`` says how).

The source is found as every delete of a move finds it (:mod:`topolvm.move.fence`): the
LogicalVolume whose volume id is the old PV's volumeHandle, the old PV being the claim's
before the move; never by the status's ``sourceVolume``.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from lightkube.resources.core_v1 import PersistentVolume

from topolvm.controller.moveends import Ends
from topolvm.controller.movesteps import Fenced, Steps
from topolvm.k8s import api
from topolvm.k8s.lvobject import LogicalVolumeObject
from topolvm.k8s.moveobject import (
    Condition,
    MovePhase,
    MoveStatus,
    OldVolume,
    Verified,
    VolumeMoveObject,
)
from topolvm.k8s.stamps import later, now, seconds_until
from topolvm.move import verdict
from topolvm.move.verdict import Outcome
from topolvm.units import human

log = logging.getLogger(__name__)


class Verify:
    def __init__(self, steps: Steps, ends: Ends) -> None:
        self.steps = steps
        self.ends = ends
        self.client = steps.client
        self.store = steps.store

    async def source(self, vm: VolumeMoveObject) -> tuple[LogicalVolumeObject | None, str]:
        """The source LogicalVolume, found through the old PV; else None and why."""
        return await self.steps.source(vm)

    async def request(self, vm: VolumeMoveObject) -> str:
        """Both volumes asked for their digest (again, idempotent); "" once they are, else
        what is missing (the target gone: the move cannot be verified, nor start). After the
        commit only for the source: its cut then holds whatever reached it up to the swap (a
        pod back on the old node without the gate, written to and deleted before the
        commit), which the digests' comparison catches."""
        target = await self.store.get(vm.made_name, fresh=True)
        if target is None:
            return f"the target LogicalVolume {vm.made_name} is gone"
        source, why = await self.source(vm)
        if source is None:  # verification will fail, and say why; the target is still cut
            log.warning("the source of a move cannot be verified", extra={
                "move": f"{vm.namespace}/{vm.name}", "detail": why})  # fmt: skip
        size = verdict.verify_size(target, vm.status.size_bytes)
        for lv in (target, source):
            if lv is not None:
                await self._ask_once(lv, vm.uid, size)
        return ""

    async def request_target(self, vm: VolumeMoveObject, target: LogicalVolumeObject) -> None:
        """The target alone (as just read), once its last round is copied, before the
        commit: nothing but the pod writes it, and the pod starts only after the swap."""
        await self._ask_once(target, vm.uid, verdict.verify_size(target, vm.status.size_bytes))

    async def _ask_once(self, lv: LogicalVolumeObject, uid: str, size: int) -> None:
        if not lv.deleting and not verdict.asked(lv, uid, size):
            await self._ask(lv.name, uid, size)

    async def _ask(self, name: str, uid: str, size: int) -> None:
        want = {"id": uid, "sizeBytes": size}

        def mutate(obj: api.Obj) -> bool:
            spec = obj.setdefault("spec", {})
            if spec.get("verify") == want:
                return False
            spec["verify"] = want
            return True

        await api.modify(self.client, self.store.resource, name, mutate)
        log.info("verification asked for", extra={"logicalvolume": name, "id": uid,
                                                  "bytes": size})  # fmt: skip

    async def cut_waiting(self, vm: VolumeMoveObject) -> str:
        """What the pod's start waits for: the target cut for its verification ("": it is)."""
        target = await self.store.get(vm.made_name, fresh=True)
        if target is None:
            return f"the target LogicalVolume {vm.made_name} is gone: the move cannot finish"
        if verdict.cut_made(vm.uid, target):
            return ""
        st = verdict.own(vm.uid, target)
        said = f" ({st.message})" if st is not None and st.message else ""
        return (f"waiting for node {target.node_name} to cut the target volume for its "
                f"verification{said}")  # fmt: skip

    # -- Verifying ---------------------------------------------------------------------------

    async def step(self, vm: VolumeMoveObject) -> MoveStatus:
        """The Verifying step: compare, record, then act on what is recorded."""
        s = vm.status
        old = f"PV {s.old_pv} (LogicalVolume {s.source_volume} on node {s.source_node})"
        moved = (f"moved to node {s.target_node}: {human(s.precopy_bytes)} pre-copied, "
                 f"{human(s.delta_bytes)} in the final copy, {s.downtime_seconds} s of downtime; "
                 "verified")  # fmt: skip
        if s.verified and (doubt := await self.doubt(vm)):
            return self._unverified(vm, Outcome.FAILED, doubt, now())
        if s.verified and vm.keep_source_seconds and not vm.deleting:
            return replace(s, phase=MovePhase.SUCCEEDED, completion_time=now(), progress="100%",
                           old_volume=OldVolume.KEPT,
                           message=f"{moved}; the old volume {old} is kept until "
                           f"{s.keep_source_until}")  # fmt: skip
        if s.verified:
            waiting = await self.ends.remove_old(vm)
            if waiting:
                return replace(s, message=f"verified; {waiting}")
            return replace(s, phase=MovePhase.SUCCEEDED, completion_time=now(), progress="100%",
                           old_volume=OldVolume.REMOVED,
                           message=f"{moved}; the old volume is removed")  # fmt: skip
        await self.request(vm)  # a restarted controller, or a move started before verification
        target = await self.store.get(vm.made_name, fresh=True)
        source, why = await self.source(vm)
        v = verdict.judge(vm.uid, source, target, why)
        if not v.ended:
            return replace(s, message=f"pod {s.pod} runs on node {s.target_node}; verifying the "
                           f"copy: {v.message}")  # fmt: skip
        stamp = now()
        found = replace(s, verify_bytes=v.size, source_digest=v.source_digest,
                        target_digest=v.target_digest, verify_time=stamp,
                        old_volume=OldVolume.KEPT)  # fmt: skip
        if v.outcome == Outcome.MATCH:
            keep = vm.keep_source_seconds
            then = f"keeping the old volume {keep} s" if keep else "removing the old volume"
            cond = Condition(Verified.TYPE, "True", Verified.MATCH, v.message, stamp)
            done = replace(found, keep_source_until=later(stamp, keep) if keep else "",
                           message=f"verified: {v.message}; {then}")  # fmt: skip
            return done.with_condition(cond)
        return self._unverified(replace(vm, status=found), v.outcome, v.message, stamp)

    def _unverified(self, vm: VolumeMoveObject, outcome: str, why: str, stamp: str) -> MoveStatus:
        s = vm.status
        old = f"PV {s.old_pv} (LogicalVolume {s.source_volume} on node {s.source_node})"
        cond = Condition(Verified.TYPE, "False", outcome, why, stamp)
        log.error("a move did not verify: its old volume is kept", extra={
            "move": f"{vm.namespace}/{vm.name}", "reason": outcome, "detail": why})  # fmt: skip
        return replace(
            s, phase=MovePhase.UNVERIFIED, reason=outcome, completion_time=stamp,
            old_volume=OldVolume.KEPT,
            message=f"moved to node {s.target_node} (the pod runs there) but not verified: "
            f"{why}; the old volume {old} is kept: see topolvm doctor",
        ).with_condition(cond)  # fmt: skip

    async def doubt(self, vm: VolumeMoveObject) -> str:
        """Why the old volume may not go although the status says verified ("": it may go).
        The status is not trusted (whoever writes ``volumemoves/status`` could say verified):
        the nodes' own words are judged again, on the target copied from that very source."""
        target = await self.store.get(vm.made_name, fresh=True)
        old_pv = vm.status.old_pv
        source, why = await self.source(vm)
        if source is None and (
            not old_pv or await api.get(self.client, PersistentVolume, old_pv) is None
        ):  # removed by an earlier pass (or another controller) after judging: the LV it asked
            named = vm.status.source_volume
            source = await self.store.get(named, fresh=True) if named else None
            if source is not None and (source.name == vm.made_name or source.verify_id != vm.uid):
                source = None
            why = f"the old PV {old_pv or '(none)'} is gone"
            if source is None:  # nothing of the old volume left to remove: nothing to doubt
                return ""
        v = verdict.judge(vm.uid, source, target, why)
        if v.outcome != Outcome.MATCH:
            return f"the nodes' digests do not show the copy verified ({v.message})"
        assert source is not None and target is not None
        if target.copy_source != source.name:
            return (f"the target {target.name} was copied from {target.copy_source or 'nothing'}"
                    f", not from the old volume {source.name}")  # fmt: skip
        return ""

    async def keep_left(self, vm: VolumeMoveObject) -> float | None:
        """Seconds the old volume is still kept, counted from the target's digest's end (the
        node's word) and ``spec.keepSourceSeconds``; None if that time cannot be read (kept)."""
        target = await self.store.get(vm.made_name, fresh=True)
        st = verdict.own(vm.uid, target) if target is not None else None
        if st is None:
            return None
        try:
            until = later(st.completion_time, vm.keep_source_seconds)
        except ValueError:
            return None
        return seconds_until(until)

    # -- after Succeeded ---------------------------------------------------------------------

    async def after(self, vm: VolumeMoveObject) -> tuple[MoveStatus | None, float | None]:
        """A Succeeded move that keeps its old volume: once ``keepSourceUntil`` is past (or
        the VolumeMove is being deleted) the old volume goes. The status to write (None:
        none), and when to look again (None: never)."""
        s = vm.status
        if s.phase != MovePhase.SUCCEEDED or s.old_volume != OldVolume.KEPT:
            return None, None
        if not vm.deleting:
            left = await self.keep_left(vm)
            if left is None:  # the node's word cannot be read: kept, looked at again
                return None, 300.0
            if left > 0:
                return None, left
        if doubt := await self.doubt(vm):
            log.error("a kept old volume is not removed", extra={
                "move": f"{vm.namespace}/{vm.name}", "detail": doubt})  # fmt: skip
            return replace(s, old_volume=OldVolume.LEFT,
                           message=f"{s.message}; then left alone: {doubt}"), None  # fmt: skip
        try:
            waiting = await self.ends.remove_old(vm)
        except Fenced as e:  # someone took the old PV (bound a claim to it): theirs now
            log.warning("the kept old volume is left alone", extra={
                "move": f"{vm.namespace}/{vm.name}", "detail": str(e)})  # fmt: skip
            return replace(s, old_volume=OldVolume.LEFT,
                           message=f"{s.message}; then left alone: {e}"), None  # fmt: skip
        if waiting:  # the fence's word: looked at again
            log.warning("the kept old volume cannot be removed yet", extra={
                "move": f"{vm.namespace}/{vm.name}", "detail": waiting})  # fmt: skip
            return None, 30.0
        text = s.message.split("; the old volume ", 1)[0]
        return replace(s, old_volume=OldVolume.REMOVED,
                       message=f"{text}; the old volume was kept until {s.keep_source_until}, "
                       "then removed"), None  # fmt: skip

"""VolumeMove reconciler: moves a claim with its data to another node (docs/mobility.md).

Each pass reads the VolumeMove and does what its phase asks, idempotently, writing the next
phase to ``status`` before the step that depends on it (so a restarted controller, or another
leader, goes on from there):

- Pending: the checks of :mod:`topolvm.move.rules` (a refusal changes nothing); the target
  node; the old PV set to Retain (nothing deletes the original until the move is done).
- PreCopy: the target LogicalVolume is filled from a first cut of the claim's LV (the one
  whose volume id is the old PV's volumeHandle, which the status must name) while the pod
  runs (``spec.copy.keepCut``: the source's node keeps that cut).
- Stopping: the pod is deleted; its controller's new pod is held by the scheduling gate
  ``<plugin>/move`` (the pod webhook adds it while the claim moves), so it cannot start on the
  old node. Downtime starts.
- FinalCopy: ``spec.copy.round: 2``: only what changed since the first cut travels.
- Swapping: the target checked to hold the final round of a copy from the source the old PV
  names (:func:`topolvm.move.target.final_copy_of`); the group's commit (``commitTime`` on
  every member, :mod:`.movegroup`); both
  volumes asked for a digest as of now (:mod:`.moveverify`); the claim re-created under its
  name, bound to a new PV on the target node.
- Starting: once the target is cut for its digest, the gate is removed.
- Verifying: the pod runs on the target; once both digests match (condition ``Verified``) the
  old PV and LV go (or are kept ``spec.keepSourceSeconds``): Succeeded. A mismatch keeps them:
  Unverified.

A step that fails before the group's commit (the copy failed, the pod came back on the old
node, the VolumeMove was deleted) rolls back: the target LV is deleted, the old PV's reclaim
policy restored, the pod let go where it was. From then on the move only goes forward: a
rollback asked for later keeps the phase and says it cannot roll back.

Fencing (docs/mobility.md): a status write is a compare-and-swap against the version the pass
read; on a conflict the pass reads the VolumeMove again and decides again from the phase it
finds, and it never writes a phase that does not follow the one it read (:func:`may_write`).
What a move deletes is checked first (:mod:`.moveends`, :mod:`topolvm.move.fence`). When a move
ends, the gate sweep (:mod:`.gatesweep`) looks for pods its rollback could not see.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import Lock
from collections.abc import Awaitable, Callable
from dataclasses import replace

from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolumeClaim

from topolvm.constants import Names
from topolvm.controller import gatesweep, movegroup, movesteps
from topolvm.controller.gatesweep import GateSweep
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.moveends import Ends
from topolvm.controller.movegroup import Group
from topolvm.controller.moveprepull import PrePull
from topolvm.controller.movesteps import Fenced, Rollback, Stale
from topolvm.controller.moveverify import Verify
from topolvm.controller.nodecleanup import counted, run_controller
from topolvm.controller.pvcresize import _AllNamespacesInformer
from topolvm.k8s import api, events
from topolvm.k8s import errors as kube
from topolvm.k8s.lvstore import LogicalVolumeStore, VolumeRequest
from topolvm.k8s.moveobject import (
    GROUP,
    KIND,
    MovePhase,
    MoveStatus,
    OldVolume,
    VolumeMoveObject,
    may_write,
)
from topolvm.k8s.runtime import Controller, Informer, ReconcileError, Result, object_key
from topolvm.k8s.stamps import now, seconds_since
from topolvm.move import claims, rules
from topolvm.move import target as target_copy
from topolvm.move.notes import notes
from topolvm.move.prepull import ImagesPulled
from topolvm.units import human

log = logging.getLogger(__name__)
CONTROLLER_NAME = "volumemove"
POLL = 1.0  # a move in progress is looked at this often (besides its events)
POLL_DOWN = 0.25  # and while its pod is down: each wait (the pod gone, the copy, the claim
# bound, the pod running) ends that much sooner
FENCED_RETRY = 30.0  # a move whose delete its fence refused looks again this often
DECIDE_AGAIN = 5  # a pass whose write meets a newer version reads and decides again, so often


class MoveReconciler:
    def __init__(
        self, client: AsyncClient, names: Names, store: LogicalVolumeStore,
        metrics: ControllerMetrics | None = None, *, resync: float = 600.0,
        gate_sweep: float = gatesweep.INTERVAL,
    ) -> None:  # fmt: skip
        self.client = client
        self.names = names
        self.store = store
        self.resource = api.volumemove_resource(names)
        self.gate = claims.gate_name(names.plugin)
        self.steps = movesteps.Steps(client, names, store, self.gate)
        self.prepull = PrePull(client)
        self.ends = Ends(self.steps, self.prepull)
        self.verify = Verify(self.steps, self.ends)
        self.sweep = GateSweep(client, names, interval=gate_sweep)
        self.resync = resync
        self._locks: dict[str, Lock] = {}  # a group's moves, one at a time (movegroup.key)
        self.reconcile = counted(metrics, CONTROLLER_NAME, self._reconcile)

    async def run(self) -> None:
        informer: Informer = _AllNamespacesInformer(self.client, self.resource, resync=self.resync)
        controller = Controller(CONTROLLER_NAME, self.reconcile, workers=2, max_backoff=30.0)

        def on_event(event: str, obj: api.Obj) -> None:
            self.sweep.seen(str(obj["metadata"].get("namespace") or ""))
            if event != "DELETED":
                controller.enqueue(object_key(obj))

        informer.add_handler(on_event)
        log.info("VolumeMove reconciler started", extra={"plugin": self.names.plugin})
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.sweep.run(), name="move-gate-sweep")
            tg.create_task(run_controller(informer, controller), name=CONTROLLER_NAME)

    # -- status ----------------------------------------------------------------------------

    async def _write(
        self, vm: VolumeMoveObject, status: MoveStatus, *, aborted: bool = False
    ) -> VolumeMoveObject:
        """``status`` over the one this pass read, as a compare-and-swap: :class:`Stale` if
        the VolumeMove changed since (the pass decides again). ``aborted``: the group's commit
        can never be whole (a member rolled back without it), so a member with ``commitTime``
        may roll back too."""
        if not may_write(vm.status, status, aborted=aborted):  # a bug: never done
            raise ReconcileError(f"VolumeMove {vm.namespace}/{vm.name}: phase {status.phase} "
                                 f"does not follow {vm.status.phase}; not written")  # fmt: skip
        if status == vm.status:
            return vm
        known = {"apiVersion": f"{GROUP}/v1", "kind": KIND,
                 "metadata": {"name": vm.name, "namespace": vm.namespace,
                              "resourceVersion": vm.resource_version}}  # fmt: skip
        try:
            stored = await api.write_status(self.client, self.resource, known, status.to_dict())
        except kube.NotFound as e:
            raise ReconcileError(f"VolumeMove {vm.namespace}/{vm.name} is gone") from e
        except kube.Conflict as e:
            raise Stale(
                f"VolumeMove {vm.namespace}/{vm.name} changed since this pass read it "
                f"(phase {vm.status.phase}, resourceVersion {vm.resource_version})"
            ) from e
        if status.phase != vm.status.phase:
            ctx = {"move": f"{vm.namespace}/{vm.name}", "from": vm.status.phase,
                   "to": status.phase, "detail": status.message}  # fmt: skip
            log.info("move step", extra=ctx)
        for note in notes(vm.status, status):
            ref = events.ObjectRef(KIND, vm.namespace, vm.name, f"{GROUP}/v1")
            claim = events.ObjectRef("PersistentVolumeClaim", vm.namespace, vm.claim)
            for obj in (ref, claim):
                await events.post(self.client, obj, note.reason, note.message,
                                  warning=note.warning, component="topolvm-controller")  # fmt: skip
        return VolumeMoveObject.from_dict(stored)

    # -- the state machine -----------------------------------------------------------------

    async def _reconcile(self, key: str) -> Result | None:
        namespace, _, name = key.partition("/")
        obj = await api.get(self.client, self.resource, name, namespace=namespace)
        if obj is None:
            return None
        # the moves of claims that move together, one at a time: each decides on the others'
        # settled state (two workers could otherwise swap one and roll back another)
        lock = self._locks.setdefault(movegroup.key(VolumeMoveObject.from_dict(obj)), Lock())
        async with lock:
            for attempt in range(1, DECIDE_AGAIN + 1):
                try:
                    return await self._locked(namespace, name, again=attempt > 1)
                except Stale as e:
                    log.info("the move changed under this pass: reading it again to decide "
                             "again", extra={"move": key, "detail": str(e),
                                             "attempt": attempt})  # fmt: skip
        raise ReconcileError(f"VolumeMove {key} changed under each of {DECIDE_AGAIN} passes")

    async def _locked(self, namespace: str, name: str, *, again: bool) -> Result | None:
        obj = await api.get(self.client, self.resource, name, namespace=namespace)
        if obj is None:
            return None
        vm = VolumeMoveObject.from_dict(obj)
        if vm.done:
            return await self._after(vm, again)
        handlers: dict[str, Callable[[VolumeMoveObject, Group], Awaitable[MoveStatus]]] = {
            MovePhase.PENDING: self._plan,
            MovePhase.PRE_COPY: self._precopy,
            MovePhase.STOPPING: self._stopping,
            MovePhase.FINAL_COPY: self._final,
            MovePhase.SWAPPING: self._swap,
            MovePhase.STARTING: self._starting,
            MovePhase.VERIFYING: self._verifying,
            MovePhase.ROLLING_BACK: self._rollback,
        }
        group = await Group.read(self.client, self.names, vm)
        try:
            # a claim moved with this one is swapped already: this one only goes forward
            if (vm.deleting and vm.status.phase in movesteps.BEFORE_SWAP
                    and not group.rollback_blocked()):  # fmt: skip
                raise Rollback("Cancelled", "the VolumeMove was deleted before the swap")
            status = await handlers[vm.status.phase](vm, group)
        except rules.Refused as r:
            status = replace(vm.status, phase=MovePhase.REFUSED, reason=r.reason,
                             message=r.message, completion_time=now())  # fmt: skip
        except Rollback as r:
            if blocked := group.rollback_blocked():  # this one can only go forward
                log.error("a move cannot roll back", extra={
                    "move": f"{vm.namespace}/{vm.name}", "detail": r.message})  # fmt: skip
                status = replace(vm.status, message=f"cannot roll back ({r.message}): {blocked}; "
                                 "the move goes on once that is mended")  # fmt: skip
            else:
                status = replace(vm.status, phase=MovePhase.ROLLING_BACK, reason=r.reason,
                                 message=f"rolling back: {r.message}")  # fmt: skip
        except Fenced as f:  # not deleted: a person must look (the message says what)
            log.error("a move's delete was refused by its fence", extra={
                "move": f"{vm.namespace}/{vm.name}", "phase": vm.status.phase,
                "detail": str(f)})  # fmt: skip
            await self._write(vm, replace(vm.status, message=f"stopped: {f}"))
            return Result(requeue_after=FENCED_RETRY)
        aborted = bool(group.aborted)
        vm = await self._write(vm, replace(status, together_seen=group.seen_now), aborted=aborted)
        if vm.done:
            self.sweep.soon(vm.namespace)
            return None
        return Result(requeue_after=POLL_DOWN if vm.status.phase in MovePhase.DOWN else POLL)

    async def _after(self, vm: VolumeMoveObject, again: bool) -> Result | None:
        """A done move: a Succeeded one that keeps its old volume removes it once the keep is
        over (or the VolumeMove is deleted); its finalizer goes when it is deleted, once no
        move of its group is in progress. A rolled-back one whose target LogicalVolume exists
        again (a pass on an old read made it after the rollback) is rolled back again; after
        a conflict, the gate sweep looks at its namespace."""
        if vm.status.phase == MovePhase.ROLLED_BACK and (
            again or await self.store.get(vm.made_name) is not None
        ):
            await self.ends.rollback(vm)
        if again:
            self.sweep.soon(vm.namespace)
        await self.prepull.remove(vm)  # one a pass on an old read made again
        status, wait = await self.verify.after(vm)
        if status is not None:
            vm = await self._write(vm, status)
        if wait is not None:
            return Result(requeue_after=max(wait, POLL))
        keeping = vm.status.phase == MovePhase.SUCCEEDED and vm.status.old_volume == OldVolume.KEPT
        if vm.deleting and not keeping:
            group = await Group.read(self.client, self.names, vm)
            if busy := group.busy():
                log.info("a done move is kept while its group moves", extra={
                    "move": f"{vm.namespace}/{vm.name}", "waiting_for": busy})  # fmt: skip
                return Result(requeue_after=POLL)
            await self.steps.release(vm)
        return None

    async def _plan(self, vm: VolumeMoveObject, group: Group) -> MoveStatus:
        if vm.name != vm.claim:  # the pod webhook finds a claim's move by the claim's name
            raise rules.Refused(
                "NameNotClaim", f"a VolumeMove is named after its claim: name it {vm.claim!r}, "
                f"not {vm.name!r} (topolvm move does)"
            )  # fmt: skip
        plan = await self.steps.plan(vm)
        group.check_agreed()
        vm.resource_version = await self.steps.ensure_finalizer(vm)  # the status as read
        # the old PV is set to Retain in PreCopy: first the status keeps its own policy
        return replace(
            plan, phase=MovePhase.PRE_COPY, start_time=now(),
            message=f"copying the claim's data from node {plan.source_node} to node "
            f"{plan.target_node} while pod {plan.pod} runs",
        )  # fmt: skip

    async def _precopy(self, vm: VolumeMoveObject, group: Group) -> MoveStatus:
        s = vm.status
        group.check_alive(seconds_since(vm.created))
        await self.steps.retain(vm)  # nothing deletes the original until the move is done
        if not group.past_precopy:  # else the pod was stopped by the move of another claim
            await self.steps.running_pod(vm)  # the pod stopped meanwhile: roll back
        source = await self.steps.checked_source(vm)  # the old PV's, as the status says
        request = VolumeRequest(
            vm.made_name, s.target_node, s.size_bytes, s.device_class,
            copy_source=source.name, copy_keep_cut=True,
            annotations=((self.names.claim_annotation, f"{vm.namespace}/{vm.claim}"),),
            io_limits=tuple(sorted(source.io_limits.items())),  # the claim's class goes along
        )  # fmt: skip
        target = await self.steps.target(request)
        progress = target_copy.progress(MovePhase.PRE_COPY, target)
        pulling = ""  # the pod's images are pulled on the target meanwhile (moveprepull)
        if (pulled := s.condition(ImagesPulled.TYPE)) is None:
            if group.puller == vm.claim:  # one pull for the pod, by its first claim's move
                pulled, pulling = await self.prepull.check(vm)
            else:
                pulled = group.pulled_for_group()
                pulling = f"its images are pulled by the move of claim {group.puller}"
            s = s if pulled is None else s.with_condition(pulled)
        if not target.copy_done:
            return replace(s, **progress)
        waiting = await group.waiting(self.store, MovePhase.PRE_COPY, "pre-copy")
        precopied = target.copy.transferred_bytes if target.copy else 0
        if waiting or pulled is None:
            return replace(s, **progress, message=waiting or f"pre-copy done; {pulling}")
        return replace(
            s, **progress, phase=MovePhase.STOPPING, stop_time=now(), precopy_bytes=precopied,
            message=f"pre-copy done ({human(precopied)} sent), images {pulled.message}; "
            f"stopping pod {s.pod}",
        )  # fmt: skip

    async def _stopping(self, vm: VolumeMoveObject, group: Group) -> MoveStatus:
        s = vm.status
        group.check_alive(seconds_since(vm.created))
        await self.prepull.remove(vm)  # its work is done (the images stay on the node)
        waiting = await self.steps.stop_pod(vm)
        if waiting:
            return replace(s, message=waiting)
        await self.steps.second_round(vm.made_name)
        return replace(
            s, phase=MovePhase.FINAL_COPY,
            message=f"pod {s.pod} stopped; copying what changed since the pre-copy",
        )  # fmt: skip

    async def _final(self, vm: VolumeMoveObject, group: Group) -> MoveStatus:
        s = vm.status
        group.check_alive(seconds_since(vm.created))
        await self.steps.no_pod_on_old_node(vm)
        target = await self.steps.target(None, vm.made_name)
        progress = target_copy.progress(MovePhase.FINAL_COPY, target)
        if not target.copy_done:
            return replace(s, **progress)
        # the target is final (its last round copied; only the pod, started after the swap,
        # writes it): its verification cut is made now, while the group's other copies and the
        # swap run, not after the swap with the pod down. The source's waits for the commit.
        await self.verify.request_target(vm, target)
        waiting = await group.waiting(self.store, MovePhase.FINAL_COPY, "final copy")
        if waiting:
            return replace(s, **progress, message=waiting)
        await self.steps.no_pod_on_old_node(vm)
        pvc = await api.get(self.client, PersistentVolumeClaim, vm.claim, namespace=vm.namespace)
        template = claims.claim_template(pvc) if pvc is not None else s.claim_template
        delta = target.copy.transferred_bytes if target.copy else 0
        return replace(
            s, **progress, phase=MovePhase.SWAPPING, swap_time=now(), delta_bytes=delta,
            claim_template=s.claim_template or template,
            message=f"final copy done ({human(delta)} sent); re-creating claim "
            f"{vm.claim} on volume {vm.made_name}",
        )  # fmt: skip

    async def _swap(self, vm: VolumeMoveObject, group: Group) -> MoveStatus:
        if aborted := group.aborted:  # a member rolled back before the commit was whole
            raise Rollback("TogetherFailed", f"the move of claim {', '.join(aborted)}, which "
                           "moves with this one, rolled back before the group's "
                           "commit")  # fmt: skip
        if not group.commit_complete:
            if not vm.status.commit_time:
                group.check_alive(seconds_since(vm.created))
            waiting = group.not_swapping() or await self.steps.swap(vm, committed=False)
            if waiting:
                return replace(vm.status, message=waiting)
            # recorded on every member before any old claim is deleted: no way back after it
            text = (f"deleting claim {vm.claim}, to re-create it bound to {vm.made_name} on "
                    f"node {vm.status.target_node}")  # fmt: skip
            await group.commit(self._write, now(), text)
        await self.verify.request(vm)  # the pod down: both volumes' digests as of now
        waiting = await self.steps.swap(vm, committed=True)
        s = vm.status
        if waiting:
            return replace(s, message=waiting)
        return replace(s, phase=MovePhase.STARTING,
                       message=f"claim {vm.claim} bound on node {s.target_node}; starting the pod "
                       "there once its volume is cut for the verification")  # fmt: skip

    async def _starting(self, vm: VolumeMoveObject, group: Group) -> MoveStatus:
        s = vm.status
        waiting = await group.waiting(self.store, MovePhase.SWAPPING, "swap")
        if waiting:  # the pod is let go once all its claims are on the target, and cut
            return replace(s, message=waiting)
        waiting = (await self.verify.request(vm) or await self.verify.cut_waiting(vm)
                   or await group.cuts_waiting(self.store)
                   or await self.steps.start_pod(vm))  # fmt: skip
        if waiting:
            return replace(s, message=waiting)
        down = seconds_since(s.stop_time)
        return replace(
            s, phase=MovePhase.VERIFYING, downtime_seconds=down, progress="Verifying",
            old_volume=OldVolume.KEPT,
            message=f"pod {s.pod} runs on node {s.target_node} after {down} s of downtime; "
            "verifying the copy before the old volume goes",
        )  # fmt: skip

    async def _verifying(self, vm: VolumeMoveObject, group: Group) -> MoveStatus:
        return await self.verify.step(vm)

    async def _rollback(self, vm: VolumeMoveObject, group: Group) -> MoveStatus:
        if blocked := group.rollback_blocked():  # RollingBack written over a swapped move
            log.error("a move in RollingBack cannot roll back", extra={
                "move": f"{vm.namespace}/{vm.name}", "detail": blocked})  # fmt: skip
            return replace(vm.status, message=f"cannot roll back: {blocked}; nothing is "
                           "deleted: a person must look (docs/mobility.md)")  # fmt: skip
        await self.ends.rollback(vm)
        text = vm.status.message.replace("rolling back: ", "rolled back: ", 1)
        return replace(vm.status, phase=MovePhase.ROLLED_BACK, completion_time=now(), message=text)

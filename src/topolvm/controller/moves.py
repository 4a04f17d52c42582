"""VolumeMove reconciler: moves a claim with its data to another node (docs/mobility.md).

Each pass reads the VolumeMove and does what its phase asks, idempotently, writing the next
phase to ``status`` before the step that depends on it (so a restarted controller, or another
leader, goes on from there):

- Pending: the checks of :mod:`topolvm.move.rules` (a refusal changes nothing); the target
  node; the old PV set to Retain (nothing deletes the original until the move is done).
- PreCopy: the target LogicalVolume is filled from a first cut of the claim's LV while the
  pod runs (``spec.copy.keepCut``: the source's node keeps that cut).
- Stopping: the pod is deleted; its controller's new pod is held by the scheduling gate
  ``<plugin>/move`` (the pod webhook adds it while the claim moves), so it cannot start on the
  old node. Downtime starts.
- FinalCopy: ``spec.copy.round: 2``: only what changed since the first cut travels.
- Swapping: the claim is re-created under its name, bound to a new PV on the target node.
- Starting: the gate is removed; once the pod runs on the target, the old PV and LV go.

A step that fails before Swapping (the copy failed, the pod came back on the old node, the
VolumeMove was deleted) rolls back: the target LV is deleted, the old PV's reclaim policy
restored, the pod let go where it was. From Swapping on the move only goes forward.
"""

from __future__ import annotations

import logging
import time
from asyncio import Lock
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime

from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolumeClaim

from topolvm.constants import Names
from topolvm.controller import movegroup, movesteps
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.movegroup import Group
from topolvm.controller.movesteps import Rollback
from topolvm.controller.nodecleanup import counted, run_controller
from topolvm.controller.pvcresize import _AllNamespacesInformer
from topolvm.k8s import api, events
from topolvm.k8s.lvstore import LogicalVolumeStore, VolumeRequest
from topolvm.k8s.moveobject import GROUP, KIND, MovePhase, MoveStatus, VolumeMoveObject
from topolvm.k8s.runtime import Controller, Informer, ReconcileError, Result, object_key
from topolvm.move import claims, rules
from topolvm.units import human

log = logging.getLogger(__name__)
CONTROLLER_NAME = "volumemove"
POLL = 1.0  # a move in progress is looked at this often (besides its events)
POLL_DOWN = 0.25  # and while its pod is down: each wait (the pod gone, the copy, the claim
# bound, the pod running) ends that much sooner


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds_since(stamp: str) -> int:
    try:
        then = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return 0
    return max(0, int(time.time() - then.timestamp()))


class MoveReconciler:
    def __init__(
        self, client: AsyncClient, names: Names, store: LogicalVolumeStore,
        metrics: ControllerMetrics | None = None, *, resync: float = 600.0,
    ) -> None:  # fmt: skip
        self.client = client
        self.names = names
        self.store = store
        self.resource = api.volumemove_resource(names)
        self.gate = claims.gate_name(names.plugin)
        self.steps = movesteps.Steps(client, names, store, self.gate)
        self.resync = resync
        self._locks: dict[str, Lock] = {}  # a group's moves, one at a time (movegroup.key)
        self.reconcile = counted(metrics, CONTROLLER_NAME, self._reconcile)

    async def run(self) -> None:
        informer: Informer = _AllNamespacesInformer(self.client, self.resource, resync=self.resync)
        controller = Controller(CONTROLLER_NAME, self.reconcile, workers=2, max_backoff=30.0)

        def on_event(event: str, obj: api.Obj) -> None:
            if event != "DELETED":
                controller.enqueue(object_key(obj))

        informer.add_handler(on_event)
        log.info("VolumeMove reconciler started", extra={"plugin": self.names.plugin})
        await run_controller(informer, controller)

    # -- status ----------------------------------------------------------------------------

    async def _write(self, vm: VolumeMoveObject, status: MoveStatus) -> VolumeMoveObject:
        def mutate(obj: api.Obj) -> bool:
            wanted = status.to_dict()
            if obj.get("status") == wanted:
                return False
            obj["status"] = wanted
            return True

        stored = await api.modify(
            self.client, self.resource, vm.name, mutate, status=True, namespace=vm.namespace
        )
        if stored is None:
            raise ReconcileError(f"VolumeMove {vm.namespace}/{vm.name} is gone")
        if status.phase != vm.status.phase:
            ctx = {"move": f"{vm.namespace}/{vm.name}", "from": vm.status.phase,
                   "to": status.phase, "detail": status.message}  # fmt: skip
            log.info("move step", extra=ctx)
            await self._event(vm, status)
        return VolumeMoveObject.from_dict(stored)

    async def _event(self, vm: VolumeMoveObject, status: MoveStatus) -> None:
        warning = status.phase in (MovePhase.ROLLING_BACK, MovePhase.ROLLED_BACK,
                                   MovePhase.REFUSED)  # fmt: skip
        reasons = {MovePhase.SUCCEEDED: "Moved", MovePhase.ROLLED_BACK: "MoveRolledBack",
                   MovePhase.REFUSED: "MoveRefused"}  # fmt: skip
        reason = reasons.get(status.phase, f"Move{status.phase}")
        text = status.message
        ref = events.ObjectRef(KIND, vm.namespace, vm.name, f"{GROUP}/v1")
        await events.post(self.client, ref, reason, text, warning=warning,
                          component="topolvm-controller")  # fmt: skip
        claim = events.ObjectRef("PersistentVolumeClaim", vm.namespace, vm.claim)
        await events.post(self.client, claim, reason, text, warning=warning,
                          component="topolvm-controller")  # fmt: skip

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
            return await self._locked(namespace, name)

    async def _locked(self, namespace: str, name: str) -> Result | None:
        obj = await api.get(self.client, self.resource, name, namespace=namespace)
        if obj is None:
            return None
        vm = VolumeMoveObject.from_dict(obj)
        if vm.done:
            if vm.deleting:
                await self.steps.release(vm)
            return None
        handlers: dict[str, Callable[[VolumeMoveObject, Group], Awaitable[MoveStatus]]] = {
            MovePhase.PENDING: self._plan,
            MovePhase.PRE_COPY: self._precopy,
            MovePhase.STOPPING: self._stopping,
            MovePhase.FINAL_COPY: self._final,
            MovePhase.SWAPPING: self._swap,
            MovePhase.STARTING: self._starting,
            MovePhase.ROLLING_BACK: self._rollback,
        }
        group = await Group.read(self.client, self.names, vm)
        try:
            # a claim moved with this one is swapped already: this one only goes forward
            if vm.deleting and vm.status.phase in movesteps.BEFORE_SWAP and not group.committed:
                raise Rollback("Cancelled", "the VolumeMove was deleted before the swap")
            status = await handlers[vm.status.phase](vm, group)
        except rules.Refused as r:
            status = replace(vm.status, phase=MovePhase.REFUSED, reason=r.reason,
                             message=r.message, completion_time=now())  # fmt: skip
        except Rollback as r:
            if swapped := group.committed:  # this one can only go forward
                log.error("a move cannot roll back", extra={
                    "move": f"{vm.namespace}/{vm.name}", "detail": r.message})  # fmt: skip
                status = replace(
                    vm.status, message=f"cannot roll back ({r.message}): {', '.join(swapped)}, "
                    "moved with this claim, swapped already; the move goes on once that is mended"
                )  # fmt: skip
            else:
                status = replace(vm.status, phase=MovePhase.ROLLING_BACK, reason=r.reason,
                                 message=f"rolling back: {r.message}")  # fmt: skip
        vm = await self._write(vm, replace(status, together_seen=group.seen_now))
        if vm.done:
            return None
        return Result(requeue_after=POLL_DOWN if vm.status.phase in MovePhase.DOWN else POLL)

    async def _plan(self, vm: VolumeMoveObject, group: Group) -> MoveStatus:
        if vm.name != vm.claim:  # the pod webhook finds a claim's move by the claim's name
            raise rules.Refused(
                "NameNotClaim", f"a VolumeMove is named after its claim: name it {vm.claim!r}, "
                f"not {vm.name!r} (topolvm move does)"
            )  # fmt: skip
        plan = await self.steps.plan(vm)
        group.check_agreed()
        await self.steps.ensure_finalizer(vm)
        # the old PV is set to Retain in PreCopy: first the status keeps its own policy
        return replace(
            plan, phase=MovePhase.PRE_COPY, start_time=now(),
            message=f"copying the claim's data from node {plan.source_node} to node "
            f"{plan.target_node} while pod {plan.pod} runs",
        )  # fmt: skip

    async def _precopy(self, vm: VolumeMoveObject, group: Group) -> MoveStatus:
        s = vm.status
        group.check_alive(_seconds_since(vm.created))
        await self.steps.retain(s.old_pv)  # nothing deletes the original until the move is done
        if not group.past_precopy:  # else the pod was stopped by the move of another claim
            await self.steps.running_pod(vm)  # the pod stopped meanwhile: roll back
        request = VolumeRequest(
            s.target_volume, s.target_node, s.size_bytes, s.device_class,
            copy_source=s.source_volume, copy_keep_cut=True,
            annotations=((self.names.claim_annotation, f"{vm.namespace}/{vm.claim}"),),
        )  # fmt: skip
        target = await self.steps.target(request)
        progress = movesteps.progress(MovePhase.PRE_COPY, target)
        if not target.copy_done:
            return replace(s, **progress)
        waiting = await group.waiting(self.store, MovePhase.PRE_COPY, "pre-copy")
        if waiting:
            return replace(s, **progress, message=waiting)
        precopied = target.copy.transferred_bytes if target.copy else 0
        return replace(
            s, **progress, phase=MovePhase.STOPPING, stop_time=now(), precopy_bytes=precopied,
            message=f"pre-copy done ({human(precopied)} sent); stopping pod {s.pod}",
        )  # fmt: skip

    async def _stopping(self, vm: VolumeMoveObject, group: Group) -> MoveStatus:
        s = vm.status
        group.check_alive(_seconds_since(vm.created))
        waiting = await self.steps.stop_pod(vm)
        if waiting:
            return replace(s, message=waiting)
        await self.steps.second_round(s.target_volume)
        return replace(
            s, phase=MovePhase.FINAL_COPY,
            message=f"pod {s.pod} stopped; copying what changed since the pre-copy",
        )  # fmt: skip

    async def _final(self, vm: VolumeMoveObject, group: Group) -> MoveStatus:
        s = vm.status
        group.check_alive(_seconds_since(vm.created))
        await self.steps.no_pod_on_old_node(vm)
        target = await self.steps.target(None, s.target_volume)
        progress = movesteps.progress(MovePhase.FINAL_COPY, target)
        if not target.copy_done:
            return replace(s, **progress)
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
            f"{vm.claim} on volume {s.target_volume}",
        )  # fmt: skip

    async def _swap(self, vm: VolumeMoveObject, group: Group) -> MoveStatus:
        s = vm.status
        waiting = await self.steps.swap(vm)
        if waiting:
            return replace(s, message=waiting)
        return replace(s, phase=MovePhase.STARTING,
                       message=f"claim {vm.claim} bound on node {s.target_node}; starting the pod "
                       "there")  # fmt: skip

    async def _starting(self, vm: VolumeMoveObject, group: Group) -> MoveStatus:
        s = vm.status
        waiting = await group.waiting(self.store, MovePhase.SWAPPING, "swap")
        if waiting:  # the pod is let go once all its claims are on the target
            return replace(s, message=waiting)
        waiting = await self.steps.start_pod(vm)
        if waiting:
            return replace(s, message=waiting)
        await self.steps.remove_old(vm)
        down = _seconds_since(s.stop_time)
        return replace(
            s, phase=MovePhase.SUCCEEDED, completion_time=now(), downtime_seconds=down,
            progress="100%",
            message=f"moved to node {s.target_node}: {human(s.precopy_bytes)} "
            f"pre-copied, {human(s.delta_bytes)} in the final copy, {down} s of "
            "downtime; the old volume is removed",
        )  # fmt: skip

    async def _rollback(self, vm: VolumeMoveObject, group: Group) -> MoveStatus:
        await self.steps.rollback(vm)
        text = vm.status.message.replace("rolling back: ", "rolled back: ", 1)
        return replace(vm.status, phase=MovePhase.ROLLED_BACK, completion_time=now(), message=text)

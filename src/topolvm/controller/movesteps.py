"""The API work of each step of a move (see :mod:`.moves`); every method may run again after
a crash at any point, and finds what an earlier run did."""

from __future__ import annotations

import contextlib
import logging

from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim, Pod

from topolvm.constants import Names
from topolvm.controller.gatesweep import lift_gate
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import CopyPhase, LogicalVolumeObject
from topolvm.k8s.lvstore import IncompatibleVolume, LogicalVolumeStore, VolumeRequest
from topolvm.k8s.moveobject import MovePhase, MoveStatus, VolumeMoveObject
from topolvm.move import claims, fence, reads, rules
from topolvm.move.target import final_copy_of

log = logging.getLogger(__name__)
BEFORE_SWAP = frozenset({MovePhase.PENDING, MovePhase.PRE_COPY, MovePhase.STOPPING,
                         MovePhase.FINAL_COPY})  # fmt: skip
FINALIZER = "volumemove"


class Rollback(Exception):
    """The move cannot go on: roll back to the original (``reason``, message)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Fenced(Exception):
    """A delete the fence refused (:mod:`topolvm.move.fence`): the object is not the one the
    move may delete, or a claim or pod still uses it. The move stays in its phase and says so."""


class Stale(Exception):
    """The VolumeMove changed since this pass read it (another writer, or this pass ran on an
    old read): the pass reads it again and decides again from the phase it finds."""


class Steps:
    def __init__(
        self, client: AsyncClient, names: Names, store: LogicalVolumeStore, gate: str
    ) -> None:
        self.client = client
        self.names = names
        self.store = store
        self.gate = gate
        self.finalizer = f"{names.plugin}/{FINALIZER}"

    # -- Pending ---------------------------------------------------------------------------

    async def _pods(self, namespace: str) -> list[api.Obj]:
        pods, _ = await api.list_all(self.client, Pod, namespace=namespace)
        return pods

    async def plan(self, vm: VolumeMoveObject) -> MoveStatus:
        """The checks, the source and target; raises :class:`rules.Refused`."""
        ns = vm.namespace
        pvc = await api.get(self.client, PersistentVolumeClaim, vm.claim, namespace=ns)
        pv_name = ((pvc or {}).get("spec") or {}).get("volumeName") or ""
        pv = await api.get(self.client, PersistentVolume, pv_name) if pv_name else None
        rules.check_claim(vm.claim, pvc, pv, self.names.plugin)
        assert pvc is not None and pv is not None
        pods = await self._pods(ns)
        users = [p for p in pods if rules.uses_claim(p, vm.claim)]
        owners = await reads.replicaset_owners(self.client, ns, users)
        work = rules.workload(vm.claim, pods, owners)
        pod = next(p for p in users if p["metadata"]["name"] == work.pod)
        local = await reads.local_claims(self.client, self.names.plugin, ns, [pod], vm.claim)
        rules.together(work.pod, vm.claim, local, vm.together)
        if vm.together and not vm.target_node:
            raise rules.Refused(
                "NoTarget", "claims that move together name their target node: set the same "
                "spec.targetNode on the VolumeMove of each (topolvm move does)"
            )  # fmt: skip
        handle = str(pv["spec"]["csi"].get("volumeHandle") or "")
        source = await self.store.find_by_volume_id(handle)
        if source is None:
            raise rules.Refused("NoLogicalVolume", f"no LogicalVolume has volume id {handle}")
        if not source.ready or source.deleting:
            raise rules.Refused("SourceNotReady", f"LogicalVolume {source.name} is not ready")
        size = source.current_size or source.size
        nodes, _ = await api.list_all(self.client, reads.NODE)
        target = rules.target_node(
            source.node_name, size, reads.free_bytes(nodes, self.names, source.device_class),
            reads.schedulable_nodes(nodes), vm.target_node, source.device_class,
            reads.unfit_nodes(nodes, [pod]),
        )  # fmt: skip
        if why := fence.claim_volume(pv, ns, vm.claim, str(pvc["metadata"].get("uid") or ""),
                                     self.names.plugin):  # fmt: skip
            raise rules.Refused("ClaimNotBound", f"claim {vm.claim} is not bound yet: {why}")
        return MoveStatus(
            source_node=source.node_name, target_node=target, source_volume=source.name,
            target_volume=vm.made_name, old_pv=str(pv["metadata"]["name"]),
            new_pv=vm.made_name, pod=work.pod,
            pod_uid=str(pod["metadata"].get("uid") or ""),
            owner=f"{work.owner_kind}/{work.owner}",
            claim_uid=str(pvc["metadata"].get("uid") or ""),
            claim_template=claims.claim_template(pvc),
            reclaim_policy=str(pv["spec"].get("persistentVolumeReclaimPolicy") or "Delete"),
            device_class=source.device_class, size_bytes=size,
        )  # fmt: skip

    async def ensure_finalizer(self, vm: VolumeMoveObject) -> str:
        """Our finalizer on the VolumeMove, the others kept; a compare-and-swap against the
        version this pass read (:class:`Stale` if it changed). The stored resourceVersion."""
        if self.finalizer in vm.finalizers:
            return vm.resource_version
        known = {"metadata": {"name": vm.name, "namespace": vm.namespace,
                              "resourceVersion": vm.resource_version,
                              "finalizers": list(vm.finalizers)}}  # fmt: skip
        try:
            stored = await api.set_finalizer(
                self.client, api.volumemove_resource(self.names), vm.name, self.finalizer, True,
                known=known, namespace=vm.namespace, attempts=1,
            )  # fmt: skip
        except kube.Conflict as e:
            raise Stale(f"VolumeMove {vm.namespace}/{vm.name} changed: {e}") from e
        if stored is None:
            raise Stale(f"VolumeMove {vm.namespace}/{vm.name} is gone")
        return str(stored["metadata"]["resourceVersion"])

    async def release(self, vm: VolumeMoveObject) -> None:
        """A done VolumeMove being deleted: our finalizer goes (only ours)."""
        if self.finalizer in vm.finalizers:
            await api.set_finalizer(self.client, api.volumemove_resource(self.names), vm.name,
                                    self.finalizer, False, namespace=vm.namespace)  # fmt: skip

    async def still(self, vm: VolumeMoveObject) -> None:
        """Before a step that cannot be undone: the VolumeMove is as this pass read it, else
        :class:`Stale` (a pass on an old read must not act)."""
        now = await api.get(self.client, api.volumemove_resource(self.names), vm.name,
                            namespace=vm.namespace)  # fmt: skip
        rv = (now or {}).get("metadata", {}).get("resourceVersion")
        if rv != vm.resource_version:
            raise Stale(f"VolumeMove {vm.namespace}/{vm.name} changed since this pass read it "
                        f"(resourceVersion {vm.resource_version} -> {rv or 'gone'})")  # fmt: skip

    async def old_volume(self, vm: VolumeMoveObject) -> api.Obj:
        """The claim's PV before the move, checked to be it (:func:`fence.claim_volume`):
        :class:`Fenced` if it is not, or gone."""
        name = vm.status.old_pv
        pv = await api.get(self.client, PersistentVolume, name) if name else None
        why = fence.claim_volume(pv, vm.namespace, vm.claim, vm.status.claim_uid,
                                 self.names.plugin)  # fmt: skip
        if pv is None or why:
            raise Fenced(f"the old PersistentVolume {name or '(none recorded)'}: {why}")
        return pv

    async def source(self, vm: VolumeMoveObject) -> tuple[LogicalVolumeObject | None, str]:
        """The move's source LogicalVolume as the old PV (checked to be the claim's) names it:
        the one whose volume id is its ``volumeHandle``, as stored now (the status's
        ``sourceVolume`` is not trusted); else None and why."""
        try:
            pv = await self.old_volume(vm)
        except Fenced as e:
            return None, str(e)
        handle = fence.handle_of(pv)
        found = await self.store.find_by_volume_id(handle) if handle else None
        lv = await self.store.get(found.name, fresh=True) if found is not None else None
        if lv is None or lv.name == vm.made_name or lv.volume_id != handle:
            return None, f"no LogicalVolume has the old PV's volume id {handle or '(none)'}"
        return lv, ""

    async def checked_source(self, vm: VolumeMoveObject) -> LogicalVolumeObject:
        """Before the copy and before the swap: the source found from the old PV
        (:meth:`source`), which must be the one the status names; else the move rolls back."""
        lv, why = await self.source(vm)
        if lv is None:
            raise Rollback("SourceChanged", f"the move's source cannot be found: {why}")
        if lv.name != vm.status.source_volume:
            raise Rollback(
                "SourceChanged", f"the status names LogicalVolume "
                f"{vm.status.source_volume or '(none)'} as the source, but the old PV "
                f"{vm.status.old_pv}'s volume is LogicalVolume {lv.name}"
            )  # fmt: skip
        return lv

    async def retain(self, vm: VolumeMoveObject, policy: str = "Retain") -> None:
        """The old PV's reclaim policy: ``Retain`` while the move runs (a PV that is not the
        claim's rolls the move back), its own when it rolls back (a PV that is not the
        claim's is left as it is)."""
        try:
            pv = await self.old_volume(vm)
        except Fenced as e:
            if vm.status.phase in (MovePhase.ROLLING_BACK, MovePhase.ROLLED_BACK):
                log.warning("reclaim policy not restored", extra=_ctx(vm, str(e)))
                return
            raise Rollback("VolumeChanged", str(e)) from e
        if pv["spec"].get("persistentVolumeReclaimPolicy") == policy:
            return
        # the PV as checked: a change since is a 409 (the next pass checks it again)
        patch = {"metadata": {"resourceVersion": pv["metadata"]["resourceVersion"]},
                 "spec": {"persistentVolumeReclaimPolicy": policy}}  # fmt: skip
        with _gone_ok():
            await api.patch_merge(self.client, PersistentVolume, vm.status.old_pv, patch)

    # -- copies ----------------------------------------------------------------------------

    async def target(self, request: VolumeRequest | None, name: str = "") -> LogicalVolumeObject:
        """The target LogicalVolume (created from ``request`` if missing); a failed one rolls
        the move back."""
        if request is not None:
            try:
                lv = await self.store.create(request)
            except IncompatibleVolume as e:
                raise Rollback("TargetConflict", str(e)) from e
        else:
            found = await self.store.get(name, fresh=True)
            if found is None:
                raise Rollback("TargetGone", f"the target LogicalVolume {name} is gone")
            lv = found
        if lv.code:
            raise Rollback("TargetFailed", f"node {lv.node_name} could not create the target "
                           f"volume: {lv.message}")  # fmt: skip
        if lv.copy is not None and lv.copy.phase == CopyPhase.FAILED:
            raise Rollback("CopyFailed", f"the copy to node {lv.node_name} failed: "
                           f"{lv.copy.message}")  # fmt: skip
        return lv

    async def second_round(self, name: str) -> None:
        def mutate(obj: api.Obj) -> bool:
            copy = obj.setdefault("spec", {}).setdefault("copy", {})
            if copy.get("round") == 2:
                return False
            copy["round"] = 2
            return True

        stored = await api.modify(self.client, self.store.resource, name, mutate)
        if stored is None:
            raise Rollback("TargetGone", f"the target LogicalVolume {name} is gone")

    # -- the pod ---------------------------------------------------------------------------

    async def _users(self, vm: VolumeMoveObject) -> list[api.Obj]:
        return [p for p in await self._pods(vm.namespace) if rules.uses_claim(p, vm.claim)]

    async def running_pod(self, vm: VolumeMoveObject) -> None:
        users = await self._users(vm)
        if not any(p["metadata"].get("uid") == vm.status.pod_uid and
                   (p.get("status") or {}).get("phase") == "Running" for p in users):  # fmt: skip
            raise Rollback("PodStopped", f"pod {vm.status.pod} stopped during the pre-copy")

    async def stop_pod(self, vm: VolumeMoveObject) -> str:
        """Delete the pod; "" once it is gone (what it waits for, else)."""
        users = await self._users(vm)
        old = [p for p in users if p["metadata"].get("uid") == vm.status.pod_uid]
        self._check_held(vm, users)
        if old:
            meta = old[0]["metadata"]
            if not meta.get("deletionTimestamp"):
                await self._gate_works(vm, old[0])
                await self.still(vm)
                # only that pod, as checked: one changed since is looked at again next pass
                with _gone_ok(), contextlib.suppress(kube.PreconditionFailed):  # gone: stopped
                    await api.delete(self.client, Pod, meta["name"], namespace=vm.namespace,
                                     uid=meta["uid"],
                                     resource_version=meta.get("resourceVersion", ""))  # fmt: skip
            return f"waiting for pod {vm.status.pod} to stop on node {vm.status.source_node}"
        return ""

    async def _gate_works(self, vm: VolumeMoveObject, pod: api.Obj) -> None:
        """Before the pod is stopped: a pod like it, created now (a server-side dry run, so
        through the API server's admission webhooks, namespace and object selectors
        included), gets the scheduling gate; else its controller's new pod would start on the
        old node at once, and the move rolls back (the pod still runs)."""
        meta = pod["metadata"]
        probe = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": f"{meta['name']}-move-probe-",
                         "namespace": vm.namespace, "labels": meta.get("labels") or {}},
            "spec": {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"},
        }  # fmt: skip
        try:
            admitted = await api.create(self.client, Pod.from_dict(probe), dry_run=True)
        except kube.KubeError as e:
            raise Rollback("NoGate", f"a pod of claim {vm.claim} could not be checked for the "
                           f"scheduling gate {self.gate}: {kube.describe(e)}") from e  # fmt: skip
        if not claims.gated(admitted, self.gate):
            raise Rollback(
                "NoGate", f"a new pod of claim {vm.claim} would not be held by the scheduling "
                f"gate {self.gate}: the pod webhook does not serve namespace {vm.namespace} "
                "(the chart's webhook.podMutatingWebhook.enabled, its namespace and object "
                "selectors), so the pod would start again on the old node"
            )  # fmt: skip

    def _check_held(self, vm: VolumeMoveObject, users: list[api.Obj]) -> None:
        for pod in users:
            if pod["metadata"].get("uid") == vm.status.pod_uid:
                continue
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                raise Rollback(
                    "PodRestarted", f"pod {pod['metadata']['name']} started again on node {node} "
                    f"without the scheduling gate {self.gate} (is the pod webhook of "
                    "topolvm-controller on, for this namespace?)"
                )  # fmt: skip

    async def no_pod_on_old_node(self, vm: VolumeMoveObject) -> None:
        users = await self._users(vm)
        self._check_held(vm, [p for p in users if p["metadata"].get("uid") != vm.status.pod_uid])
        if any(p["metadata"].get("uid") == vm.status.pod_uid for p in users):
            raise Rollback("PodRestarted", f"pod {vm.status.pod} runs again")

    async def ungate(self, vm: VolumeMoveObject) -> int:
        """Lift the gate from the claim's pods (one that changed meanwhile is left to the next
        pass, or to the gate sweep once the move is done); how many were lifted."""
        released = 0
        for pod in await self._users(vm):
            if claims.gated(pod, self.gate) and await lift_gate(self.client, pod, self.gate):
                released += 1
        return released

    # -- swap and start --------------------------------------------------------------------

    async def swap(self, vm: VolumeMoveObject, committed: bool) -> str | None:
        """The new PV made, the old claim deleted and re-created bound to it: "" once bound,
        else what it waits for. Not ``committed`` (the group's commit is not whole yet): only
        the new PV, and None once the old claim may be deleted (the pass then writes the
        commit, ``status.commitTime`` on every member, after which none rolls back, whichever
        writer comes next)."""
        s, made = vm.status, vm.made_name
        target = await self.store.get(made, fresh=True)
        if target is None or not target.volume_id:
            return f"the target LogicalVolume {made} is gone: the move cannot finish"
        if await api.get(self.client, PersistentVolume, made) is None:
            try:
                old_pv = await self.old_volume(vm)
            except Fenced as e:
                return f"{e}: the move cannot finish"
            body = claims.new_volume(
                old_pv, made, target.volume_id, s.target_node, self.names.topology_key,
                s.reclaim_policy, vm.namespace, vm.claim, self.names.plugin,
            )  # fmt: skip
            with _exists_ok():
                await api.create(self.client, PersistentVolume.from_dict(body))
        pvc = await api.get(self.client, PersistentVolumeClaim, vm.claim, namespace=vm.namespace)
        # the StatefulSet controller may re-create the claim from its template before this
        # does: the new PV is pre-bound to the claim's name, so that claim binds to it too
        if not committed:
            if pvc is not None and pvc["metadata"].get("uid") == s.claim_uid:
                # the last moment a rollback is whole: the target holds the final round,
                # copied from the source the old PV names, and the pod is not back
                if why := final_copy_of(target, await self.checked_source(vm)):
                    raise Rollback("CopyNotFinal", f"the move cannot swap: {why}")
                await self.no_pod_on_old_node(vm)
            return None
        if pvc is not None and pvc["metadata"].get("uid") == s.claim_uid:
            if not pvc["metadata"].get("deletionTimestamp"):
                # checked again (a commitTime written by another says nothing of the copy)
                if why := final_copy_of(target, await self.checked_source(vm)):
                    return f"the swap waits: {why}"
                await self.no_pod_on_old_node(vm)
                # only that claim: one re-created meanwhile is another UID
                with _gone_ok(), contextlib.suppress(kube.PreconditionFailed):
                    await api.delete(self.client, PersistentVolumeClaim, vm.claim,
                                     namespace=vm.namespace, uid=s.claim_uid)  # fmt: skip
            return f"waiting for the old claim {vm.claim} to be deleted"
        if pvc is None:
            body = claims.new_claim(s.claim_template, vm.namespace, vm.claim, made)
            with _exists_ok():
                await api.create(self.client, PersistentVolumeClaim.from_dict(body))
            return f"claim {vm.claim} re-created; waiting for it to bind"
        bound_to = (pvc.get("spec") or {}).get("volumeName") or ""
        if bound_to and bound_to != made:
            return (
                f"claim {vm.claim} was re-created (not by this move) bound to {bound_to}, not "
                f"{made}: delete that claim so that the move can re-create it"
            )
        if (pvc.get("status") or {}).get("phase") != "Bound":
            return f"waiting for claim {vm.claim} to bind to {made}"
        return ""

    async def start_pod(self, vm: VolumeMoveObject) -> str:
        await self.ungate(vm)
        users = [p for p in await self._users(vm) if p["metadata"].get("uid") != vm.status.pod_uid]
        if not users:
            return f"waiting for {vm.status.owner} to re-create the pod"
        pod = users[0]
        node = (pod.get("spec") or {}).get("nodeName") or ""
        phase = (pod.get("status") or {}).get("phase")
        if phase != "Running":
            where = f"on node {node}" if node else "not scheduled yet"
            return f"waiting for pod {pod['metadata']['name']} to run ({phase}, {where})"
        return ""


def _ctx(vm: VolumeMoveObject, detail: str) -> dict[str, str]:
    return {"move": f"{vm.namespace}/{vm.name}", "detail": detail}


def _gone_ok() -> contextlib.suppress:
    return contextlib.suppress(kube.NotFound)


def _exists_ok() -> contextlib.suppress:
    return contextlib.suppress(kube.AlreadyExists)

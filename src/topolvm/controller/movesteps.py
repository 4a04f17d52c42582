"""The API work of each step of a move (see :mod:`.moves`); every method may run again after
a crash at any point, and finds what an earlier run did."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim, Pod

from topolvm.constants import Names
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import CopyPhase, LogicalVolumeObject
from topolvm.k8s.lvstore import IncompatibleVolume, LogicalVolumeStore, VolumeRequest
from topolvm.k8s.moveobject import MovePhase, MoveStatus, VolumeMoveObject
from topolvm.move import claims, reads, rules

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


def progress(phase: str, target: LogicalVolumeObject) -> dict[str, Any]:
    copy = target.copy
    if copy is None or (not target.copy_done and copy.round != target.copy_round and (
        target.copy_round > 1
    )):  # fmt: skip
        return {"done_bytes": 0, "total_bytes": 0, "progress": f"{phase} 0%"}
    pct = copy.done_bytes * 100 // copy.total_bytes if copy.total_bytes else 0
    if target.copy_done:
        pct = 100
    return {"done_bytes": copy.done_bytes, "total_bytes": copy.total_bytes,
            "progress": f"{phase} {pct}%"}  # fmt: skip


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
        )  # fmt: skip
        return MoveStatus(
            source_node=source.node_name, target_node=target, source_volume=source.name,
            target_volume=f"move-{vm.uid}", old_pv=str(pv["metadata"]["name"]),
            new_pv=f"move-{vm.uid}", pod=work.pod,
            pod_uid=str(pod["metadata"].get("uid") or ""),
            owner=f"{work.owner_kind}/{work.owner}",
            claim_uid=str(pvc["metadata"].get("uid") or ""),
            claim_template=claims.claim_template(pvc),
            reclaim_policy=str(pv["spec"].get("persistentVolumeReclaimPolicy") or "Delete"),
            device_class=source.device_class, size_bytes=size,
        )  # fmt: skip

    async def ensure_finalizer(self, vm: VolumeMoveObject) -> None:
        await api.patch_merge(self.client, api.volumemove_resource(self.names), vm.name,
                              {"metadata": {"finalizers": [self.finalizer]}},
                              namespace=vm.namespace)  # fmt: skip

    async def release(self, vm: VolumeMoveObject) -> None:
        """A done VolumeMove being deleted: its finalizer goes."""
        patch = {"metadata": {"finalizers": None}}
        with _gone_ok():
            await api.patch_merge(self.client, api.volumemove_resource(self.names), vm.name,
                                  patch, namespace=vm.namespace)  # fmt: skip

    async def retain(self, pv: str, policy: str = "Retain") -> None:
        patch = {"spec": {"persistentVolumeReclaimPolicy": policy}}
        with _gone_ok():
            await api.patch_merge(self.client, PersistentVolume, pv, patch)

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
            if not old[0]["metadata"].get("deletionTimestamp"):
                await self._gate_works(vm, old[0])
                await api.delete(self.client, Pod, vm.status.pod, namespace=vm.namespace)
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

    async def _ungate(self, vm: VolumeMoveObject) -> int:
        released = 0
        for pod in await self._users(vm):
            if not claims.gated(pod, self.gate):
                continue
            meta = pod["metadata"]
            patch = {"metadata": {"resourceVersion": meta["resourceVersion"]},
                     "spec": {"schedulingGates": claims.without_gate(pod, self.gate)}}  # fmt: skip
            with _gone_ok():
                await api.patch_merge(self.client, Pod, meta["name"], patch,
                                      namespace=vm.namespace)  # fmt: skip
            released += 1
        return released

    # -- swap and start --------------------------------------------------------------------

    async def swap(self, vm: VolumeMoveObject) -> str:
        s = vm.status
        target = await self.store.get(s.target_volume, fresh=True)
        if target is None or not target.volume_id:
            return f"the target LogicalVolume {s.target_volume} is gone: the move cannot finish"
        old_pv = await api.get(self.client, PersistentVolume, s.old_pv)
        if await api.get(self.client, PersistentVolume, s.new_pv) is None:
            if old_pv is None:
                return f"the old PersistentVolume {s.old_pv} is gone: the move cannot finish"
            body = claims.new_volume(
                old_pv, s.new_pv, target.volume_id, s.target_node, self.names.topology_key,
                s.reclaim_policy, vm.namespace, vm.claim, self.names.plugin,
            )  # fmt: skip
            with _exists_ok():
                await api.create(self.client, PersistentVolume.from_dict(body))
        pvc = await api.get(self.client, PersistentVolumeClaim, vm.claim, namespace=vm.namespace)
        # the StatefulSet controller may re-create the claim from its template before this
        # does: the new PV is pre-bound to the claim's name, so that claim binds to it too
        if pvc is not None and pvc["metadata"].get("uid") == s.claim_uid:
            if not pvc["metadata"].get("deletionTimestamp"):
                await self.no_pod_on_old_node(vm)  # the last moment a rollback is whole
                await api.delete(self.client, PersistentVolumeClaim, vm.claim,
                                 namespace=vm.namespace)  # fmt: skip
            return f"waiting for the old claim {vm.claim} to be deleted"
        if pvc is None:
            body = claims.new_claim(s.claim_template, vm.namespace, vm.claim, s.new_pv)
            with _exists_ok():
                await api.create(self.client, PersistentVolumeClaim.from_dict(body))
            return f"claim {vm.claim} re-created; waiting for it to bind"
        bound_to = (pvc.get("spec") or {}).get("volumeName") or ""
        if bound_to and bound_to != s.new_pv:
            return (
                f"claim {vm.claim} was re-created (not by this move) bound to {bound_to}, not "
                f"{s.new_pv}: delete that claim so that the move can re-create it"
            )
        if (pvc.get("status") or {}).get("phase") != "Bound":
            return f"waiting for claim {vm.claim} to bind to {s.new_pv}"
        return ""

    async def start_pod(self, vm: VolumeMoveObject) -> str:
        await self._ungate(vm)
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

    async def remove_old(self, vm: VolumeMoveObject) -> None:
        s = vm.status
        with _gone_ok():
            await api.delete(self.client, PersistentVolume, s.old_pv)
        await self.store.delete(s.source_volume)

    # -- rollback --------------------------------------------------------------------------

    async def rollback(self, vm: VolumeMoveObject) -> None:
        s = vm.status
        if s.new_pv:  # made in Swapping, pre-bound to the claim's name: the claim is the old one
            with _gone_ok():
                await api.delete(self.client, PersistentVolume, s.new_pv)
        if s.target_volume:
            await self.store.delete(s.target_volume)
        if s.old_pv and s.reclaim_policy:
            await self.retain(s.old_pv, s.reclaim_policy)
        await self._ungate(vm)
        log.info("move rolled back", extra={"move": f"{vm.namespace}/{vm.name}",
                                            "reason": s.reason})  # fmt: skip


def _gone_ok() -> contextlib.suppress:
    return contextlib.suppress(kube.NotFound)


def _exists_ok() -> contextlib.suppress:
    return contextlib.suppress(kube.AlreadyExists)

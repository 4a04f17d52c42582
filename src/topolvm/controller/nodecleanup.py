"""Node cleanup (spec §8.1): when a Node that topolvm-node marked with ``<p>/node`` is deleted,
delete the PVCs scheduled onto it and its LogicalVolumes, then let the Node go.

topolvm-node puts the ``<p>/node`` finalizer on its Node. When the Node is deleted (say,
``kubectl delete node`` while retiring a machine) the finalizer holds it, and this reconciler:

1. with ``--skip-node-finalize`` only removes the finalizer: the node's PVCs and LogicalVolumes
   are left for the operator;
2. otherwise deletes every PVC whose ``volume.kubernetes.io/selected-node`` annotation names the
   node and whose StorageClass's provisioner is ``<p>`` (PVCs bound with ``Immediate`` binding
   carry no such annotation and are kept), so that a StatefulSet can recreate them elsewhere;
3. for every LogicalVolume with ``spec.nodeName`` == the node: if it has the
   ``<p>/logicalvolume`` finalizer, one merge patch adds ``<p>/pendingdeletion: "true"`` (so the
   node's reconciler, if it still runs, does not put the finalizer back) and removes the
   finalizer; then the object is deleted (already gone is fine);
4. removes the ``<p>/node`` finalizer, and the Node disappears.

Every step is idempotent, so an error anywhere requeues the Node with backoff and the next try
starts again from the top. Runs only on the leader.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, PersistentVolumeClaim
from lightkube.resources.storage_v1 import StorageClass

from topolvm.constants import Names
from topolvm.controller.metrics import ControllerMetrics
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.lvstore import LogicalVolumeStore
from topolvm.k8s.runtime import Controller, Informer, Reconcile, Result

log = logging.getLogger(__name__)

SELECTED_NODE = "volume.kubernetes.io/selected-node"
CONTROLLER_NAME = "node"


def counted(metrics: ControllerMetrics | None, controller: str, reconcile: Reconcile) -> Reconcile:
    """``reconcile`` that also counts its outcome in ``topolvm_controller_reconciles_total``
    (result ``ok``, ``requeue`` when it asked to run again later, ``error`` when it raised)."""

    async def run(key: str) -> Result | None:
        try:
            result = await reconcile(key)
        except asyncio.CancelledError:
            raise
        except Exception:
            if metrics is not None:
                metrics.reconciles.labels(controller=controller, result="error").inc()
            raise
        if metrics is not None:
            outcome = "requeue" if result is not None and result.requeue_after is not None else "ok"
            metrics.reconciles.labels(controller=controller, result=outcome).inc()
        return result

    return run


async def run_controller(informer: Informer, controller: Controller) -> None:
    """Run an informer and the controller it feeds until cancelled (or one of them fails)."""
    async with asyncio.TaskGroup() as tg:
        tg.create_task(informer.run(), name=f"{controller.name}-informer")
        tg.create_task(controller.run(), name=f"{controller.name}-controller")


def _is_deleting_with(obj: api.Obj, finalizer: str) -> bool:
    meta = obj.get("metadata") or {}
    return bool(meta.get("deletionTimestamp")) and finalizer in (meta.get("finalizers") or [])


class NodeCleanupReconciler:
    """Reconciles Nodes by name. Use :meth:`run` (own Node informer and work queue), or
    :meth:`watch` with a shared Node informer and a :class:`Controller` built on
    :attr:`reconcile`."""

    def __init__(
        self,
        client: AsyncClient,
        names: Names,
        volumes: LogicalVolumeStore,
        metrics: ControllerMetrics | None = None,
        *,
        skip_node_finalize: bool = False,
        resync: float = 600.0,
        workers: int = 1,
    ):
        self.client = client
        self.names = names
        self.volumes = volumes
        self.metrics = metrics
        self.skip_node_finalize = skip_node_finalize
        self.resync = resync
        self.workers = workers
        self.reconcile: Reconcile = counted(metrics, CONTROLLER_NAME, self._reconcile)

    # -- wiring -------------------------------------------------------------------------------
    def watch(self, informer: Informer, controller: Controller) -> None:
        """Queue a Node when the informer sees it being deleted with our finalizer
        (deletions themselves are ignored: a Node that is gone needs nothing)."""

        def on_event(event: str, obj: api.Obj) -> None:
            if event != "DELETED" and _is_deleting_with(obj, self.names.node_finalizer):
                controller.enqueue(str(obj["metadata"]["name"]))

        informer.add_handler(on_event)

    def make_controller(self) -> Controller:
        return Controller(CONTROLLER_NAME, self.reconcile, workers=self.workers, max_backoff=60.0)

    async def run(self) -> None:
        """Watch Nodes and clean up deleted ones until cancelled (cancel to stop)."""
        informer = Informer(self.client, Node, resync=self.resync)
        controller = self.make_controller()
        self.watch(informer, controller)
        log.info(
            "node cleanup started",
            extra={"skip_node_finalize": self.skip_node_finalize, "plugin": self.names.plugin},
        )
        await run_controller(informer, controller)

    # -- reconcile ----------------------------------------------------------------------------
    async def _reconcile(self, name: str) -> Result | None:
        node = await api.get(self.client, Node, name)
        if node is None or not _is_deleting_with(node, self.names.node_finalizer):
            return None
        ctx = {"node": name}
        if self.skip_node_finalize:
            log.info(
                "node is being deleted; --skip-node-finalize is set, so its PVCs and "
                "LogicalVolumes are left for manual cleanup",
                extra=ctx,
            )
        else:
            log.info("node is being deleted; cleaning up its volumes", extra=ctx)
            await self._delete_pvcs(name)
            await self._delete_logical_volumes(name)
        await api.set_finalizer(self.client, Node, name, self.names.node_finalizer, False)
        log.info("removed node finalizer", extra={**ctx, "finalizer": self.names.node_finalizer})
        return None

    async def _topolvm_storage_classes(self) -> set[str]:
        classes, _ = await api.list_all(self.client, StorageClass)
        return {
            str(sc["metadata"]["name"])
            for sc in classes
            if sc.get("provisioner") == self.names.plugin
        }

    async def _delete_pvcs(self, node: str) -> None:
        classes = await self._topolvm_storage_classes()
        pvcs, _ = await api.list_all(self.client, PersistentVolumeClaim, namespace="*")
        for pvc in pvcs:
            meta = pvc.get("metadata") or {}
            if (meta.get("annotations") or {}).get(SELECTED_NODE) != node:
                continue
            sc = (pvc.get("spec") or {}).get("storageClassName")
            if not sc or sc not in classes:
                continue
            ctx = {"node": node, "pvc": meta["name"], "namespace": meta["namespace"]}
            await api.delete(
                self.client, PersistentVolumeClaim, meta["name"], namespace=meta["namespace"]
            )
            log.info("deleted PVC of the deleted node", extra={**ctx, "storage_class": sc})

    async def _delete_logical_volumes(self, node: str) -> None:
        items, _ = await api.list_all(self.client, self.volumes.resource)
        for obj in items:
            if (obj.get("spec") or {}).get("nodeName") != node:
                continue
            # Raw fields, not LogicalVolumeObject: a malformed spec must not block the cleanup.
            meta = obj["metadata"]
            name = str(meta["name"])
            ctx = {"node": node, "lv": name, "uid": meta.get("uid", "")}
            if self.names.lv_finalizer in api.finalizers(obj):
                if not await self._release(obj):
                    continue  # already gone
                log.info(
                    "marked LogicalVolume pending deletion and removed its finalizer", extra=ctx
                )
            await self.volumes.delete(name)
            log.info("deleted LogicalVolume of the deleted node", extra=ctx)

    async def _release(self, obj: api.Obj) -> bool:
        """One merge patch: ``<p>/pendingdeletion: "true"`` and the LV finalizer removed.
        The resourceVersion makes a concurrent change fail with 409 (retried by the queue).
        False when the object no longer exists."""
        meta = obj["metadata"]
        patch: dict[str, Any] = {
            "metadata": {
                "resourceVersion": meta["resourceVersion"],
                "annotations": {self.names.pending_deletion: "true"},
                "finalizers": [f for f in api.finalizers(obj) if f != self.names.lv_finalizer],
            }
        }
        try:
            await api.patch_merge(self.client, self.volumes.resource, str(meta["name"]), patch)
        except kube.NotFound:
            return False
        return True

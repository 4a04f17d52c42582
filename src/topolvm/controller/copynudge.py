"""A claim restored or cloned onto another node binds as soon as its copy is verified.

CreateVolume for such a claim waits for the target node's copy (docs/mobility.md); each call
ends at csi-provisioner's ``--timeout`` and is retried with its backoff, which grows to
``--retry-interval-max`` (5 minutes by default). Without help, a claim whose copy ended just
after a call gave up waits out that backoff. csi-provisioner syncs a claim at once when the
claim changes (its informer's update handler puts the claim on its queue, backoff or not), so
when a copy target's ``status.copy`` turns Done, the leader writes the annotation
``<plugin>/copy-done`` (the LogicalVolume's name and the copy's completion time) on the claim
that waits for it (the LogicalVolume's ``<plugin>/claim`` annotation): the next CreateVolume
finds the volume ready and the claim binds within a second or two.

Pure rule: :func:`nudge_for`; the rest watches LogicalVolumes (the leader only).
"""

from __future__ import annotations

import logging

from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolumeClaim

from topolvm.constants import Names
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.nodecleanup import counted, run_controller
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import LogicalVolumeObject
from topolvm.k8s.runtime import Controller, Informer, Result

log = logging.getLogger(__name__)
CONTROLLER_NAME = "copydone"


def copy_done_annotation(names: Names) -> str:
    return f"{names.plugin}/copy-done"


def nudge_for(lv: LogicalVolumeObject, names: Names) -> tuple[str, str, str] | None:
    """(namespace, claim, annotation value) when ``lv`` is a restore's or clone's target
    whose copy is done and whose claim may still wait for it; None otherwise."""
    if not lv.copy_source or lv.deleting or not lv.copy_done or lv.copy is None:
        return None
    waiting = lv.annotations.get(names.claim_annotation, "")
    namespace, sep, claim = waiting.partition("/")
    if not sep or not namespace or not claim:
        return None
    return namespace, claim, f"{lv.name}@{lv.copy.completion_time}"


class CopyDoneNudge:
    """Watches LogicalVolumes; nudges the claim of each copy that is done (see the module)."""

    def __init__(
        self, client: AsyncClient, names: Names, metrics: ControllerMetrics | None = None,
        *, resync: float = 600.0,
    ) -> None:  # fmt: skip
        self.client = client
        self.names = names
        self.resync = resync
        self.key = copy_done_annotation(names)
        self.informer = Informer(client, api.logicalvolume_resource(names), resync=resync)
        self.reconcile = counted(metrics, CONTROLLER_NAME, self._reconcile)

    async def run(self) -> None:
        controller = Controller(CONTROLLER_NAME, self.reconcile, workers=1, max_backoff=30.0)

        def on_event(event: str, obj: api.Obj) -> None:
            if event != "DELETED" and nudge_for(LogicalVolumeObject.from_dict(obj), self.names):
                controller.enqueue(str(obj["metadata"]["name"]))

        self.informer.add_handler(on_event)
        await run_controller(self.informer, controller)

    async def _reconcile(self, name: str) -> Result | None:
        obj = self.informer.get(name)
        if obj is None:
            return None
        nudge = nudge_for(LogicalVolumeObject.from_dict(obj), self.names)
        if nudge is None:
            return None
        namespace, claim, value = nudge
        pvc = await api.get(self.client, PersistentVolumeClaim, claim, namespace=namespace)
        if pvc is None or (pvc.get("status") or {}).get("phase") != "Pending":
            return None  # bound already (or gone): nothing waits
        if (pvc["metadata"].get("annotations") or {}).get(self.key) == value:
            return None
        patch = {"metadata": {"annotations": {self.key: value},
                              "resourceVersion": pvc["metadata"]["resourceVersion"]}}  # fmt: skip
        try:
            await api.patch_merge(self.client, PersistentVolumeClaim, claim, patch,
                                  namespace=namespace)  # fmt: skip
        except kube.Conflict:
            return Result(requeue_after=0.1)  # changed meanwhile: look again
        except kube.NotFound:
            return None
        log.info("copy done: claim nudged so that csi-provisioner retries now",
                 extra={"claim": f"{namespace}/{claim}", "logicalvolume": name})  # fmt: skip
        return None

"""PersistentVolumeClaim reconciler (spec §8.2): drops TopoLVM's deprecated PVC finalizers and
nudges kubelet to finish an online filesystem resize.

1. Old releases put ``topolvm.io/pvc`` (or ``topolvm.cybozu.com/pvc``) on PVCs; both are only
   ever removed now, whatever the legacy mode.
2. After the LV grew, external-resizer sets the PVC condition ``FileSystemResizePending``;
   kubelet calls ``NodeExpandVolume`` only when it next syncs a pod that uses the claim. For a
   PVC of a TopoLVM StorageClass (provisioner ``<p>``) with that condition ``True``, every pod in
   the namespace that mounts the claim (listed from the API, not a cache) gets the annotation
   ``topolvm.io/last-resizefs-requested-at`` = now (RFC 3339 with nanoseconds), which makes
   kubelet sync it. A pod whose annotation is already later than the condition's
   ``lastTransitionTime`` is left alone, so one resize nudges each pod once.

Runs only on the leader.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import UTC, datetime
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolumeClaim, Pod
from lightkube.resources.storage_v1 import StorageClass

from topolvm.constants import RESIZEFS_REQUESTED_AT, Names
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.nodecleanup import counted, run_controller
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.runtime import Controller, Informer, Reconcile, Result, object_key

log = logging.getLogger(__name__)

DEPRECATED_PVC_FINALIZERS = ("topolvm.io/pvc", "topolvm.cybozu.com/pvc")
RESIZE_PENDING = "FileSystemResizePending"
CONTROLLER_NAME = "persistentvolumeclaim"

_RFC3339 = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})$"
)


def format_rfc3339nano(ns: int) -> str:
    """Go's ``time.RFC3339Nano`` of a UTC time given in nanoseconds since the epoch
    (``2024-05-01T10:00:00.123456789Z``; trailing zeros of the fraction dropped)."""
    seconds, nanos = divmod(ns, 1_000_000_000)
    base = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{nanos:09d}".rstrip("0")
    return f"{base}.{fraction}Z" if fraction else f"{base}Z"


def parse_rfc3339(value: str) -> int | None:
    """An RFC 3339 time (with or without a fraction of up to 9 digits) as nanoseconds since the
    epoch; None when it does not parse."""
    m = _RFC3339.match(value.strip())
    if m is None:
        return None
    day, clock, fraction, zone = m.groups()
    try:
        whole = datetime.fromisoformat(f"{day}T{clock}{'+00:00' if zone in 'Zz' else zone}")
    except ValueError:
        return None
    return int(whole.timestamp()) * 1_000_000_000 + int((fraction or "").ljust(9, "0"))


def _resize_pending_since(pvc: api.Obj) -> str | None:
    """``lastTransitionTime`` of a ``FileSystemResizePending=True`` condition ("" if it has
    none), or None when the condition is absent or not True."""
    for cond in (pvc.get("status") or {}).get("conditions") or []:
        if cond.get("type") == RESIZE_PENDING and cond.get("status") == "True":
            return str(cond.get("lastTransitionTime") or "")
    return None


def _needs_attention(pvc: api.Obj) -> bool:
    deprecated = any(f in DEPRECATED_PVC_FINALIZERS for f in api.finalizers(pvc))
    return deprecated or _resize_pending_since(pvc) is not None


def _uses_claim(pod: api.Obj, claim: str) -> bool:
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if (volume.get("persistentVolumeClaim") or {}).get("claimName") == claim:
            return True
    return False


class _AllNamespacesInformer(Informer):
    """An Informer over every namespace (lightkube lists only the client's namespace by
    default; ``namespace="*"`` asks for all of them)."""

    def _filters(self) -> dict[str, Any]:
        return {**super()._filters(), "namespace": "*"}


class PersistentVolumeClaimReconciler:
    """Reconciles PVCs by ``namespace/name``. Use :meth:`run` (own PVC informer over every
    namespace and work queue), or :meth:`watch` with a shared PVC informer and a
    :class:`Controller` built on :attr:`reconcile`."""

    def __init__(
        self,
        client: AsyncClient,
        names: Names,
        metrics: ControllerMetrics | None = None,
        *,
        resync: float = 600.0,
        workers: int = 2,
    ):
        self.client = client
        self.names = names
        self.metrics = metrics
        self.resync = resync
        self.workers = workers
        self.reconcile: Reconcile = counted(metrics, CONTROLLER_NAME, self._reconcile)

    # -- wiring -------------------------------------------------------------------------------
    def watch(self, informer: Informer, controller: Controller) -> None:
        """Queue a PVC when the informer sees it (created, changed or re-listed) with a
        deprecated finalizer or a ``FileSystemResizePending=True`` condition; other PVCs, and
        deletions, need nothing, so a resync of a large cluster costs no API calls."""

        def on_event(event: str, obj: api.Obj) -> None:
            if event != "DELETED" and _needs_attention(obj):
                controller.enqueue(object_key(obj))

        informer.add_handler(on_event)

    def make_informer(self) -> Informer:
        return _AllNamespacesInformer(self.client, PersistentVolumeClaim, resync=self.resync)

    def make_controller(self) -> Controller:
        return Controller(CONTROLLER_NAME, self.reconcile, workers=self.workers, max_backoff=60.0)

    async def run(self) -> None:
        """Watch PVCs in every namespace until cancelled (cancel to stop)."""
        informer = self.make_informer()
        controller = self.make_controller()
        self.watch(informer, controller)
        log.info("PVC reconciler started", extra={"plugin": self.names.plugin})
        await run_controller(informer, controller)

    # -- reconcile ----------------------------------------------------------------------------
    async def _reconcile(self, key: str) -> Result | None:
        namespace, _, name = key.partition("/")
        pvc = await api.get(self.client, PersistentVolumeClaim, name, namespace=namespace)
        if pvc is None:
            return None
        if any(f in DEPRECATED_PVC_FINALIZERS for f in api.finalizers(pvc)):
            stored = await self._drop_deprecated_finalizers(pvc)
            if stored is None:
                return None
            pvc = stored
        if (pvc.get("metadata") or {}).get("deletionTimestamp"):
            return None
        since = _resize_pending_since(pvc)
        if since is None or not await self._is_topolvm(pvc):
            return None
        await self._nudge_pods(namespace, name, since)
        return None

    async def _drop_deprecated_finalizers(self, pvc: api.Obj) -> api.Obj | None:
        """One merge patch carrying the resourceVersion (a concurrent change fails with 409
        and the queue retries). Returns the stored PVC, None when it is gone."""
        meta = pvc["metadata"]
        kept = [f for f in api.finalizers(pvc) if f not in DEPRECATED_PVC_FINALIZERS]
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"], "finalizers": kept}}
        try:
            stored = await api.patch_merge(
                self.client, PersistentVolumeClaim, meta["name"], patch, namespace=meta["namespace"]
            )
        except kube.NotFound:
            return None
        removed = [f for f in api.finalizers(pvc) if f in DEPRECATED_PVC_FINALIZERS]
        log.info(
            "removed deprecated PVC finalizers",
            extra={"pvc": meta["name"], "namespace": meta["namespace"], "finalizers": removed},
        )
        return stored

    async def _is_topolvm(self, pvc: api.Obj) -> bool:
        sc_name = (pvc.get("spec") or {}).get("storageClassName")
        if not sc_name:
            return False
        sc = await api.get(self.client, StorageClass, sc_name)
        return sc is not None and sc.get("provisioner") == self.names.plugin

    async def _nudge_pods(self, namespace: str, claim: str, since: str) -> None:
        pending_since = parse_rfc3339(since) if since else None
        pods, _ = await api.list_all(self.client, Pod, namespace=namespace)
        for pod in pods:
            if not _uses_claim(pod, claim):
                continue
            meta = pod["metadata"]
            previous = parse_rfc3339(
                str((meta.get("annotations") or {}).get(RESIZEFS_REQUESTED_AT, ""))
            )
            if previous is not None and pending_since is not None and previous > pending_since:
                continue  # already nudged for this resize
            now = format_rfc3339nano(time.time_ns())
            patch = {"metadata": {"annotations": {RESIZEFS_REQUESTED_AT: now}}}
            try:
                await api.patch_merge(self.client, Pod, meta["name"], patch, namespace=namespace)
            except kube.NotFound:
                continue
            log.info(
                "asked kubelet to resize the filesystem",
                extra={"pod": meta["name"], "namespace": namespace, "pvc": claim,
                       "resize_pending_since": since, "annotation": RESIZEFS_REQUESTED_AT},
            )  # fmt: skip

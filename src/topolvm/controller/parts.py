"""The controller's optional parts: the pod webhook with its certificates (every replica)
and the reconcilers (the leader only)."""

from __future__ import annotations

import asyncio

from lightkube import AsyncClient

from topolvm.constants import Names
from topolvm.controller import copynudge, lvgc, moves, nodecleanup, pvcresize
from topolvm.controller.lvgc import LogicalVolumeGC
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.nodecleanup import NodeCleanupReconciler
from topolvm.controller.options import ControllerOptions
from topolvm.controller.pvcresize import PersistentVolumeClaimReconciler
from topolvm.controller.webhook import (
    ApiPodReader,
    CertDir,
    WebhookCertError,
    WebhookServerError,
    start_webhook_server,
    stop_webhook_server,
)
from topolvm.controller.webhookcerts import SelfManagedCerts
from topolvm.daemon import Parts, StartupError
from topolvm.k8s.lvstore import LogicalVolumeStore


async def start_webhook(
    parts: Parts, o: ControllerOptions, client: AsyncClient, names: Names,
    metrics: ControllerMetrics, store: LogicalVolumeStore | None = None,
) -> None:  # fmt: skip
    """Certificates from ``--cert-dir`` (cert-manager) or self-managed (a CA and serving
    certificate of the controller's own, kept in a Secret, caBundle written into the
    MutatingWebhookConfiguration); then the HTTPS server; both as ``parts``."""
    assert o.webhook_address is not None
    certs: CertDir | SelfManagedCerts
    try:
        if o.cert_dir:
            certs = CertDir(o.cert_dir, metrics)
            certs.load()
        else:
            certs = SelfManagedCerts(
                client, o.namespace, o.webhook_secret_name, o.webhook_configuration_name,
                o.webhook_service_name, extra_ips=o.webhook_extra_sans, metrics=metrics,
            )  # fmt: skip
            await certs.setup()
        runner = await start_webhook_server(
            *o.webhook_address, certs.ssl_context, ApiPodReader(client, names, store), names,
            o.pod_webhook_marker, metrics,
        )  # fmt: skip
    except (WebhookCertError, WebhookServerError) as e:
        raise StartupError(str(e)) from e
    parts.on_stop("webhook server", lambda: stop_webhook_server(runner))
    task = parts.spawn(certs.run(), "webhook-certificates")

    async def stop_certs() -> None:  # the round in progress finishes: no half-done write
        certs.stop()
        await asyncio.wait([task])

    parts.on_stop("webhook certificates", stop_certs)


async def run_reconcilers(
    o: ControllerOptions,
    client: AsyncClient,
    names: Names,
    store: LogicalVolumeStore,
    metrics: ControllerMetrics,
) -> None:
    """Run the Node cleanup, PVC and LogicalVolume-GC reconcilers until cancelled (the leader
    only; each builds its own informers, so followers keep no extra watches)."""
    async with asyncio.TaskGroup() as tg:
        tg.create_task(
            NodeCleanupReconciler(
                client, names, store, metrics,
                skip_node_finalize=o.skip_node_finalize, resync=o.resync,
            ).run(),
            name=nodecleanup.CONTROLLER_NAME,
        )  # fmt: skip
        tg.create_task(
            PersistentVolumeClaimReconciler(client, names, metrics, resync=o.resync)
            .run(),
            name=pvcresize.CONTROLLER_NAME,
        )  # fmt: skip
        tg.create_task(
            LogicalVolumeGC(
                client, names, store, metrics,
                mode=o.lv_gc, grace=o.lv_gc_grace, interval=o.lv_gc_interval,
            ).run(),
            name=lvgc.CONTROLLER_NAME,
        )  # fmt: skip
        tg.create_task(
            moves.MoveReconciler(client, names, store, metrics, resync=o.resync).run(),
            name=moves.CONTROLLER_NAME,
        )
        tg.create_task(
            copynudge.CopyDoneNudge(client, names, metrics, resync=o.resync).run(),
            name=copynudge.CONTROLLER_NAME,
        )

"""The pod mutating webhook's HTTPS server: ``POST /pod/mutate`` (spec §7.1, conformance §4).

The API server sends an AdmissionReview (``admission.k8s.io/v1`` or ``v1beta1``); the answer
has the same apiVersion and kind, the request's uid, and for a mutated pod a base64 JSON patch.
The TLS certificate comes from the caller's :class:`ssl.SSLContext`; loading a renewed
certificate into that context (:func:`load_pair`) takes effect for the next connection, so
renewal needs no restart. Certificates come from a folder (:class:`CertDir`, ``--cert-dir``,
reloaded when the files change) or are made by the controller itself
(:class:`topolvm.controller.webhookcerts.SelfManagedCerts`).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import logging
import os
import ssl
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography import x509
from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim
from lightkube.resources.storage_v1 import StorageClass

from topolvm import tlspair
from topolvm.constants import NORMAL, Names
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.podmutate import Decision, PodReader, decide
from topolvm.k8s import api
from topolvm.k8s.lvstore import LogicalVolumeStore
from topolvm.process import stopped_within

log = logging.getLogger("topolvm.controller.webhook")

POD_MUTATE_PATH = "/pod/mutate"
REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
DEFAULT_CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"  # controller-runtime's default
MAX_REQUEST_BYTES = 8 << 20  # a pod is far smaller; etcd's own limit is 1.5 MiB


class WebhookServerError(Exception):
    """The webhook listener could not be opened; the message names the address."""


class WebhookCertError(Exception):
    """The serving certificate cannot be loaded or kept; the message says what to fix."""


def server_ssl_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def load_pair(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Load a certificate chain and key into ``ctx``; a bad pair leaves ``ctx`` untouched."""
    try:
        tlspair.load_pair(ctx, cert_pem, key_pem)
    except tlspair.CertPairError as e:
        raise WebhookCertError(str(e)) from e


class ApiPodReader:
    """Live reads (no cache) through a lightkube client; a volume's node from ``store`` (the
    controller's LogicalVolume cache) when given, else from a list of LogicalVolumes."""

    def __init__(
        self, client: AsyncClient, names: Names = NORMAL, store: LogicalVolumeStore | None = None
    ) -> None:
        self.client = client
        self.names = names
        self.store = store
        self.moves = api.volumemove_resource(names)

    async def get_pv(self, name: str) -> api.Obj | None:
        return await api.get(self.client, PersistentVolume, name)

    async def get_volumesnapshot(self, namespace: str, name: str) -> api.Obj | None:
        return await api.get(self.client, api.VolumeSnapshot, name, namespace=namespace)

    async def get_volumesnapshotcontent(self, name: str) -> api.Obj | None:
        return await api.get(self.client, api.VolumeSnapshotContent, name)

    async def get_volumesnapshotclass(self, name: str) -> api.Obj | None:
        return await api.get(self.client, api.VolumeSnapshotClass, name)

    async def node_of_volume(self, volume_id: str) -> str | None:
        if self.store is not None:  # the cache only: an admission never lists every volume
            return self.store.cached_node_of(volume_id)
        items, _ = await api.list_all(self.client, api.logicalvolume_resource(self.names))
        for obj in items:
            if (obj.get("status") or {}).get("volumeID") == volume_id:
                return str((obj.get("spec") or {}).get("nodeName") or "") or None
        return None

    async def get_pvc(self, namespace: str, name: str) -> api.Obj | None:
        return await api.get(self.client, PersistentVolumeClaim, name, namespace=namespace)

    async def get_storageclass(self, name: str) -> api.Obj | None:
        return await api.get(self.client, StorageClass, name)

    async def get_volumemove(self, namespace: str, name: str) -> api.Obj | None:
        return await api.get(self.client, self.moves, name, namespace=namespace)


def not_after(cert_pem: bytes) -> datetime.datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


class CertDir:
    """``tls.crt``/``tls.key`` in ``cert_dir``, reloaded when they change on disk."""

    def __init__(
        self, cert_dir: str | os.PathLike[str], metrics: ControllerMetrics | None = None,
        *, poll_interval: float = 10.0,
    ) -> None:  # fmt: skip
        self.dir = Path(cert_dir or DEFAULT_CERT_DIR)
        self.metrics, self.poll_interval = metrics, poll_interval
        self.ssl_context = server_ssl_context()
        self._stamp: tuple[Any, ...] | None = None
        self._stopping = asyncio.Event()

    def _files(self) -> tuple[Path, Path]:
        return self.dir / "tls.crt", self.dir / "tls.key"

    def stamp(self) -> tuple[Any, ...]:
        """Changes whenever either file (or a symlink's target) is replaced or written."""
        out: list[Any] = []
        for f in self._files():
            try:
                st = f.stat()
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append(None)
        return tuple(out)

    def load(self) -> None:
        """Load the pair; :class:`WebhookCertError` names what is missing or wrong."""
        stamp = self.stamp()
        crt, key = self._files()
        try:
            cert_pem, key_pem = crt.read_bytes(), key.read_bytes()
            expiry = not_after(cert_pem)
        except OSError as e:
            raise WebhookCertError(
                f"cannot read the webhook certificate in {self.dir} (--cert-dir; expected "
                f"tls.crt and tls.key): {e.strerror}: {e.filename}"
            ) from e
        except ValueError as e:
            raise WebhookCertError(f"{crt} is not a PEM certificate: {e}") from e
        try:
            load_pair(self.ssl_context, cert_pem, key_pem)
        except WebhookCertError as e:
            raise WebhookCertError(f"{self.dir}: {e}") from e
        self._stamp = stamp
        if self.metrics is not None:
            self.metrics.cert_expiry.set(expiry.timestamp())
        log.info(
            "webhook certificate loaded",
            extra={"cert_dir": str(self.dir), "not_after": expiry.isoformat()},
        )

    async def check(self) -> bool:
        """Reload if the files changed; True if a new certificate was loaded."""
        if self.stamp() == self._stamp:
            return False
        try:
            self.load()
        except WebhookCertError as e:  # say, tls.crt written but tls.key not yet
            log.warning(f"keeping the current webhook certificate: {e}")
            return False
        return True

    async def run(self) -> None:
        """Reload when the files change, polling until :meth:`stop`."""
        while not await stopped_within(self._stopping, self.poll_interval):
            await self.check()

    def stop(self) -> None:
        self._stopping.set()


class BadReview(ValueError):
    """The body is not an AdmissionReview this webhook can answer."""


def parse_review(body: bytes) -> dict[str, Any]:
    """The AdmissionReview in ``body``; :class:`BadReview` says what is wrong with it."""
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadReview(f"the body is not JSON: {e}") from e
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise BadReview("the body is not an AdmissionReview (kind must be AdmissionReview)")
    version = review.get("apiVersion")
    if version not in REVIEW_VERSIONS:
        raise BadReview(
            f"unsupported AdmissionReview apiVersion {version!r}; "
            f"expected one of {', '.join(REVIEW_VERSIONS)}"
        )
    request = review.get("request")
    if not isinstance(request, dict) or not request.get("uid"):
        raise BadReview("the AdmissionReview has no request with a uid")
    return review


def review_response(review: dict[str, Any], decision: Decision) -> dict[str, Any]:
    """The AdmissionReview answering ``review`` with ``decision``."""
    response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": decision.allowed}
    status: dict[str, Any] = {"code": decision.code, "message": decision.message}
    if decision.kind == "denied":
        status.update(status="Failure", reason="Forbidden")
    elif decision.kind == "errored":
        status["status"] = "Failure"
    response["status"] = status
    if decision.patch:
        raw = json.dumps(decision.patch, separators=(",", ":")).encode()
        response["patch"] = base64.b64encode(raw).decode()
        response["patchType"] = "JSONPatch"
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    return {"apiVersion": review["apiVersion"], "kind": "AdmissionReview", "response": response}


def make_webhook_app(
    reader: PodReader, names: Names, marker: bool, metrics: ControllerMetrics | None = None
) -> web.Application:
    """The webhook as an aiohttp application (served over TLS by :func:`start_webhook_server`)."""

    async def mutate(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            review = parse_review(body)
        except BadReview as e:
            if metrics is not None:
                metrics.webhook_decisions.labels("errored").inc()
            log.warning(f"bad admission request: {e}", extra={"remote": request.remote})
            return web.Response(status=400, text=f"bad request: {e}\n")
        req = review["request"]
        decision = await decide(
            req.get("object"), str(req.get("namespace") or ""), reader, names, marker=marker
        )
        if metrics is not None:
            metrics.webhook_decisions.labels(decision.kind).inc()
        pod = req.get("object") if isinstance(req.get("object"), dict) else {}
        meta = pod.get("metadata") or {}
        extra = {
            "uid": req["uid"],
            "namespace": req.get("namespace") or meta.get("namespace") or "",
            "pod": meta.get("name") or meta.get("generateName") or "",
            "decision": decision.kind,
            "reason": decision.message,
        }
        if decision.kind == "errored":
            log.error("pod webhook failed", extra=extra)
        else:
            level = logging.DEBUG if decision.kind == "allowed" else logging.INFO
            log.log(level, "pod webhook", extra=extra)
        return web.json_response(review_response(review, decision))

    async def wrong_method(request: web.Request) -> web.Response:
        return web.Response(
            status=405,
            headers={"Allow": "POST"},
            text=f"method {request.method} not allowed: the API server calls {POD_MUTATE_PATH} "
            "with POST and an AdmissionReview\n",
        )

    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    app.router.add_post(POD_MUTATE_PATH, mutate)
    app.router.add_route("*", POD_MUTATE_PATH, wrong_method)
    return app


async def start_webhook_server(
    host: str,
    port: int,
    ssl_context: ssl.SSLContext,
    reader: PodReader,
    names: Names,
    marker: bool,
    metrics: ControllerMetrics | None = None,
) -> web.AppRunner:
    """Serve the webhook on ``https://host:port/pod/mutate``; stop it with
    :func:`stop_webhook_server`. ``host`` "" listens on every address."""
    runner = web.AppRunner(make_webhook_app(reader, names, marker, metrics), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host or None, port, ssl_context=ssl_context).start()
    except OSError as e:
        await runner.cleanup()
        raise WebhookServerError(
            f"cannot serve the pod webhook on {host}:{port}: {e.strerror or e}"
        ) from e
    log.info(
        "pod webhook started",
        extra={"listen": f"{host}:{port}", "path": POD_MUTATE_PATH, "marker": marker},
    )
    return runner


async def stop_webhook_server(runner: web.AppRunner) -> None:
    """Stop accepting connections and finish the requests in flight."""
    await runner.cleanup()

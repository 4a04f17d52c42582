"""Reads the cluster for ``topolvm doctor``: list calls only, concurrently, with raw JSON
objects (generic resources: no model parsing, so 5000 PVCs read in well under a second)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import ssl
from typing import Any
from urllib.parse import urlsplit

import httpx2
from lightkube import ALL_NS, AsyncClient
from lightkube.core.resource import NamespacedResource
from lightkube.generic_resource import (
    GenericGlobalResource,
    GenericNamespacedResource,
    create_api_info,
    create_global_resource,
    create_namespaced_resource,
)
from prometheus_client.parser import text_string_to_metric_families

from topolvm.cliargs import parse_listen
from topolvm.doctor.snapshot import (
    TOPOLVM_NODE_CONTAINER,
    Obj,
    Snapshot,
    container_of,
    name_of,
    ns_of,
)
from topolvm.k8s import api
from topolvm.k8s import errors as kube

log = logging.getLogger("topolvm.doctor")
CHUNK = 500
EVENT_REASONS = (
    "FailedScheduling",
    "ProvisioningFailed",
    "FailedCreate",
    "VolumeModifyFailed",
    "IOLimitsNotInForce",
)
TLS_TIMEOUT = 3.0

# kind -> (group, version, Kind, plural, namespaced)
KINDS: dict[str, tuple[str, str, str, str, bool]] = {
    "nodes": ("", "v1", "Node", "nodes", False),
    "pods": ("", "v1", "Pod", "pods", True),
    "pvcs": ("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", True),
    "pvs": ("", "v1", "PersistentVolume", "persistentvolumes", False),
    "services": ("", "v1", "Service", "services", True),
    "csinodes": ("storage.k8s.io", "v1", "CSINode", "csinodes", False),
    "storageclasses": ("storage.k8s.io", "v1", "StorageClass", "storageclasses", False),
    "csidrivers": ("storage.k8s.io", "v1", "CSIDriver", "csidrivers", False),
    "csistoragecapacities": (
        "storage.k8s.io", "v1", "CSIStorageCapacity", "csistoragecapacities", True,
    ),
    "webhooks": (
        "admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations", False,
    ),
    "endpointslices": ("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", True),
    "logicalvolumes": ("topolvm.io", "v1", "LogicalVolume", "logicalvolumes", False),
    "legacy-logicalvolumes": (
        "topolvm.cybozu.com", "v1", "LogicalVolume", "logicalvolumes", False,
    ),
    "volumemoves": ("topolvm.io", "v1", "VolumeMove", "volumemoves", True),
    "legacy-volumemoves": ("topolvm.cybozu.com", "v1", "VolumeMove", "volumemoves", True),
}  # fmt: skip
_EVENT = create_namespaced_resource("", "v1", "Event", "events")
_SECRET = create_namespaced_resource("", "v1", "Secret", "secrets")
# CRDs that are not installed read as no objects; any other 404 is a missing API.
_OPTIONAL = ("logicalvolumes", "legacy-logicalvolumes", "volumemoves", "legacy-volumemoves")
METRICS_FLAG = "--metrics-bind-address"
SCHEDULER_CONTAINER = "topolvm-scheduler"
SCHEDULER_PORT = 9251  # upstream's and the chart's default listen port
THIN_METRICS = {
    "topolvm_thinpool_data_percent": "data_percent",
    "topolvm_thinpool_metadata_percent": "metadata_percent",
}


class DoctorError(Exception):
    """The cluster could not be read at all (unreachable API server, bad credentials)."""


def _resource(kind: str) -> Any:
    group, version, k, plural, namespaced = KINDS[kind]
    make = create_namespaced_resource if namespaced else create_global_resource
    try:
        return make(group, version, k, plural)
    except ValueError:  # lightkube's typed model of a core kind is registered (imported)
        # A generic class of our own, left out of lightkube's registry: plain JSON objects.
        base = GenericNamespacedResource if namespaced else GenericGlobalResource
        return type(k, (base,), {"_api_info": create_api_info(group, version, k, plural)})


async def _list(client: AsyncClient, res: Any, **kw: Any) -> list[Obj]:
    """Every object of ``res`` (of every namespace, unless ``namespace`` is given)."""
    if issubclass(res, NamespacedResource):
        kw.setdefault("namespace", ALL_NS)
    with kube.translated():
        return [api.to_dict(o) async for o in client.list(res, chunk_size=CHUNK, **kw)]


async def collect(client: AsyncClient) -> Snapshot:
    """Every kind the checks read; a kind that cannot be read is recorded with the reason.
    Raises DoctorError when the API server cannot be used at all."""
    snap = Snapshot({})

    async def read(kind: str, coro: Any) -> None:
        try:
            snap.objects[kind] = await coro
        except kube.NotFound as e:
            if kind in _OPTIONAL:
                snap.objects[kind] = []
                return
            snap.unreadable[kind] = str(e)
        except (kube.StatusError, kube.ProxyError) as e:  # unreachable: no check can run
            snap.unreadable[kind] = str(e)
            log.debug("cannot read %s: %s", kind, e)

    async def events() -> list[Obj]:
        lists = await asyncio.gather(
            *(_list(client, _EVENT, fields={"reason": r}) for r in EVENT_REASONS)
        )
        return [e for items in lists for e in items]

    try:
        await asyncio.gather(
            *(read(kind, _list(client, _resource(kind))) for kind in KINDS),
            read("events", events()),
        )
        if snap.unreadable.get("nodes", "").startswith("401"):
            raise DoctorError(f"the API server refused the credentials: {snap.unreadable['nodes']}")
        # What is read through another kind cannot be read without it.
        if not _depends(snap, "secrets", "webhooks"):
            await read("secrets", _webhook_secrets(client, snap))
        snap.objects["served-certificates"] = await _served_certificates(snap)
        async with api.proxy_client(client) as http:
            if not _depends(snap, "node-metrics", "pods"):
                await read("node-metrics", _node_metrics(http, snap))
            snap.objects["scheduler-status"] = await _scheduler_status(http, snap)
    except (kube.Unreachable, httpx2.TransportError) as e:  # the pod proxy client is httpx's
        raise DoctorError(kube.describe(e)) from e
    return snap


def _depends(snap: Snapshot, kind: str, on: str) -> bool:
    """Marks ``kind`` unreadable when ``on`` is; True then."""
    if on in snap.unreadable:
        snap.unreadable[kind] = f"needs {on}: {snap.unreadable[on]}"
        return True
    return False


def metrics_port(pod: Obj) -> int:
    """topolvm-node's --metrics-bind-address port (upstream's default :8080; 0: off)."""
    c = container_of(pod, TOPOLVM_NODE_CONTAINER) or {}
    argv = [str(a) for a in [*(c.get("command") or []), *(c.get("args") or [])]]
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag != METRICS_FLAG:
            continue
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        if value in ("", "0"):  # the flag's way of turning metrics off
            return 0
        try:
            return parse_listen(value)[1]
        except ValueError:
            continue
    return 8080


def thin_pools(text: str) -> list[Obj]:
    """Thin pool usage per device class from topolvm-node's /metrics."""
    pools: dict[str, Obj] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = THIN_METRICS.get(sample.name)
            if key is not None:
                dc = sample.labels.get("device_class", "")
                pools.setdefault(dc, {"device_class": dc})[key] = float(sample.value)
    return list(pools.values())


async def _node_metrics(http: httpx2.AsyncClient, snap: Snapshot) -> list[Obj]:
    """Thin pool usage of every running topolvm-node pod, read from its /metrics through the
    API server's pod proxy (RBAC: ``get pods/proxy``). A 403 makes the kind unreadable; a pod
    that does not answer is recorded with the error."""
    gate = asyncio.Semaphore(16)
    pods = [
        p for p in snap.topolvm_node_pods()
        if (p.get("status") or {}).get("phase") == "Running"
        and (p.get("status") or {}).get("podIP")
    ]  # fmt: skip

    async def fetch(pod: Obj) -> Obj:
        node = str(pod["spec"]["nodeName"])
        out: Obj = {"metadata": {"name": node}, "pod": f"{ns_of(pod)}/{name_of(pod)}"}
        async with gate:
            try:
                port = metrics_port(pod)
                if port == 0:
                    out["error"] = "metrics are off (--metrics-bind-address with port 0)"
                    return out
                text = await api.pod_proxy_get(http, ns_of(pod), name_of(pod), port, "metrics")
            except kube.ProxyError as e:
                if e.code in (401, 403):
                    raise  # no right to read any node's metrics: the kind is unreadable
                out["error"] = str(e)
                return out
        out["pools"] = thin_pools(text)
        return out

    return list(await asyncio.gather(*(fetch(p) for p in pods)))


async def _scheduler_status(http: httpx2.AsyncClient, snap: Snapshot) -> list[Obj]:
    """``/status`` of running topolvm-scheduler pods (ours says whether kube-scheduler calls
    it), through the pod proxy: evidence only, so any failure is kept as the entry's error."""
    out = []
    for pod in snap["pods"]:
        sched = container_of(pod, SCHEDULER_CONTAINER)
        status = pod.get("status") or {}
        if sched is None or status.get("phase") != "Running" or not status.get("podIP"):
            continue
        ports = [p.get("containerPort") for p in sched.get("ports") or []]
        port = int(ports[0]) if ports and ports[0] else SCHEDULER_PORT
        entry: Obj = {"metadata": {"name": name_of(pod), "namespace": ns_of(pod)}}
        try:
            entry["status"] = json.loads(
                await api.pod_proxy_get(http, ns_of(pod), name_of(pod), port, "status")
            )
        except (kube.ProxyError, ValueError) as e:
            entry["error"] = str(e)
        out.append(entry)
        if len(out) >= 3:  # one answer tells how kube-scheduler is wired
            break
    return out


async def _webhook_secrets(client: AsyncClient, snap: Snapshot) -> list[Obj]:
    """TLS Secrets in the namespaces of TopoLVM's webhook Services (where a serving
    certificate lives), to compare with the configurations' caBundle."""
    namespaces = {
        str(svc.get("namespace"))
        for _, hook, _ in snap.pod_webhooks()
        if (svc := (hook.get("clientConfig") or {}).get("service"))
    }
    out: list[Obj] = []
    for ns in sorted(namespaces):
        out += await _list(client, _SECRET, namespace=ns, fields={"type": "kubernetes.io/tls"})
    return out


async def _served_certificates(snap: Snapshot) -> list[Obj]:
    """For webhooks called by URL: whether the certificate chain the URL serves verifies with
    the hook's caBundle (a TLS handshake, as the API server makes it), and the leaf (DER, hex).
    Unreachable URLs are left out: the doctor may run outside the cluster."""
    out = []
    for _, hook, _ in snap.pod_webhooks():
        config = hook.get("clientConfig") or {}
        url = str(config.get("url") or "")
        if not url.startswith("https://"):
            continue
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or 443
        der = await _handshake(host, port, None)
        if der is None:
            continue
        try:
            cadata = base64.b64decode(str(config.get("caBundle") or "")).decode()
        except (ValueError, binascii.Error):
            cadata = ""
        trusted = bool(cadata) and await _handshake(host, port, cadata) is not None
        out.append({"metadata": {"name": url}, "der": der.hex(), "trusted": trusted})
    return out


async def _handshake(host: str, port: int, cadata: str | None) -> bytes | None:
    """The served leaf certificate; with ``cadata``, None unless the chain verifies with it
    (host names are not checked: the question is the CA)."""
    if cadata is None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # only to read the certificate; nothing is sent
    else:
        try:
            ctx = ssl.create_default_context(cadata=cadata)
        except ssl.SSLError:
            return None
        ctx.check_hostname = False
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ctx), TLS_TIMEOUT
        )
    except (OSError, TimeoutError) as e:  # ssl.SSLError is an OSError
        log.debug("TLS handshake with webhook %s:%s: %s", host, port, e)
        return None
    try:
        obj = writer.get_extra_info("ssl_object")
        der = obj.getpeercert(binary_form=True) if obj is not None else None
        return bytes(der) if der else None
    finally:
        writer.close()

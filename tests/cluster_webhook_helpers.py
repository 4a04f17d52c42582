"""The pod webhook behind the real kube-apiserver, for tests/test_cluster_webhook_*.py (and the
doctor's): a MutatingWebhookConfiguration calls our HTTPS server on 127.0.0.1 (the API server
runs in the same network namespace), with the self-managed certificate whose CA webhookcerts
writes into the caBundle."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

from lightkube import AsyncClient, codecs
from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration
from lightkube.resources.core_v1 import Namespace, Pod, Secret, ServiceAccount
from lightkube.resources.storage_v1 import StorageClass
from prometheus_client import CollectorRegistry

from devtools.testbed.controlplane import ControlPlane
from tests.cluster_fixtures import unique
from tests.helpers import eventually, free_port
from topolvm.constants import NORMAL
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.webhook import ApiPodReader, start_webhook_server, stop_webhook_server
from topolvm.controller.webhookcerts import CertBundle, SelfManagedCerts
from topolvm.k8s import api

GiB = 1 << 30
Obj = dict[str, Any]
HOOK_NAME = "pod-hook.topolvm.io"


@dataclass
class Hook:
    cp: ControlPlane
    client: AsyncClient
    ns: str
    port: int
    configuration: str
    secret: str
    classes: dict[str, str]  # role (ssd, plain, foreign) -> StorageClass name
    certs: SelfManagedCerts
    registry: CollectorRegistry

    def decisions(self, kind: str) -> float:
        value = self.registry.get_sample_value(
            "topolvm_controller_webhook_decisions_total", {"decision": kind}
        )
        return value or 0.0

    async def create(self, obj: Obj) -> tuple[int, str]:
        """``kubectl create`` (without blocking the event loop the webhook runs in); returns
        the exit code and stderr, where kubectl prints the webhook's warnings."""
        proc = await asyncio.create_subprocess_exec(
            str(self.cp.bins["kubectl"]), f"--kubeconfig={self.cp.kubeconfig}",
            "create", "-n", self.ns, "-f", "-",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(json.dumps(obj).encode()), 60)
        return proc.returncode or 0, err.decode()

    async def pod(self, name: str) -> Obj:
        obj = await api.get(self.client, Pod, name, namespace=self.ns)
        assert obj is not None, f"pod {name} was not stored"
        return obj

    async def secret_bundle(self) -> CertBundle:
        obj = await api.get(self.client, Secret, self.secret, namespace=self.ns)
        assert obj is not None and obj["type"] == "kubernetes.io/tls"
        bundle = CertBundle.from_secret(obj)
        assert bundle is not None
        return bundle

    async def ca_bundles(self) -> list[str]:
        obj = await api.get(self.client, MutatingWebhookConfiguration, self.configuration)
        assert obj is not None
        return [w["clientConfig"].get("caBundle", "") for w in obj["webhooks"]]

    async def put_secret(self, bundle: CertBundle) -> None:
        patch = {"data": bundle.secret_data()}
        await api.patch_merge(self.client, Secret, self.secret, patch, namespace=self.ns)


async def create(client: AsyncClient, obj: Obj) -> None:
    await client.create(cast(Any, codecs.from_dict(obj)))


def storage_class(name: str, provisioner: str, device_class: str | None) -> Obj:
    params = {} if device_class is None else {f"{provisioner}/device-class": device_class}
    return {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
        "provisioner": provisioner, "parameters": params,
        "volumeBindingMode": "WaitForFirstConsumer",
    }  # fmt: skip


def configuration(name: str, ns: str, port: int) -> Obj:
    """Upstream's pod hook (spec §7.1), reached by URL, only for the test's namespace."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": HOOK_NAME,
            "admissionReviewVersions": ["v1", "v1beta1"],
            "clientConfig": {"url": f"https://127.0.0.1:{port}/pod/mutate"},
            "rules": [{
                "operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                "resources": ["pods"],
            }],
            "failurePolicy": "Fail", "matchPolicy": "Equivalent", "sideEffects": "None",
            "timeoutSeconds": 10,
            "namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [ns]},
                {"key": NORMAL.webhook_ignore_label, "operator": "NotIn", "values": ["ignore"]},
            ]},
        }],
    }  # fmt: skip


def pvc(name: str, sc_name: str, size: str, volume: str | None = None) -> Obj:
    spec: Obj = {
        "storageClassName": sc_name, "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}},
    }  # fmt: skip
    if volume:
        spec["volumeName"] = volume
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": spec}  # fmt: skip


def claim(name: str) -> Obj:
    return {"name": f"v-{name}", "persistentVolumeClaim": {"claimName": name}}


def ephemeral(name: str, sc_name: str, size: str) -> Obj:
    spec = {
        "storageClassName": sc_name, "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}},
    }  # fmt: skip
    return {"name": name, "ephemeral": {"volumeClaimTemplate": {"spec": spec}}}


def pod(name: str, *volumes: Obj, containers: int = 2) -> Obj:
    """A pod no scheduler picks up (so it can be deleted without a kubelet), without a
    namespace of its own, like one made from a template."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "schedulerName": "nobody", "automountServiceAccountToken": False,
            "containers": [
                {"name": f"c{i}", "image": "registry.invalid/app:1"} for i in range(containers)
            ],
            "volumes": list(volumes),
        },
    }  # fmt: skip


def capacity(p: Obj) -> dict[str, str]:
    annotations = p["metadata"].get("annotations") or {}
    return {k: v for k, v in annotations.items() if k.startswith(NORMAL.capacity_prefix)}


def marker(p: Obj) -> list[tuple[str, str | None, str | None]]:
    res = NORMAL.capacity_resource
    out = []
    for c in p["spec"]["containers"]:
        r = c.get("resources") or {}
        out.append(
            (c["name"], (r.get("requests") or {}).get(res), (r.get("limits") or {}).get(res))
        )
    return out


@contextlib.asynccontextmanager
async def webhook(
    cp: ControlPlane, client: AsyncClient, *, marker_mode: bool, configure: bool = True,
    periodic_checks: bool = True,
) -> AsyncIterator[Hook]:  # fmt: skip
    """A namespace, StorageClasses, the self-managed certificate, the webhook server and the
    configuration (unless ``configure`` is False), and the certificate's periodic checks
    (unless ``periodic_checks`` is False: they would restore this hook's caBundle within
    0.2 s); everything is removed afterwards."""
    ns = unique("webhook")
    classes = {role: unique(f"wh-{role}") for role in ("ssd", "plain", "foreign")}
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    port = free_port()
    certs = SelfManagedCerts(
        client, ns, "topolvm-webhook-tls", ns, "topolvm-controller", extra_ips=["127.0.0.1"],
        metrics=metrics, check_interval=0.2, retry_interval=0.2,
    )  # fmt: skip
    hook = Hook(cp, client, ns, port, ns, "topolvm-webhook-tls", classes, certs, registry)
    runner, task = None, None
    try:
        await create(client, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        await create(client, storage_class(classes["ssd"], "topolvm.io", "ssd"))
        await create(client, storage_class(classes["plain"], "topolvm.io", None))
        await create(client, storage_class(classes["foreign"], "example.com/nfs", "ssd"))
        if configure:
            await create(client, configuration(ns, ns, port))
        await certs.setup()
        runner = await start_webhook_server(
            "127.0.0.1", port, certs.ssl_context, ApiPodReader(client), NORMAL, marker_mode,
            metrics,
        )  # fmt: skip
        if periodic_checks:
            task = asyncio.create_task(certs.run())
        await eventually(  # pods need it (ServiceAccount admission)
            "the default ServiceAccount",
            lambda: api.get(client, ServiceAccount, "default", namespace=ns),
        )
        yield hook
    finally:
        await api.delete(client, MutatingWebhookConfiguration, ns)
        if task is not None:  # as the controller stops it: the round in progress finishes
            certs.stop()
            await task
        if runner is not None:
            await stop_webhook_server(runner)
        for sc_name in classes.values():
            await api.delete(client, StorageClass, sc_name)
        await api.delete(client, Namespace, ns)


async def served_by_api_server(hook: Hook) -> None:
    """Wait until the API server calls the webhook with a CA it trusts: a dry-run create of a
    pod with a TopoLVM ephemeral volume comes back annotated."""
    probe = pod("probe", ephemeral("e", hook.classes["ssd"], "1Gi"))

    async def mutated() -> bool:
        proc = await asyncio.create_subprocess_exec(
            str(hook.cp.bins["kubectl"]), f"--kubeconfig={hook.cp.kubeconfig}",
            "create", "--dry-run=server", "-o", "json", "-n", hook.ns, "-f", "-",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await proc.communicate(json.dumps(probe).encode())
        return proc.returncode == 0 and bool(capacity(json.loads(out)))

    await eventually("the API server to call the webhook", mutated, timeout=30, interval=0.2)

"""The pod webhook behind the real kube-apiserver: a MutatingWebhookConfiguration calls our
HTTPS server on 127.0.0.1 (the API server runs in the same network namespace), with the
self-managed certificate whose CA webhookcerts writes into the caBundle."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from lightkube import AsyncClient, codecs
from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration
from lightkube.resources.core_v1 import (
    Namespace,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    Secret,
    ServiceAccount,
)
from lightkube.resources.storage_v1 import StorageClass
from prometheus_client import CollectorRegistry

from devtools.testbed.controlplane import ControlPlane
from tests.cluster_fixtures import unique
from tests.helpers import eventually, free_port
from topolvm.constants import NORMAL
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.webhook import ApiPodReader, start_webhook_server, stop_webhook_server
from topolvm.controller.webhookcerts import (
    CertBundle,
    SelfManagedCerts,
    new_bundle,
    new_serving_cert,
)
from topolvm.k8s import api

pytestmark = pytest.mark.cluster
GiB = 1 << 30
DAY = datetime.timedelta(days=1)
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


@pytest.mark.parametrize("marker_mode", [False, True], ids=["annotations", "marker"])
async def test_pods_get_capacity_annotations_and_the_marker_only_in_marker_mode(
    control_plane: ControlPlane, cluster_client: AsyncClient, marker_mode: bool
) -> None:
    async with webhook(control_plane, cluster_client, marker_mode=marker_mode) as hook:
        await served_by_api_server(hook)
        sc = hook.classes
        for obj in (pvc("data", sc["ssd"], "3Gi"), pvc("shared", sc["foreign"], "9Gi")):
            await create(cluster_client, {**obj, "metadata": {"name": obj["metadata"]["name"],
                                                              "namespace": hook.ns}})  # fmt: skip
        app = pod(
            "app", claim("data"), claim("shared"), claim("not-yet-created"),
            ephemeral("scratch", sc["plain"], "2Gi"), {"name": "tmp", "emptyDir": {}},
        )  # fmt: skip
        code, stderr = await hook.create(app)
        assert code == 0, stderr
        stored = await hook.pod("app")
        assert capacity(stored) == {
            "capacity.topolvm.io/ssd": str(3 * GiB),
            "capacity.topolvm.io/00default": str(2 * GiB),
        }
        if marker_mode:
            assert marker(stored) == [("c0", "1", "1"), ("c1", None, None)]
            assert "Warning: topolvm.io/capacity added: capacity-aware placement needs " \
                "topolvm-scheduler as a kube-scheduler extender" in stderr  # fmt: skip
            assert "Warning: topolvm-node advertises topolvm.io/capacity" in stderr
        else:
            assert marker(stored) == [("c0", None, None), ("c1", None, None)]
            assert "Warning" not in stderr
        assert hook.decisions("mutated") >= 2  # the probe(s) and the pod

        code, stderr = await hook.create(pod("plain", {"name": "tmp", "emptyDir": {}}))
        assert code == 0, stderr
        plain = await hook.pod("plain")
        assert capacity(plain) == {} and marker(plain)[0] == ("c0", None, None)

        code, stderr = await hook.create(pod("empty", containers=0))
        assert code != 0
        assert f'admission webhook "{HOOK_NAME}" denied the request: pod has no containers' in (
            stderr
        )
        assert hook.decisions("denied") == 1


async def test_a_bound_topolvm_pvc_leaves_the_pod_unmutated(
    control_plane: ControlPlane, cluster_client: AsyncClient
) -> None:
    async with webhook(control_plane, cluster_client, marker_mode=True) as hook:
        pv = unique("wh-pv")
        try:
            await create(cluster_client, {
                "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
                "spec": {
                    "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                    "storageClassName": hook.classes["ssd"], "hostPath": {"path": "/tmp/x"},
                    "persistentVolumeReclaimPolicy": "Delete",
                    "claimRef": {"namespace": hook.ns, "name": "bound"},
                },
            })  # fmt: skip
            bound = pvc("bound", hook.classes["ssd"], "1Gi", volume=pv)
            bound["metadata"]["namespace"] = hook.ns
            await create(cluster_client, bound)

            async def is_bound() -> bool:
                obj = await api.get(
                    cluster_client, PersistentVolumeClaim, "bound", namespace=hook.ns
                )
                return bool((obj or {}).get("status", {}).get("phase") == "Bound")

            await eventually("the PVC bound by kube-controller-manager", is_bound)
            await served_by_api_server(hook)
            app = pod("app", ephemeral("e", hook.classes["ssd"], "5Gi"), claim("bound"))
            code, stderr = await hook.create(app)
            assert code == 0, stderr
            stored = await hook.pod("app")
            assert capacity(stored) == {}
            assert marker(stored) == [("c0", None, None), ("c1", None, None)]
            assert "Warning" not in stderr
        finally:
            await api.delete(cluster_client, PersistentVolume, pv)


def der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)


async def served_cert(port: int, ca: bytes) -> bytes:
    """The certificate our server presents, verified against ``ca`` for 127.0.0.1."""
    tls = ssl.create_default_context(cadata=ca.decode())
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    cert: bytes = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return cert


async def test_replicas_share_the_secret_and_a_lost_race_uses_the_winners(
    control_plane: ControlPlane, cluster_client: AsyncClient
) -> None:
    async with webhook(
        control_plane, cluster_client, marker_mode=False, periodic_checks=False
    ) as hook:
        stored = await hook.secret_bundle()
        assert hook.certs.loaded == stored
        assert await hook.ca_bundles() == [base64.b64encode(stored.ca_crt).decode()]
        assert await served_cert(hook.port, stored.ca_crt) == der(stored.tls_crt)
        sans = (
            x509.load_pem_x509_certificate(stored.tls_crt)
            .extensions.get_extension_for_class(x509.SubjectAlternativeName)
            .value
        )
        assert sans.get_values_for_type(x509.DNSName) == [
            "topolvm-controller", f"topolvm-controller.{hook.ns}",
            f"topolvm-controller.{hook.ns}.svc", f"topolvm-controller.{hook.ns}.svc.cluster.local",
        ]  # fmt: skip

        def replica(secret: str) -> SelfManagedCerts:
            return SelfManagedCerts(
                cluster_client, hook.ns, secret, hook.configuration, "topolvm-controller",
                extra_ips=["127.0.0.1"],
            )  # fmt: skip

        second = replica(hook.secret)
        await second.setup()
        assert second.loaded == stored  # reused, not replaced
        assert await hook.secret_bundle() == stored

        racers = [replica("raced"), replica("raced")]
        await asyncio.gather(*(r.setup() for r in racers))
        assert racers[0].loaded is not None and racers[0].loaded == racers[1].loaded
        raced = await api.get(cluster_client, Secret, "raced", namespace=hook.ns)
        assert CertBundle.from_secret(raced or {}) == racers[0].loaded
        # The configuration has one caBundle; the last writer's CA is in it.
        assert await hook.ca_bundles() == [base64.b64encode(racers[0].loaded.ca_crt).decode()]


async def test_renewal_replaces_the_certificate_and_the_ca_bundle(
    control_plane: ControlPlane, cluster_client: AsyncClient
) -> None:
    async with webhook(control_plane, cluster_client, marker_mode=False) as hook:
        first = await hook.secret_bundle()
        now = datetime.datetime.now(datetime.UTC)
        dns, ips = hook.certs.dns_names, ["127.0.0.1"]

        # A serving certificate 300 days into its year: renewed with the same CA.
        crt, key = new_serving_cert(first.ca_crt, first.ca_key, dns, ips, now - 300 * DAY)
        await hook.put_secret(CertBundle(crt, key, first.ca_crt, first.ca_key))

        async def renewed(old: bytes) -> CertBundle | None:
            b = await hook.secret_bundle()
            return b if b.tls_crt not in (old, first.tls_crt) else None

        second: CertBundle = await eventually(
            "the serving certificate renewed", lambda: renewed(crt)
        )
        assert (second.ca_crt, second.ca_key) == (first.ca_crt, first.ca_key)
        assert await hook.ca_bundles() == [base64.b64encode(first.ca_crt).decode()]
        new_cert = x509.load_pem_x509_certificate(second.tls_crt)
        assert new_cert.not_valid_after_utc > now + 360 * DAY
        await eventually(
            "the new certificate served",
            lambda: _serves(hook.port, first.ca_crt, second.tls_crt),
        )

        # A CA 7 of its 10 years old: a new CA; the caBundle gets it, the old one stays after it.
        aged = new_bundle(dns, ips, now - 7 * 365 * DAY)
        await hook.put_secret(aged)
        third: CertBundle = await eventually("the CA renewed", lambda: renewed(aged.tls_crt))
        cas = x509.load_pem_x509_certificates(third.ca_crt)
        assert der(aged.ca_crt) not in [c.public_bytes(Encoding.DER) for c in cas[:1]]
        assert cas[1].public_bytes(Encoding.DER) == der(aged.ca_crt)
        want = [base64.b64encode(third.ca_crt).decode()]
        await eventually("the caBundle updated", lambda: _equals(hook.ca_bundles(), want))
        new_ca = cas[0].public_bytes(Encoding.PEM)
        await eventually(
            "the new certificate served", lambda: _serves(hook.port, new_ca, third.tls_crt)
        )
        expiry = hook.registry.get_sample_value(
            "topolvm_controller_webhook_certificate_expiry_timestamp_seconds"
        )
        assert (
            expiry == x509.load_pem_x509_certificate(third.tls_crt).not_valid_after_utc.timestamp()
        )

        # The API server trusts the new certificate through the new caBundle.
        await served_by_api_server(hook)
        code, stderr = await hook.create(pod("app", ephemeral("e", hook.classes["ssd"], "1Gi")))
        assert code == 0, stderr
        assert capacity(await hook.pod("app")) == {"capacity.topolvm.io/ssd": str(GiB)}


async def _serves(port: int, ca: bytes, cert: bytes) -> bool:
    try:
        return await served_cert(port, ca) == der(cert)
    except ssl.SSLError:
        return False


async def _equals(value: Any, want: Any) -> bool:
    return bool(await value == want)


async def test_a_missing_configuration_is_retried_not_fatal(
    control_plane: ControlPlane, cluster_client: AsyncClient
) -> None:
    async with webhook(control_plane, cluster_client, marker_mode=False, configure=False) as hook:
        assert hook.certs.ca_bundle_written is False  # setup() went on without it
        await create(cluster_client, configuration(hook.configuration, hook.ns, hook.port))
        stored = await hook.secret_bundle()
        want = [base64.b64encode(stored.ca_crt).decode()]
        await eventually("the caBundle written", lambda: _equals(hook.ca_bundles(), want))
        await served_by_api_server(hook)

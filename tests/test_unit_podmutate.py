"""The pod webhook's decision (spec §7.1), its HTTPS server, and its certificates, without
Kubernetes. The API server side is in test_cluster_webhook.py."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import pytest
from cryptography import x509
from prometheus_client import CollectorRegistry

from tests.helpers import free_port
from topolvm.constants import LEGACY, NORMAL, Names
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.podmutate import Decision, decide, marker_warnings
from topolvm.controller.webhook import (
    ApiPodReader,
    CertDir,
    start_webhook_server,
    stop_webhook_server,
)
from topolvm.controller.webhookcerts import (
    CertBundle,
    new_bundle,
    new_serving_cert,
    renew,
    renewal_needed,
    service_dns_names,
)
from topolvm.k8s.api import make_client

GiB = 1 << 30
Obj = dict[str, Any]


class Reader:
    """PVCs and StorageClasses from dicts; records reads; ``fail`` makes a kind of read fail."""

    def __init__(self, pvcs: dict[str, Obj] | None = None, fail: str = "") -> None:
        self.pvcs = pvcs or {}
        self.classes: dict[str, Obj] = {
            "ssd": sc("topolvm.io", "ssd"),
            "plain": sc("topolvm.io", None),
            "legacy-ssd": sc("topolvm.cybozu.com", "ssd"),
            "nfs": sc("example.com/nfs", "ssd"),
        }
        self.fail = fail
        self.reads: list[str] = []

    async def get_pvc(self, namespace: str, name: str) -> Obj | None:
        self.reads.append(f"pvc {namespace}/{name}")
        if self.fail == "pvc":
            raise RuntimeError("503 ServiceUnavailable: etcd is down")
        return self.pvcs.get(f"{namespace}/{name}")

    async def get_storageclass(self, name: str) -> Obj | None:
        self.reads.append(f"sc {name}")
        if self.fail == "sc":
            raise RuntimeError("503 ServiceUnavailable: etcd is down")
        return self.classes.get(name)


def sc(provisioner: str, device_class: str | None) -> Obj:
    params = {} if device_class is None else {f"{provisioner}/device-class": device_class}
    return {"metadata": {"name": "x"}, "provisioner": provisioner, "parameters": params}


def pvc(sc_name: str | None, size: str | None = "1Gi", phase: str = "Pending") -> Obj:
    spec: Obj = {"accessModes": ["ReadWriteOnce"]}
    if sc_name is not None:
        spec["storageClassName"] = sc_name
    if size is not None:
        spec["resources"] = {"requests": {"storage": size}}
    return {"spec": spec, "status": {"phase": phase}}


def claim(name: str) -> Obj:
    return {"name": f"v-{name}", "persistentVolumeClaim": {"claimName": name}}


def ephemeral(sc_name: str | None, size: str | None = "1Gi", name: str = "eph") -> Obj:
    spec: Obj = {"accessModes": ["ReadWriteOnce"]}
    if sc_name is not None:
        spec["storageClassName"] = sc_name
    if size is not None:
        spec["resources"] = {"requests": {"storage": size}}
    return {"name": name, "ephemeral": {"volumeClaimTemplate": {"spec": spec}}}


def pod(*volumes: Obj, namespace: str | None = "app", containers: int = 2) -> Obj:
    meta: Obj = {"name": "p", "annotations": {"team": "a"}}
    if namespace is not None:
        meta["namespace"] = namespace
    ctrs = [
        {"name": f"c{i}", "image": "app:1", "resources": {"requests": {"cpu": "1"}}}
        for i in range(containers)
    ]
    spec: Obj = {"containers": ctrs}
    if volumes:
        spec["volumes"] = list(volumes)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def applied(original: Obj, decision: Decision) -> Obj:
    patched: Obj = jsonpatch.apply_patch(original, decision.patch)
    return patched


def capacity(p: Obj, names: Names = NORMAL) -> dict[str, str]:
    annotations = p["metadata"].get("annotations") or {}
    return {k: v for k, v in annotations.items() if k.startswith(names.capacity_prefix)}


async def test_a_pod_without_containers_is_denied_and_one_without_volumes_allowed() -> None:
    empty: list[Obj] = [pod(claim("data"), containers=0), {"metadata": {}, "spec": {}}]
    for p in empty:
        d = await decide(p, "app", Reader(), NORMAL)
        assert (d.kind, d.allowed, d.code, d.message) == (
            "denied", False, 403, "pod has no containers"
        )  # fmt: skip
    no_volumes: list[Obj] = [pod(), {"spec": {"containers": [{"name": "c"}], "volumes": []}}]
    for p in no_volumes:
        d = await decide(p, "app", Reader(), NORMAL)
        assert (d.kind, d.allowed, d.message, d.patch) == ("allowed", True, "no volumes", [])
    d = await decide("not a pod", "app", Reader(), NORMAL)
    assert (d.kind, d.code) == ("errored", 400)


async def test_pvcs_and_ephemeral_volumes_are_summed_per_device_class() -> None:
    reader = Reader({
        "app/a": pvc("ssd", "3Gi"), "app/b": pvc("ssd", "1.5Gi"), "app/c": pvc("plain", "100m"),
        "app/d": pvc("plain", None), "app/e": pvc("ssd", "0"),
    })  # fmt: skip
    p = pod(
        claim("a"), claim("b"), claim("c"), claim("d"), claim("e"),
        ephemeral("ssd", "2G", "e1"), ephemeral("plain", None, "e2"),
        {"name": "scratch", "emptyDir": {}},
    )  # fmt: skip
    d = await decide(p, "ignored", reader, NORMAL)
    assert d.kind == "mutated" and d.allowed
    # Bytes, not GiB; 100m rounds up to 1 byte; a missing or zero request counts 1 GiB.
    want = {"ssd": 3 * GiB + 1536 * (1 << 20) + GiB + 2 * 10**9, "00default": 1 + GiB + GiB}
    assert d.requested == want
    out = applied(p, d)
    assert capacity(out) == {f"capacity.topolvm.io/{k}": str(v) for k, v in want.items()}
    assert out["metadata"]["annotations"]["team"] == "a"
    assert d.warnings == []
    # The StorageClass cache: each class read once per request.
    assert sorted(r for r in reader.reads if r.startswith("sc")) == ["sc plain", "sc ssd"]


async def test_skipped_volumes_and_the_namespace_fallback() -> None:
    reader = Reader({
        "req-ns/foreign": pvc("nfs"), "req-ns/nosc": pvc(None), "req-ns/emptysc": pvc(""),
        "req-ns/unknown-sc": pvc("gone"), "req-ns/legacy": pvc("legacy-ssd"),
        "req-ns/mine": pvc("ssd", "5Gi"), "other/mine": pvc("ssd", "7Gi"),
        "req-ns/bound-nfs": pvc("nfs", phase="Bound"),
    })  # fmt: skip
    volumes = [
        claim("foreign"), claim("nosc"), claim("emptysc"), claim("unknown-sc"), claim("legacy"),
        claim("missing"), claim("bound-nfs"), claim("mine"), ephemeral(None, "9Gi", "e-nosc"),
        ephemeral("", "9Gi", "e-empty"), ephemeral("nfs", "9Gi", "e-nfs"), claim(""),
    ]  # fmt: skip
    # No namespace on the pod (a pod from a template): the request's namespace is used.
    d = await decide(pod(*volumes, namespace=None), "req-ns", reader, NORMAL)
    assert d.requested == {"ssd": 5 * GiB}
    assert "pvc req-ns/missing" in reader.reads  # a missing PVC is skipped, the pod admitted
    assert "pvc req-ns/" not in reader.reads and "sc " not in reader.reads  # no empty names
    d = await decide(pod(*volumes, namespace=""), "req-ns", reader, NORMAL)
    assert d.requested == {"ssd": 5 * GiB}
    d = await decide(pod(claim("mine"), namespace="other"), "req-ns", reader, NORMAL)
    assert d.requested == {"ssd": 7 * GiB}
    others = [v for v in volumes if v != claim("mine")]
    nothing = await decide(pod(*others, namespace=None), "req-ns", reader, NORMAL)
    assert (nothing.kind, nothing.message, nothing.patch) == (
        "allowed", "no request for TopoLVM", []
    )  # fmt: skip


@pytest.mark.parametrize("phase", ["Bound", "Lost"])
async def test_a_topolvm_pvc_that_is_not_pending_leaves_the_pod_alone(phase: str) -> None:
    reader = Reader({"app/new": pvc("ssd"), "app/old": pvc("plain", phase=phase)})
    for volumes in ([claim("new"), claim("old")], [claim("old"), ephemeral("ssd")]):
        d = await decide(pod(*volumes), "app", reader, NORMAL, marker=True)
        assert (d.kind, d.message, d.patch, d.warnings) == (
            "allowed", "no request for TopoLVM", [], []
        )  # fmt: skip


async def test_marker_mode_adds_the_resource_to_the_first_container_and_warns() -> None:
    reader = Reader({"app/a": pvc("ssd", "2Gi")})
    p = pod(claim("a"))
    p["spec"]["containers"][0]["resources"]["limits"] = {"memory": "1Gi"}
    p["metadata"]["annotations"]["capacity.topolvm.io/ssd"] = "1"  # overwritten
    plain = await decide(p, "app", reader, NORMAL)
    out = applied(p, plain)
    assert out["spec"] == p["spec"] and plain.warnings == []
    assert capacity(out) == {"capacity.topolvm.io/ssd": str(2 * GiB)}

    marked = await decide(p, "app", reader, NORMAL, marker=True)
    out = applied(p, marked)
    first, second = out["spec"]["containers"]
    assert first["resources"] == {
        "requests": {"cpu": "1", "topolvm.io/capacity": "1"},
        "limits": {"memory": "1Gi", "topolvm.io/capacity": "1"},
    }
    assert second == p["spec"]["containers"][1]
    assert capacity(out) == {"capacity.topolvm.io/ssd": str(2 * GiB)}
    assert marked.warnings == marker_warnings(NORMAL)
    text = " ".join(marked.warnings)
    for words in ("topolvm-scheduler", "kube-scheduler extender", "topolvm-node advertises"):
        assert words in text
    assert all(len(w) <= 120 for w in marked.warnings)
    # JSON pointers escape the "/" of annotation and resource names.
    paths = {op["path"] for op in marked.patch}
    assert "/metadata/annotations/capacity.topolvm.io~1ssd" in paths
    assert "/spec/containers/0/resources/requests/topolvm.io~1capacity" in paths
    # A container without resources at all gets whole maps (adding into a missing map fails).
    bare = pod(claim("a"), containers=1)
    del bare["spec"]["containers"][0]["resources"], bare["metadata"]["annotations"]
    out = applied(bare, await decide(bare, "app", reader, NORMAL, marker=True))
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"topolvm.io/capacity": "1"}
    assert capacity(out) == {"capacity.topolvm.io/ssd": str(2 * GiB)}


async def test_legacy_names() -> None:
    reader = Reader({"app/a": pvc("legacy-ssd", "1Gi"), "app/b": pvc("ssd")})
    d = await decide(pod(claim("a"), claim("b")), "app", reader, LEGACY, marker=True)
    out = applied(pod(claim("a"), claim("b")), d)
    assert capacity(out, LEGACY) == {"capacity.topolvm.cybozu.com/ssd": str(GiB)}
    assert out["spec"]["containers"][0]["resources"]["limits"] == {
        "topolvm.cybozu.com/capacity": "1"
    }


async def test_read_errors_and_bad_quantities_are_errors() -> None:
    p = pod(claim("a"), ephemeral("ssd"))
    d = await decide(p, "app", Reader({"app/a": pvc("ssd")}, fail="pvc"), NORMAL)
    assert (d.kind, d.allowed, d.code) == ("errored", False, 500)
    assert (
        d.message == "cannot get PersistentVolumeClaim app/a: 503 ServiceUnavailable: etcd is down"
    )
    d = await decide(p, "app", Reader({"app/a": pvc("ssd")}, fail="sc"), NORMAL)
    assert (d.code, d.message) == (
        500, "cannot get StorageClass ssd: 503 ServiceUnavailable: etcd is down"
    )  # fmt: skip
    d = await decide(pod(ephemeral("ssd", "lots")), "app", Reader(), NORMAL)
    assert (d.kind, d.code) == ("errored", 400)
    assert "ephemeral volume eph: resources.requests.storage" in d.message


# --- the HTTPS server ---------------------------------------------------------------------


def tls_files(tmp: Path, ips: tuple[str, ...] = ("127.0.0.1",)) -> CertBundle:
    bundle = new_bundle(["webhook.test"], ips, datetime.datetime.now(datetime.UTC))
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "tls.crt").write_bytes(bundle.tls_crt)
    (tmp / "tls.key").write_bytes(bundle.tls_key)
    return bundle


def samples(registry: CollectorRegistry) -> dict[str, float]:
    out = {}
    for d in ("mutated", "allowed", "denied", "errored"):
        value = registry.get_sample_value(
            "topolvm_controller_webhook_decisions_total", {"decision": d}
        )
        out[d] = value or 0.0
    return out


@dataclass
class Served:
    base: str  # marker mode, PVC "app/a" of 4Gi on "ssd"
    broken: str  # reads go to an API server that does not exist
    certs: CertDir
    bundle: CertBundle
    registry: CollectorRegistry

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.bundle.ca_crt.decode())


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    bundle = tls_files(tmp_path / "certs")
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    certs = CertDir(tmp_path / "certs", metrics)
    certs.load()
    client = make_client(server=f"https://127.0.0.1:{free_port()}")  # nothing listens there
    ports = free_port(), free_port()
    runners = [
        await start_webhook_server(
            "127.0.0.1", ports[0], certs.ssl_context, Reader({"app/a": pvc("ssd", "4Gi")}),
            NORMAL, True, metrics,
        ),
        await start_webhook_server(
            "127.0.0.1", ports[1], certs.ssl_context, ApiPodReader(client), NORMAL, False,
            metrics,
        ),
    ]  # fmt: skip
    try:
        base, broken = (f"https://127.0.0.1:{p}" for p in ports)
        yield Served(base, broken, certs, bundle, registry)
    finally:
        for runner in runners:
            await stop_webhook_server(runner)
        await client.close()


def admission_review(version: str, obj: Any, uid: str = "3f0c-uid") -> Obj:
    return {
        "apiVersion": version,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid, "namespace": "app", "operation": "CREATE", "object": obj,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
        },
    }  # fmt: skip


async def test_admission_reviews_over_https(served: Served) -> None:
    base, registry, tls = served.base, served.registry, served.tls()
    async with aiohttp.ClientSession() as http:

        async def post(body: Any, raw: bytes | None = None) -> tuple[int, Any]:
            data = raw if raw is not None else json.dumps(body).encode()
            async with http.post(f"{base}/pod/mutate", data=data, ssl=tls) as r:
                text = await r.text()
                return r.status, (json.loads(text) if r.status == 200 else text)

        for version in ("admission.k8s.io/v1", "admission.k8s.io/v1beta1"):
            original = pod(claim("a"), namespace=None)
            status, answer = await post(admission_review(version, original, uid=version))
            assert status == 200
            assert (answer["apiVersion"], answer["kind"]) == (version, "AdmissionReview")
            response = answer["response"]
            assert response["uid"] == version and response["allowed"] is True
            assert response["patchType"] == "JSONPatch"
            patch = json.loads(base64.b64decode(response["patch"]))
            out = jsonpatch.apply_patch(original, patch)
            assert capacity(out) == {"capacity.topolvm.io/ssd": str(4 * GiB)}
            assert out["spec"]["containers"][0]["resources"]["limits"] == {
                "topolvm.io/capacity": "1"
            }
            assert response["warnings"] == marker_warnings(NORMAL)

        status, answer = await post(admission_review("admission.k8s.io/v1", pod(containers=0)))
        assert answer["response"]["allowed"] is False
        assert answer["response"]["status"]["code"] == 403
        assert answer["response"]["status"]["message"] == "pod has no containers"
        assert "patch" not in answer["response"]
        status, answer = await post(admission_review("admission.k8s.io/v1", pod()))
        assert answer["response"]["allowed"] is True and "patch" not in answer["response"]

        for body, raw, why in [
            (None, b"{not json", "not JSON"),
            ({"apiVersion": "v1", "kind": "Pod"}, None, "not an AdmissionReview"),
            ({"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview"}, None, "v2"),
            ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, None, "uid"),
        ]:
            status, text = await post(body, raw)
            assert status == 400 and why in text, text
        async with http.get(f"{base}/pod/mutate", ssl=tls) as r:
            assert r.status == 405
    assert samples(registry) == {"mutated": 2, "allowed": 1, "denied": 1, "errored": 4}


async def peer_cert(port: int, ca: bytes) -> bytes:
    """The DER certificate the server presents, verified against ``ca`` for 127.0.0.1."""
    tls = ssl.create_default_context(cadata=ca.decode())
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    der: bytes = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return der


def der(pem: bytes) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    return x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)


async def test_an_api_read_error_answers_code_500(served: Served) -> None:
    review = admission_review("admission.k8s.io/v1", pod(claim("a")))
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{served.broken}/pod/mutate", json=review, ssl=served.tls()) as r,
    ):
        assert r.status == 200
        answer = (await r.json())["response"]
    assert answer["allowed"] is False and answer["status"]["code"] == 500
    assert answer["status"]["message"].startswith("cannot get PersistentVolumeClaim app/a: ")
    assert "cannot reach the Kubernetes API" in answer["status"]["message"]
    assert samples(served.registry)["errored"] == 1


async def test_the_cert_dir_is_reloaded_when_it_changes(served: Served, tmp_path: Path) -> None:
    port, certs, first, registry = served.port, served.certs, served.bundle, served.registry
    assert await peer_cert(port, first.ca_crt) == der(first.tls_crt)
    assert await certs.check() is False  # nothing changed
    second = tls_files(tmp_path / "certs")  # cert-manager renewed the secret
    assert await certs.check() is True
    assert await peer_cert(port, second.ca_crt) == der(second.tls_crt)
    expiry = registry.get_sample_value(
        "topolvm_controller_webhook_certificate_expiry_timestamp_seconds"
    )
    assert expiry == x509.load_pem_x509_certificate(second.tls_crt).not_valid_after_utc.timestamp()
    # Half-written (a key that does not match): the current certificate stays in use.
    (tmp_path / "certs" / "tls.key").write_bytes(first.tls_key)
    assert await certs.check() is False
    assert await peer_cert(port, second.ca_crt) == der(second.tls_crt)


def test_a_missing_cert_dir_is_reported_with_the_flag(tmp_path: Path) -> None:
    from topolvm.controller.webhook import WebhookCertError

    with pytest.raises(WebhookCertError, match=r"--cert-dir; expected tls.crt and tls.key"):
        CertDir(tmp_path / "nothing").load()


# --- certificates --------------------------------------------------------------------------

NOW = datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC)
DNS = service_dns_names("topolvm-controller", "topolvm-system")
DAY = datetime.timedelta(days=1)


def test_names_and_validity_of_a_new_bundle() -> None:
    assert DNS == [
        "topolvm-controller", "topolvm-controller.topolvm-system",
        "topolvm-controller.topolvm-system.svc",
        "topolvm-controller.topolvm-system.svc.cluster.local",
    ]  # fmt: skip
    b = new_bundle(DNS, ["127.0.0.1"], NOW)
    cert = x509.load_pem_x509_certificate(b.tls_crt)
    ca = x509.load_pem_x509_certificate(b.ca_crt)
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == DNS
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.not_valid_after_utc == NOW + 365 * DAY
    assert ca.not_valid_after_utc == NOW + 3650 * DAY
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert CertBundle.from_secret({"data": b.secret_data()}) == b
    assert set(b.secret_data()) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
    assert CertBundle.from_secret({"data": {"tls.crt": "eA=="}}) is None


def test_renewal_decisions() -> None:
    b = new_bundle(DNS, [], NOW)
    assert renewal_needed(b, DNS, [], NOW)[0] == "none"
    assert renewal_needed(b, DNS, [], NOW + 240 * DAY)[0] == "none"  # more than 1/3 left
    what, why = renewal_needed(b, DNS, [], NOW + 250 * DAY)
    assert what == "serving" and "expires" in why
    assert renewal_needed(b, DNS, [], NOW + 7 * 365 * DAY)[0] == "ca"
    assert renewal_needed(None, DNS, [], NOW)[0] == "ca"
    assert renewal_needed(b, [*DNS, "extra.example"], [], NOW)[0] == "serving"
    assert renewal_needed(b, DNS, ["10.0.0.1"], NOW)[0] == "serving"
    other = new_bundle(DNS, [], NOW)
    mixed = [
        CertBundle(other.tls_crt, other.tls_key, b.ca_crt, b.ca_key),  # another CA signed it
        CertBundle(b.tls_crt, other.tls_key, b.ca_crt, b.ca_key),  # key of another cert
    ]
    assert [renewal_needed(m, DNS, [], NOW)[0] for m in mixed] == ["serving", "serving"]
    assert renewal_needed(CertBundle(b"x", b"y", b"z", b"w"), DNS, [], NOW)[0] == "ca"
    assert (
        renewal_needed(CertBundle(b.tls_crt, b.tls_key, b.ca_crt, other.ca_key), DNS, [], NOW)[0]
        == "ca"
    )


def test_renewal_keeps_the_ca_or_rotates_it_keeping_the_old_one_in_the_bundle() -> None:
    b = new_bundle(DNS, [], NOW)
    later = NOW + 250 * DAY
    serving = renew(b, "serving", DNS, [], later)
    assert (serving.ca_crt, serving.ca_key) == (b.ca_crt, b.ca_key)
    assert serving.tls_crt != b.tls_crt
    assert renewal_needed(serving, DNS, [], later)[0] == "none"
    much_later = NOW + 7 * 365 * DAY
    rotated = renew(b, "ca", DNS, [], much_later)
    cas = x509.load_pem_x509_certificates(rotated.ca_crt)
    assert len(cas) == 2 and cas[1] == x509.load_pem_x509_certificate(b.ca_crt)
    x509.load_pem_x509_certificate(rotated.tls_crt).verify_directly_issued_by(cas[0])
    assert renewal_needed(rotated, DNS, [], much_later)[0] == "none"
    # An old CA that has expired is dropped from the bundle.
    again = renew(rotated, "ca", DNS, [], NOW + 11 * 365 * DAY)
    assert len(x509.load_pem_x509_certificates(again.ca_crt)) == 2  # rotated's CA, not b's
    crt, _ = new_serving_cert(b.ca_crt, b.ca_key, ["a"], [], NOW)
    assert x509.load_pem_x509_certificate(crt).subject.rfc4514_string() == "CN=a"

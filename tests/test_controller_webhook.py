"""The controller's pod webhook HTTPS server without Kubernetes: AdmissionReviews over HTTPS,
API read errors, and reloading its certificate directory."""

from __future__ import annotations

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

from tests.helpers import der, free_port, served_cert
from tests.podmutate_helpers import GiB, Obj, Reader, capacity, claim, pod, pvc
from topolvm.constants import NORMAL
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.podmutate import marker_warnings
from topolvm.controller.webhook import (
    ApiPodReader,
    CertDir,
    start_webhook_server,
    stop_webhook_server,
)
from topolvm.controller.webhookcerts import CertBundle, new_bundle
from topolvm.k8s.api import make_client


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
    assert await served_cert(port, first.ca_crt) == der(first.tls_crt)
    assert await certs.check() is False  # nothing changed
    second = tls_files(tmp_path / "certs")  # cert-manager renewed the secret
    assert await certs.check() is True
    assert await served_cert(port, second.ca_crt) == der(second.tls_crt)
    expiry = registry.get_sample_value(
        "topolvm_controller_webhook_certificate_expiry_timestamp_seconds"
    )
    assert expiry == x509.load_pem_x509_certificate(second.tls_crt).not_valid_after_utc.timestamp()
    # Half-written (a key that does not match): the current certificate stays in use.
    (tmp_path / "certs" / "tls.key").write_bytes(first.tls_key)
    assert await certs.check() is False
    assert await served_cert(port, second.ca_crt) == der(second.tls_crt)


def test_a_missing_cert_dir_is_reported_with_the_flag(tmp_path: Path) -> None:
    from topolvm.controller.webhook import WebhookCertError

    with pytest.raises(WebhookCertError, match=r"--cert-dir; expected tls.crt and tls.key"):
        CertDir(tmp_path / "nothing").load()

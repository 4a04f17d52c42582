"""The pod webhook's self-managed certificate behind the real kube-apiserver: replicas share
the Secret, renewal replaces the certificate and the caBundle, a missing configuration is
retried."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ssl
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Secret

from devtools.testbed.controlplane import ControlPlane
from tests.cluster_webhook_helpers import (
    GiB,
    capacity,
    configuration,
    create,
    ephemeral,
    pod,
    served_by_api_server,
    webhook,
)
from tests.helpers import der, eventually, served_cert
from topolvm.controller.webhookcerts import (
    CertBundle,
    SelfManagedCerts,
    new_bundle,
    new_serving_cert,
)
from topolvm.k8s import api

pytestmark = pytest.mark.cluster
DAY = datetime.timedelta(days=1)


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

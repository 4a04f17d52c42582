"""Self-managed TLS certificates of the pod webhook, for clusters without cert-manager
(docs/webhook.md; the other mode, ``--cert-dir``, is :class:`topolvm.controller.webhook.CertDir`).

The controller makes a CA and a serving certificate for the webhook Service's DNS names and
keeps them in a ``kubernetes.io/tls`` Secret of its namespace (``tls.crt``, ``tls.key``,
``ca.crt``, and ``ca.key`` to sign renewals), so every replica serves the same certificate. It
writes ``ca.crt`` to the ``caBundle`` of each webhook of its MutatingWebhookConfiguration and
renews before expiry: a certificate is renewed when less than a third of its validity is left.
A new certificate is loaded into the same :class:`ssl.SSLContext` the server already uses.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import ipaddress
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration
from lightkube.resources.core_v1 import Secret

from topolvm.certs import issue, pem_key, utc_now
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.webhook import (
    WebhookCertError,
    load_pair,
    not_after,
    server_ssl_context,
)
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.process import stopped_within

log = logging.getLogger("topolvm.controller.webhookcerts")

SERVING_VALIDITY = datetime.timedelta(days=365)
CA_VALIDITY = datetime.timedelta(days=3650)
CA_COMMON_NAME = "ca.webhook.topolvm"
Clock = Callable[[], datetime.datetime]
Renewal = Literal["none", "serving", "ca"]


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names the API server may use for the webhook Service."""
    svc = f"{service}.{namespace}.svc"
    return [service, f"{service}.{namespace}", svc, f"{svc}.cluster.local"]


def _spki(key: Any) -> bytes:
    out: bytes = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return out


def new_ca(
    now: datetime.datetime, validity: datetime.timedelta = CA_VALIDITY
) -> tuple[bytes, bytes]:
    """A self-signed CA certificate and its key (PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    extensions: list[tuple[x509.ExtensionType, bool]] = [
        (x509.BasicConstraints(ca=True, path_length=0), True), (usage, True), (ski, False),
    ]  # fmt: skip
    return issue(CA_COMMON_NAME, None, key, key, now, validity, extensions), pem_key(key)


def new_serving_cert(
    ca_crt: bytes, ca_key: bytes, dns_names: Iterable[str], ips: Iterable[str] = (),
    now: datetime.datetime | None = None, validity: datetime.timedelta = SERVING_VALIDITY,
) -> tuple[bytes, bytes]:  # fmt: skip
    """A serving certificate for ``dns_names`` and ``ips`` signed by the CA, and its key."""
    ca = x509.load_pem_x509_certificates(ca_crt)[0]
    signer = serialization.load_pem_private_key(ca_key, password=None)
    if not isinstance(signer, ec.EllipticCurvePrivateKey):
        raise WebhookCertError("the CA key is not an ECDSA key")
    dns = list(dns_names)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    key = ec.generate_private_key(ec.SECP256R1())
    extensions: list[tuple[x509.ExtensionType, bool]] = [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (x509.SubjectAlternativeName(sans), False),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), False),
    ]
    crt = issue(
        dns[0] if dns else "topolvm-webhook", ca.subject, key, signer,
        now or utc_now(), validity, extensions,
    )  # fmt: skip
    return crt, pem_key(key)


@dataclass(frozen=True)
class CertBundle:
    """What the Secret holds. ``ca_crt`` is the current CA first, then older CAs still valid
    (kept in the caBundle so replicas not yet reloaded stay trusted)."""

    tls_crt: bytes
    tls_key: bytes
    ca_crt: bytes
    ca_key: bytes

    KEYS = ("tls.crt", "tls.key", "ca.crt", "ca.key")

    def secret_data(self) -> dict[str, str]:
        values = (self.tls_crt, self.tls_key, self.ca_crt, self.ca_key)
        return {k: base64.b64encode(v).decode() for k, v in zip(self.KEYS, values, strict=True)}

    @classmethod
    def from_secret(cls, secret: api.Obj) -> CertBundle | None:
        """None when a key is missing or not base64."""
        data = secret.get("data") or {}
        try:
            values = [base64.b64decode(data[k], validate=True) for k in cls.KEYS]
        except (KeyError, TypeError, ValueError):
            return None
        return cls(*values)


def new_bundle(
    dns_names: Iterable[str], ips: Iterable[str], now: datetime.datetime,
    serving_validity: datetime.timedelta = SERVING_VALIDITY,
    ca_validity: datetime.timedelta = CA_VALIDITY,
) -> CertBundle:  # fmt: skip
    ca_crt, ca_key = new_ca(now, ca_validity)
    crt, key = new_serving_cert(ca_crt, ca_key, dns_names, ips, now, serving_validity)
    return CertBundle(crt, key, ca_crt, ca_key)


def _due(cert: x509.Certificate, now: datetime.datetime) -> bool:
    """Less than a third of the validity left (or not valid yet: a clock went backwards)."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now < start or end - now < (end - start) / 3


def _sans(cert: x509.Certificate) -> set[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(ext.get_values_for_type(x509.DNSName)) | {
        str(ip) for ip in ext.get_values_for_type(x509.IPAddress)
    }


def renewal_needed(
    bundle: CertBundle | None, dns_names: Iterable[str], ips: Iterable[str],
    now: datetime.datetime,
) -> tuple[Renewal, str]:  # fmt: skip
    """What to renew ("ca" renews both) and why."""
    if bundle is None:
        return "ca", "no certificate yet"
    try:
        ca = x509.load_pem_x509_certificates(bundle.ca_crt)[0]
        ca_key = serialization.load_pem_private_key(bundle.ca_key, password=None)
    except (ValueError, TypeError):
        return "ca", "the CA certificate or key cannot be read"
    if _spki(ca.public_key()) != _spki(ca_key.public_key()):
        return "ca", "the CA key does not match the CA certificate"
    if _due(ca, now):
        return "ca", f"the CA expires at {ca.not_valid_after_utc.isoformat()}"
    try:
        cert = x509.load_pem_x509_certificate(bundle.tls_crt)
        key = serialization.load_pem_private_key(bundle.tls_key, password=None)
    except (ValueError, TypeError):
        return "serving", "the serving certificate or key cannot be read"
    if _spki(cert.public_key()) != _spki(key.public_key()):
        return "serving", "the serving key does not match the certificate"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "serving", "the serving certificate is not signed by the current CA"
    wanted = set(dns_names) | {str(ipaddress.ip_address(ip)) for ip in ips}
    if _sans(cert) != wanted:
        return "serving", f"the certificate's names {sorted(_sans(cert))} are not {sorted(wanted)}"
    if _due(cert, now):
        return "serving", f"the certificate expires at {cert.not_valid_after_utc.isoformat()}"
    return "none", "valid"


def renew(
    bundle: CertBundle | None, what: Renewal, dns_names: Iterable[str], ips: Iterable[str],
    now: datetime.datetime, serving_validity: datetime.timedelta = SERVING_VALIDITY,
    ca_validity: datetime.timedelta = CA_VALIDITY,
) -> CertBundle:  # fmt: skip
    """``bundle`` with a new serving certificate ("serving"), or a new CA and certificate
    ("ca"; older CAs that are still valid stay in ``ca_crt`` after the new one)."""
    if what == "none" and bundle is not None:
        return bundle
    if what == "serving" and bundle is not None:
        crt, key = new_serving_cert(
            bundle.ca_crt, bundle.ca_key, dns_names, ips, now, serving_validity
        )
        return CertBundle(crt, key, bundle.ca_crt, bundle.ca_key)
    fresh = new_bundle(dns_names, ips, now, serving_validity, ca_validity)
    older: list[x509.Certificate] = []
    if bundle is not None:
        try:
            older = x509.load_pem_x509_certificates(bundle.ca_crt)
        except ValueError:
            older = []
    kept = b"".join(
        c.public_bytes(serialization.Encoding.PEM) for c in older[:2] if c.not_valid_after_utc > now
    )
    return CertBundle(fresh.tls_crt, fresh.tls_key, fresh.ca_crt + kept, fresh.ca_key)


class SelfManagedCerts:
    """The CA and serving certificate kept in a Secret and written to a caBundle."""

    def __init__(
        self, client: AsyncClient, namespace: str, secret_name: str, configuration_name: str,
        service_name: str, *, extra_dns_names: Iterable[str] = (), extra_ips: Iterable[str] = (),
        metrics: ControllerMetrics | None = None, check_interval: float = 3600.0,
        retry_interval: float = 10.0, serving_validity: datetime.timedelta = SERVING_VALIDITY,
        ca_validity: datetime.timedelta = CA_VALIDITY, clock: Clock = utc_now,
    ) -> None:  # fmt: skip
        self.client, self.namespace, self.secret_name = client, namespace, secret_name
        self.configuration_name = configuration_name
        self.dns_names = [*service_dns_names(service_name, namespace), *extra_dns_names]
        self.ips = list(extra_ips)
        self.metrics, self.clock = metrics, clock
        self.check_interval, self.retry_interval = check_interval, retry_interval
        self.serving_validity, self.ca_validity = serving_validity, ca_validity
        self.ssl_context = server_ssl_context()
        self.loaded: CertBundle | None = None
        self.ca_bundle_written = False
        self._stopping = asyncio.Event()

    async def setup(self) -> None:
        """Get (or make) the shared certificate and load it; write the caBundle if the
        configuration exists (else :meth:`run` retries). API errors propagate."""
        await self.check()

    async def check(self) -> None:
        """One round: renew in the Secret if due, load what the Secret holds, sync caBundle."""
        bundle = await self.ensure_secret()
        if self.loaded is None or bundle.tls_crt != self.loaded.tls_crt:
            load_pair(self.ssl_context, bundle.tls_crt, bundle.tls_key)
            self.loaded = bundle
            expiry = not_after(bundle.tls_crt)
            if self.metrics is not None:
                self.metrics.cert_expiry.set(expiry.timestamp())
            log.info(
                "webhook certificate loaded",
                extra={"secret": self._secret_ref(), "not_after": expiry.isoformat()},
            )
        self.ca_bundle_written = await self.write_ca_bundle(bundle.ca_crt)

    async def run(self) -> None:
        """Check periodically (sooner while the caBundle could not be written) until
        :meth:`stop`; a round in progress finishes first, so no write is cut half-way."""
        while True:
            interval = self.check_interval if self.ca_bundle_written else self.retry_interval
            if await stopped_within(self._stopping, interval):
                return
            try:
                await self.check()
            except Exception as e:
                self.ca_bundle_written = False
                log.warning(f"webhook certificate check failed, retrying: {kube.describe(e)}")

    def stop(self) -> None:
        """Make :meth:`run` return after the round in progress, if any."""
        self._stopping.set()

    def _secret_ref(self) -> str:
        return f"{self.namespace}/{self.secret_name}"

    async def ensure_secret(self) -> CertBundle:
        """The Secret's bundle, created or renewed first when needed. Replicas race safely:
        a create answered 409 or an update answered 409 re-reads and uses the winner's."""
        for _ in range(api.CONFLICT_ATTEMPTS):
            current = await api.get(self.client, Secret, self.secret_name, namespace=self.namespace)
            now = self.clock()
            bundle = None if current is None else CertBundle.from_secret(current)
            what, why = renewal_needed(bundle, self.dns_names, self.ips, now)
            if what == "none" and bundle is not None:
                return bundle
            fresh = renew(
                bundle, what, self.dns_names, self.ips, now,
                self.serving_validity, self.ca_validity,
            )  # fmt: skip
            log.info(
                "issuing webhook certificate",
                extra={"secret": self._secret_ref(), "renew": what, "reason": why},
            )
            try:
                if current is None:
                    await api.create(self.client, self._secret(fresh))
                else:
                    rv = current["metadata"]["resourceVersion"]
                    patch = {"metadata": {"resourceVersion": rv}, "data": fresh.secret_data()}
                    await api.patch_merge(
                        self.client, Secret, self.secret_name, patch, namespace=self.namespace
                    )
            except kube.Conflict:  # incl. AlreadyExists
                continue  # another replica won: use theirs
            return fresh
        raise WebhookCertError(f"Secret {self._secret_ref()} keeps changing under us")

    def _secret(self, bundle: CertBundle) -> Secret:
        meta = ObjectMeta(
            name=self.secret_name,
            namespace=self.namespace,
            labels={"app.kubernetes.io/managed-by": "topolvm-controller"},
        )
        return Secret(metadata=meta, type="kubernetes.io/tls", data=bundle.secret_data())

    async def write_ca_bundle(self, ca_crt: bytes) -> bool:
        """Put ``ca_crt`` in every webhook's caBundle; False if the configuration is missing."""
        want = base64.b64encode(ca_crt).decode()
        res, name = MutatingWebhookConfiguration, self.configuration_name
        for _ in range(api.CONFLICT_ATTEMPTS):
            current = await api.get(self.client, res, name)
            if current is None:
                log.warning(
                    "MutatingWebhookConfiguration not found; will retry writing its caBundle",
                    extra={"configuration": name, "retry_seconds": self.retry_interval},
                )
                return False
            webhooks = copy.deepcopy(current.get("webhooks") or [])
            if all((w.get("clientConfig") or {}).get("caBundle") == want for w in webhooks):
                return True
            for w in webhooks:
                w.setdefault("clientConfig", {})["caBundle"] = want
            patch = {
                "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                "webhooks": webhooks,
            }
            try:
                await api.patch_merge(self.client, res, name, patch)
            except kube.Conflict:
                continue
            log.info("caBundle written", extra={"configuration": name, "webhooks": len(webhooks)})
            return True
        raise WebhookCertError(f"MutatingWebhookConfiguration {name} keeps changing under us")

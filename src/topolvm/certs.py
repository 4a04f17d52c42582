"""X.509 helpers shared by the pod webhook's self-managed certificates and the transfer port's
self-signed one: issuing a certificate, a key as PEM. (cryptography costs a per-node daemon
memory: topolvm-node uses this only in a short-lived child process, see transfer/tls.py.)"""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

BACKDATE = datetime.timedelta(minutes=5)  # tolerate clocks a little behind ours


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def issue(
    subject: str, issuer: x509.Name | None, key: ec.EllipticCurvePrivateKey,
    signer: ec.EllipticCurvePrivateKey, now: datetime.datetime, validity: datetime.timedelta,
    extensions: list[tuple[x509.ExtensionType, bool]],
) -> bytes:  # fmt: skip
    """A PEM certificate for ``subject``'s ``key``, signed by ``signer`` (self-signed when
    ``issuer`` is None), valid from a little before ``now`` for ``validity``."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + validity)
    )
    for ext, critical in extensions:
        builder = builder.add_extension(ext, critical=critical)
    return builder.sign(signer, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

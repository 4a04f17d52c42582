"""TLS of the transfer port: TLS 1.3 only, both ways.

Each topolvm-node makes its own key and a self-signed certificate at start-up (nothing to
distribute, nothing on disk but for the moment ssl loads it) and publishes the certificate's
SHA-256 on its Node object beside its address. A receiver pins that fingerprint: it completes
the handshake, compares the certificate the sender proved it holds the key of, and sends its
token only when they match (:func:`check_peer`).
"""

from __future__ import annotations

import datetime
import hashlib
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from topolvm import certs
from topolvm.transfer.errors import PeerMismatch

VALIDITY = datetime.timedelta(days=3650)  # a new one comes with every start


def server_context(node_name: str) -> tuple[ssl.SSLContext, str]:
    """An SSL context with a fresh key and self-signed certificate for ``node_name``, and the
    certificate's fingerprint (hex SHA-256 of its DER form)."""
    key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH])
    pem = certs.issue(f"transfer.{node_name}", None, key, key, certs.utc_now(), VALIDITY,
                      [(usage, False)])  # fmt: skip
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    certs.load_pair(ctx, pem, certs.pem_key(key))
    der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    return ctx, hashlib.sha256(der).hexdigest()


def client_context() -> ssl.SSLContext:
    """No CA to check against: the sender's certificate is pinned (:func:`check_peer`)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def check_peer(sock: ssl.SSLSocket, fingerprint: str, node: str) -> None:
    der = sock.getpeercert(binary_form=True)
    got = hashlib.sha256(der).hexdigest() if der else ""
    if got != fingerprint.lower():
        raise PeerMismatch(
            f"the transfer port of node {node} presented a certificate ({got[:16] or 'none'}…) "
            f"other than the one its Node object publishes ({fingerprint[:16]}…)"
        )

"""TLS of the transfer port: TLS 1.3 only, both ways.

Each topolvm-node makes its own key and a self-signed certificate at start-up (nothing to
distribute, nothing on disk but for the moment ssl loads it) and publishes the certificate's
SHA-256 on its Node object beside its address. A receiver pins that fingerprint: it completes
the handshake, compares the certificate the sender proved it holds the key of, and sends its
token only when they match (:func:`check_peer`).
"""

from __future__ import annotations

import hashlib
import ssl
import subprocess
import sys

from topolvm.tlspair import load_pair
from topolvm.transfer.errors import PeerMismatch


def server_context(node_name: str) -> tuple[ssl.SSLContext, str]:
    """An SSL context with a fresh key and self-signed certificate for ``node_name`` (made by
    :mod:`.selfsigned` in a child process), and the certificate's fingerprint (hex SHA-256 of
    its DER form)."""
    made = subprocess.run(
        [sys.executable, "-m", "topolvm.transfer.selfsigned", node_name],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    if made.returncode != 0:
        raise RuntimeError(
            f"cannot make the transfer port's certificate: {made.stderr.decode(errors='replace')}"
        )
    key_end = made.stdout.index(b"-----END PRIVATE KEY-----") + len(b"-----END PRIVATE KEY-----\n")
    key_pem, cert_pem = made.stdout[:key_end], made.stdout[key_end:]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    load_pair(ctx, cert_pem, key_pem)
    der = ssl.PEM_cert_to_DER_cert(cert_pem.decode())
    return ctx, hashlib.sha256(der).hexdigest()


def client_context() -> ssl.SSLContext:
    """No CA to check against: the sender's certificate is pinned (:func:`check_peer`)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def check_peer(der: bytes | None, fingerprint: str, node: str) -> None:
    """The sender's certificate (DER) must be the one its Node publishes."""
    got = hashlib.sha256(der).hexdigest() if der else ""
    if got != fingerprint.lower():
        raise PeerMismatch(
            f"the transfer port of node {node} presented a certificate ({got[:16] or 'none'}…) "
            f"other than the one its Node object publishes ({fingerprint[:16]}…)"
        )

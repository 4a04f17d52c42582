"""Loading a certificate and key (PEM) into an SSL context, with the standard library only."""

from __future__ import annotations

import ssl
import tempfile
from pathlib import Path


class CertPairError(ValueError):
    """A certificate and key that do not form a usable pair."""


def load_pair(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Load a certificate chain and key into ``ctx`` (through a private temporary folder: ssl
    reads files only); a bad pair raises :class:`CertPairError` and leaves ``ctx`` untouched."""
    with tempfile.TemporaryDirectory(prefix="topolvm-tls-") as tmp:
        crt, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        crt.write_bytes(cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(key_pem)
        try:
            probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            probe.load_cert_chain(crt, key)  # try first: a failure half-loads
        except (ssl.SSLError, ValueError) as e:
            raise CertPairError(f"the certificate and key do not form a usable pair: {e}") from e
        ctx.load_cert_chain(crt, key)

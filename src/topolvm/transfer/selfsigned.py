"""``python -m topolvm.transfer.selfsigned <node>``: a fresh P-256 key and a self-signed
certificate for the node's transfer port, key then certificate as PEM on stdout. Run by
topolvm-node as a child process, so the cryptography library it needs is never resident in the
node's daemon (docs/topolvm-node.md, "Footprint")."""

from __future__ import annotations

import datetime
import sys

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from topolvm import certs

VALIDITY = datetime.timedelta(days=3650)  # a new one comes with every start


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0]:
        print("usage: python -m topolvm.transfer.selfsigned <node name>", file=sys.stderr)
        return 2
    key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH])
    pem = certs.issue(f"transfer.{argv[0]}", None, key, key, certs.utc_now(), VALIDITY,
                      [(usage, False)])  # fmt: skip
    sys.stdout.buffer.write(certs.pem_key(key) + pem)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""One error tree for the transfer boundary (httpx's ``_exceptions.py`` is the model)::

    TransferError               a copy could not go on
    ├── ProtocolError           the peer sent what the protocol forbids (malformed, out of order)
    │   └── ChecksumMismatch    a record's checksum does not match its bytes          [retried]
    ├── DigestMismatch          the whole-volume digest differs: the data is not what was sent
    ├── Refused                 the sender refused the job (``reason`` says why)
    │   └── EarlyRefusal        ... before the receiver was authenticated (its token, the
    │                           port's limits): anyone may cause one, so it is logged rarely
    ├── Unreachable             no connection, or the TLS peer is not the node it should be
    │   └── PeerMismatch        the sender's certificate is not the one its Node publishes
    ├── ConnectionLost          the connection broke or stalled mid-copy              [retried]
    ├── SourceFailed            the sender could not read its source (its FAIL record)
    ├── TargetFailed            the receiver could not write its target
    ├── NoToken                 the receiver could not obtain a token to show the sender [retried]
    └── CopyImpossible          what no retry mends (a target too small, a thin target that
                                cannot be cleared): the copy fails, and its target with it

``transient`` says whether trying again later may succeed.
"""

from __future__ import annotations


class TransferError(Exception):
    """A copy could not go on."""

    transient = True


class ProtocolError(TransferError):
    """The peer sent something the protocol forbids: the connection is dropped."""


class ChecksumMismatch(ProtocolError):
    """A record's checksum does not match its header and payload."""


class DigestMismatch(TransferError):
    """The whole-volume digest (or a checkpoint's) differs between sender and receiver."""

    transient = False


class Refused(TransferError):
    """The sender refused the job; ``reason`` is one of :data:`REFUSALS`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"refused ({reason}): {message}")
        self.reason = reason
        self.message = message
        # busy and unavailable pass; the others need something to change (a token, the job)
        self.transient = reason in ("busy", "unavailable", "unauthenticated")


class EarlyRefusal(Refused):
    """A refusal before the receiver was authenticated: its token was refused, or the port's
    limits were reached. The sender logs these once per address and reason in a while."""


REFUSALS = ("unauthenticated", "forbidden", "unknown-job", "replayed", "busy", "invalid",
            "unavailable")  # fmt: skip


class Unreachable(TransferError):
    """The sender could not be reached, or the TLS handshake failed."""


class PeerMismatch(Unreachable):
    """The sender's certificate is not the one its Node object publishes."""


class ConnectionLost(TransferError):
    """The connection broke, or no byte came for the I/O timeout."""


class SourceFailed(TransferError):
    """The sender could not read its source and said so in a FAIL record."""


class TargetFailed(TransferError):
    """The receiver could not write its target volume."""


class NoToken(TransferError):
    """The receiver could not obtain (TokenRequest) the token it shows the sender's port."""


class CopyImpossible(TransferError):
    """What no retry mends: the copy fails, and its target with it."""

    transient = False

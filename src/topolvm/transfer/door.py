"""The transfer port's door: it accepts connections and brings each, within the port's limits
(:class:`PortLimits`, docs/security.md), through the TLS handshake and the receiver's HELLO on
the event loop (:mod:`.handshake`), then hands it to the server (:mod:`.server`).

What a connection not yet authorised may take is bounded:

- one address may connect ``connects_per_peer`` times a second after a burst of
  ``connect_burst``; a connection past that is closed at accept, before any TLS (``rate``);
- at most ``pending_per_peer`` connections of one address wait for their HELLO (a new one
  pushes out that address's oldest: ``peer-limit``) and ``pending`` in all (the oldest of an
  address holding the most goes, the newcomer's own if it is one of them: ``evicted``;
  :class:`~.gate.Gate`);
- one deadline, ``deadline`` seconds from accept, for the handshake and the HELLO
  (``deadline``);
- the handshakes of all addresses together start at most ``handshakes`` a second after a
  burst of ``handshake_burst``, handed out round robin by address (:class:`~.turns.FairTurns`),
  a handshake's work beginning only once its ClientHello arrived: the loop's share spent on
  TLS is bounded however many connect, and a node with one connection waits behind one turn of
  each address, not behind their floods.

What is dropped is counted (``topolvm_transfer_connections_dropped_total{reason}``) and logged
once per address and reason in ``NOTED_SECONDS`` (:meth:`Door.note`, which the server also uses
for refusals made before a receiver is authenticated).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from topolvm.transfer import handshake, messages
from topolvm.transfer.conn import Conn
from topolvm.transfer.errors import TransferError
from topolvm.transfer.gate import Buckets, Gate, Notes
from topolvm.transfer.metrics import TransferMetrics
from topolvm.transfer.turns import FairTurns

log = logging.getLogger(__name__)
BACKLOG = 512
NOTED_SECONDS = 30.0  # what is dropped or refused early is logged once per address and reason


@dataclass(frozen=True)
class PortLimits:
    """What a connection may take before it is authorised (the module; the server adds
    ``authorising_per_peer``: HELLOs of one address being authorised at once, more refused
    ``busy``)."""

    deadline: float = 10.0  # from accept, for the TLS handshake and the HELLO together
    pending_per_peer: int = 8
    pending: int = 256
    connects_per_peer: float = 4.0  # per second, after connect_burst
    connect_burst: int = 16
    handshakes: float = 100.0  # per second, all addresses together (about 1 ms of CPU each)
    handshake_burst: int = 20
    authorising_per_peer: int = 4


Arrived = Callable[[Conn, messages.Hello, str], Awaitable[None]]
"""The server's part: a connection past its HELLO, the HELLO, the peer's address."""


class Door:
    def __init__(
        self, node: str, limits: PortLimits, metrics: TransferMetrics, arrived: Arrived,
        io_timeout: Callable[[], float],
    ) -> None:  # fmt: skip
        """``io_timeout``: that of a connection past its HELLO (for the stream's threads)."""
        self.node = node
        self.limits = limits
        self.deadline = limits.deadline
        self.metrics = metrics
        self.arrived = arrived
        self.io_timeout = io_timeout
        self._rates = Buckets(limits.connects_per_peer, limits.connect_burst)
        self._gate: Gate[asyncio.Task[None]] = Gate(limits.pending_per_peer, limits.pending)
        self._handshakes = FairTurns(rate=limits.handshakes, burst=limits.handshake_burst)
        self._notes = Notes(NOTED_SECONDS)
        self._serial = 0
        self._ssl: ssl.SSLContext | None = None
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self.handlers: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._listener is not None
        return int(self._listener.getsockname()[1])

    def open(self, host: str, port: int, ctx: ssl.SSLContext) -> None:
        self._ssl = ctx
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
        self._listener = sock
        self._accepting = asyncio.create_task(self._accept_loop(), name="transfer-accept")

    async def close(self) -> None:
        """No more connections; those of the door's (waiting, or served) are cancelled."""
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        if self._listener is not None:
            self._listener.close()
        for task in list(self.handlers):
            task.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            try:
                raw, addr = await loop.sock_accept(self._listener)
            except OSError as e:  # out of file descriptors, say: the pending ones will go
                log.warning("transfer port cannot accept", extra={"error": str(e)})
                await asyncio.sleep(0.1)
                continue
            self._admit(raw, str(addr[0]), f"{addr[0]}:{addr[1]}", loop.time())

    def _admit(self, raw: socket.socket, address: str, peer: str, accepted: float) -> None:
        if not self._rates.take(address, accepted):
            raw.close()
            self._dropped(address, "rate", f"more than {self.limits.connect_burst} connections "
                          f"at once, then {self.limits.connects_per_peer:g} a second")  # fmt: skip
            return
        self._serial += 1
        key = self._serial
        task = asyncio.create_task(self._serve(raw, address, peer, key, accepted))
        # closed however it ends: cancelled before it ran (pushed out here) included
        task.add_done_callback(lambda _: raw.close())
        self.handlers.add(task)
        task.add_done_callback(self.handlers.discard)
        evicted, why = self._gate.admit(address, key, task)
        if evicted is not None:
            evicted.cancel()
            if why == "peer-limit":
                self._dropped(address, why, f"{self._gate.per_peer} from this address wait: "
                              "its oldest is closed")  # fmt: skip
            else:
                self._dropped("", why, f"{self._gate.total} connections wait for a HELLO: the "
                              "oldest of an address holding the most is closed")  # fmt: skip
        self.metrics.pending.labels(self.node).set(len(self._gate))

    def _dropped(self, address: str, reason: str, why: str) -> None:
        """Count a connection closed before it was authorised; log it once in a while."""
        self.metrics.dropped.labels(self.node, reason).inc()
        self.note(address, reason, "transfer connection dropped before it was authorised",
                  {"error": why, "pending": len(self._gate)})  # fmt: skip

    def note(self, address: str, reason: str, what: str, ctx: dict[str, Any]) -> None:
        """Log ``what`` once per address and reason in :data:`NOTED_SECONDS`."""
        if self._notes.due((address, reason, what), time.monotonic()):
            log.warning(what, extra={"peer": address or "any", "reason": reason, **ctx,
                                     "note": f"logged once in {NOTED_SECONDS:g}s"})  # fmt: skip

    async def _serve(
        self, raw: socket.socket, address: str, peer: str, key: int, accepted: float
    ) -> None:
        try:
            conn, hello = await self._hello(raw, address, peer, accepted)
        finally:  # the socket is closed when this task ends (_admit)
            self._gate.release(address, key)
            self.metrics.pending.labels(self.node).set(len(self._gate))
        if conn is not None and hello is not None:
            await self.arrived(conn, hello, address)

    async def _hello(
        self, raw: socket.socket, address: str, peer: str, accepted: float
    ) -> tuple[Conn | None, messages.Hello | None]:
        """The TLS handshake and the HELLO, within the deadline from ``accepted``."""
        assert self._ssl is not None
        try:
            async with asyncio.timeout_at(accepted + self.deadline):
                return await handshake.accept(raw, self._ssl, peer, self.io_timeout(),
                                              lambda: self._handshakes.take(address))  # fmt: skip
        except TimeoutError:
            self._dropped(address, "deadline", f"no HELLO within {self.deadline:g}s")
        except TransferError as e:
            self._dropped(address, "handshake", str(e))
        return None, None

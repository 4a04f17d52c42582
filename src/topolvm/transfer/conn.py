"""A transfer connection: frames over a blocking TLS socket (worker threads only).

Every receive has the connection's I/O timeout: a peer that stops sending (a cut link, a
frozen node) ends the call with :class:`ConnectionLost` rather than holding the thread.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
from typing import TypeVar

from topolvm.transfer import messages, wire
from topolvm.transfer.errors import ConnectionLost, ProtocolError, Refused, SourceFailed

M = TypeVar("M", bound=messages.Message)


class Conn:
    def __init__(self, sock: ssl.SSLSocket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self._header = bytearray(wire.HEADER_SIZE)
        self.sent = 0  # bytes of frames sent, and received
        self.received = 0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def _io_error(self, e: BaseException) -> ConnectionLost:
        if isinstance(e, TimeoutError | socket.timeout):
            return ConnectionLost(f"{self.peer}: no data for {self.sock.gettimeout()}s")
        return ConnectionLost(f"{self.peer}: connection lost: {e}")

    def send(self, data: bytes | memoryview) -> None:
        try:
            self.sock.sendall(data)
        except (OSError, ssl.SSLError) as e:
            raise self._io_error(e) from e
        self.sent += len(data)

    def send_message(self, message: messages.Message) -> None:
        self.send(wire.control(messages.KIND_OF[type(message)], messages.encode(message)))

    def _recv_into(self, view: memoryview) -> None:
        done = 0
        while done < len(view):
            try:
                n = self.sock.recv_into(view[done:])
            except (OSError, ssl.SSLError) as e:
                raise self._io_error(e) from e
            if n == 0:
                raise ConnectionLost(f"{self.peer}: connection closed")
            done += n
        self.received += done

    def recv(self, payload: memoryview) -> tuple[wire.Header, memoryview]:
        """The next frame; its payload lands in ``payload`` (large enough for a DATA record)."""
        self._recv_into(memoryview(self._header))
        header = wire.Header(memoryview(self._header))
        body = payload[: header.payload_len]
        self._recv_into(body)
        header.verify(body)
        return header, body

    def recv_message(self, expected: type[M], scratch: memoryview | None = None) -> M:
        """The next frame as ``expected``; the peer's REFUSE or FAIL raises what it says."""
        header, body = self.recv(
            scratch if scratch is not None else memoryview(bytearray(wire.MAX_CONTROL))
        )
        raise_if_refused(header, body)
        return messages.decode(header.kind, body, expected)

    def readable(self) -> bool:
        """Whether a frame (or part of one) has arrived, without blocking."""
        if self.sock.pending():
            return True
        try:
            ready, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True  # the next read reports it
        return bool(ready)


def raise_if_refused(header: wire.Header, body: memoryview) -> None:
    if header.kind is wire.Kind.REFUSE:
        refusal = messages.decode(header.kind, body, messages.Refuse)
        raise Refused(refusal.reason, refusal.message)
    if header.kind is wire.Kind.FAIL:
        raise SourceFailed(messages.decode(header.kind, body, messages.Fail).message)
    if header.kind not in wire.CONTROL and header.kind not in (wire.Kind.DATA, wire.Kind.ZERO):
        raise ProtocolError(f"unexpected {header.kind.name}")

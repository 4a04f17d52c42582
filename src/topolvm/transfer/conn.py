"""A transfer connection: frames over TLS on a blocking socket (worker threads only).

TLS runs through memory BIOs (:class:`ssl.SSLObject`): the socket is read and written in large
pieces, not one system call per 16 KiB TLS record as :class:`ssl.SSLSocket` does. Measured
between two UML nodes (where a system call is dear): 147 MiB/s through SSLSocket, 266 through
memory BIOs, 322 for plain TCP (docs/mobility.md, "Performance").

Every receive has the connection's I/O timeout: a peer that stops sending (a cut link, a
frozen node) ends the call with :class:`ConnectionLost` rather than holding the thread.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from typing import TypeVar, cast

from topolvm.transfer import messages, wire
from topolvm.transfer.errors import (
    ConnectionLost,
    ProtocolError,
    Refused,
    SourceFailed,
    Unreachable,
)

M = TypeVar("M", bound=messages.Message)
RECV = 4 << 20  # bytes asked of the socket at once


class Conn:
    def __init__(
        self, sock: socket.socket, peer: str,
        tls: tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO] | None = None,
    ) -> None:  # fmt: skip
        """``tls`` (the TLS object and its two BIOs) None: plain bytes, for the host tests'
        socket pairs only."""
        self.sock = sock
        self.peer = peer
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # a frame goes out whole in one send: Nagle would hold its tail until the peer's
            # delayed ACK (a compressed record, smaller than the window, waited ~40 ms)
            with contextlib.suppress(OSError):  # an optimisation: never a reason to fail
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is None:
            self._obj: ssl.SSLObject | None = None
            self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        else:
            self._obj, self._in, self._out = tls
        self._header = bytearray(wire.HEADER_SIZE)
        self._ahead = bytearray()  # plaintext :meth:`wait` read before a receive asked
        self._inbuf = memoryview(bytearray(RECV))
        self.sent = 0  # bytes of frames sent, and received
        self.received = 0

    @classmethod
    def tls(cls, sock: socket.socket, ctx: ssl.SSLContext, peer: str, *, server: bool) -> Conn:
        """TLS over ``sock``, the handshake done (or :class:`Unreachable`)."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = ctx.wrap_bio(incoming, outgoing, server_side=server)
        conn = cls(sock, peer, (obj, incoming, outgoing))
        try:
            while True:
                try:
                    obj.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    conn._flush()
                    conn._fill()
            conn._flush()
        except (ssl.SSLError, OSError, ConnectionLost) as e:
            conn.close()
            raise Unreachable(f"{peer}: TLS handshake failed: {e}") from e
        return conn

    def peer_certificate(self) -> bytes | None:
        return None if self._obj is None else self._obj.getpeercert(binary_form=True)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def abort(self) -> None:
        """End the connection now, from another thread: a send or receive blocked on it returns
        at once (as :class:`ConnectionLost`) instead of after the socket's timeout."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def _io_error(self, e: BaseException) -> ConnectionLost:
        if isinstance(e, TimeoutError | socket.timeout):
            return ConnectionLost(f"{self.peer}: no data for {self.sock.gettimeout()}s")
        return ConnectionLost(f"{self.peer}: connection lost: {e}")

    def _flush(self) -> None:
        data = self._out.read()
        if not data:
            return
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise self._io_error(e) from e

    def _fill(self) -> None:
        # into the same buffer every time: a fresh one per read costs a page fault per 4 KiB
        # touched, dear in a VM (half the receiver's CPU in UML)
        try:
            n = self.sock.recv_into(self._inbuf)
        except OSError as e:
            raise self._io_error(e) from e
        if not n:
            raise ConnectionLost(f"{self.peer}: connection closed")
        self._in.write(self._inbuf[:n])

    def send(self, data: bytes | memoryview) -> None:
        if self._obj is None:
            self._out.write(data)
        else:
            try:
                self._obj.write(data)
            except ssl.SSLError as e:
                raise self._io_error(e) from e
        self._flush()
        self.sent += len(data)

    def send_frame(self, header: bytes, payload: memoryview) -> None:
        """A header and its payload, encrypted together and sent at once."""
        if self._obj is None:
            self._out.write(header)
            self._out.write(payload)
        else:
            try:
                self._obj.write(header)
                self._obj.write(payload)
            except ssl.SSLError as e:
                raise self._io_error(e) from e
        self._flush()
        self.sent += len(header) + len(payload)

    def send_message(self, message: messages.Message) -> None:
        self.send(wire.control(messages.KIND_OF[type(message)], messages.encode(message)))

    def _recv_into(self, view: memoryview) -> None:
        done = 0
        if self._ahead:
            done = min(len(view), len(self._ahead))
            view[:done] = self._ahead[:done]
            del self._ahead[:done]
        while done < len(view):
            if self._obj is None:
                n = self._in.read(len(view) - done)
                view[done : done + len(n)] = n
                got = len(n)
                if not got:
                    self._fill()
                done += got
                continue
            try:
                # with a buffer, read() fills it and returns a count (typeshed says bytes)
                got = cast(int, self._obj.read(len(view) - done, view[done:]))
            except ssl.SSLWantReadError:
                self._fill()
            except ssl.SSLZeroReturnError as e:
                raise ConnectionLost(f"{self.peer}: connection closed") from e
            except ssl.SSLError as e:
                raise self._io_error(e) from e
            else:
                if not got:  # the peer's close_notify: no byte will come (and no error either)
                    raise ConnectionLost(f"{self.peer}: connection closed")
                done += got
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
        space = scratch if scratch is not None else memoryview(bytearray(wire.MAX_CONTROL))
        header, body = self.recv(space)
        raise_if_refused(header, body)
        return messages.decode(header.kind, body, expected)

    def wait(self, stop: threading.Event, seconds: float, step: float = 0.5) -> None:
        """Until the next frame starts to arrive: :class:`ConnectionLost` once ``stop`` is set
        (looked at every ``step`` seconds) or after ``seconds`` without one. For the long wait
        before an ACCEPT, which a stopped copy must not sit out."""
        deadline = time.monotonic() + seconds
        while not self._ahead:
            if stop.is_set():
                raise ConnectionLost(f"{self.peer}: the copy was stopped")
            if self._obj is None:
                if self._in.pending:
                    return
            else:
                try:  # what arrived may be TLS's own (a session ticket), not a frame yet
                    got = self._obj.read(wire.HEADER_SIZE)
                    if not got:
                        raise ConnectionLost(f"{self.peer}: connection closed")
                    self._ahead += got
                    continue
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLZeroReturnError as e:
                    raise ConnectionLost(f"{self.peer}: connection closed") from e
                except ssl.SSLError as e:
                    raise self._io_error(e) from e
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConnectionLost(f"{self.peer}: no data for {seconds:g}s")
            if self._socket_ready(min(step, left)):
                self._fill()

    def _socket_ready(self, seconds: float) -> bool:
        """Whether the socket has bytes (or an end) to read within ``seconds``. poll, not
        select: select cannot watch a descriptor above 1023, which a busy node may hand out."""
        poller = select.poll()
        try:
            poller.register(self.sock, select.POLLIN)
            return bool(poller.poll(max(0, int(seconds * 1000))))
        except (OSError, ValueError):
            return True  # a closed socket: the read reports it

    def readable(self) -> bool:
        """Whether a frame (or part of one) has arrived, without blocking."""
        if self._ahead or self._in.pending or (self._obj is not None and self._obj.pending()):
            return True
        return self._socket_ready(0)


def raise_if_refused(header: wire.Header, body: memoryview) -> None:
    if header.kind is wire.Kind.REFUSE:
        refusal = messages.decode(header.kind, body, messages.Refuse)
        raise Refused(refusal.reason, refusal.message)
    if header.kind is wire.Kind.FAIL:
        raise SourceFailed(messages.decode(header.kind, body, messages.Fail).message)
    if header.kind not in wire.CONTROL and header.kind not in wire.RECORDS:
        raise ProtocolError(f"unexpected {header.kind.name}")

"""The sender's side of a connection's start, on the event loop: the TLS handshake and the
receiver's HELLO, through the same memory BIOs :class:`~.conn.Conn` then streams with.

A connection that waits costs a socket and a coroutine, no thread: peers that connect and stall
hold nothing a stream or another handshake needs. The caller bounds the whole with one deadline
that runs from accept, and says when the handshake's work may begin: its first bytes are read,
then the caller's turn is awaited (``turn``: the port's rate of handshakes, :mod:`.door`), then
the handshake is computed. A connection that says nothing takes no turn.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable

from topolvm.transfer import messages, wire
from topolvm.transfer.conn import Conn
from topolvm.transfer.errors import ConnectionLost, ProtocolError, Unreachable

READ = 64 << 10  # a ClientHello and a HELLO are a few KiB
TLS_HANDSHAKE_RECORD = b"\x16\x03"  # a record of type handshake, TLS 1.x (RFC 8446, 5.1)


class _Link:
    def __init__(self, sock: socket.socket, obj: ssl.SSLObject, incoming: ssl.MemoryBIO,
                 outgoing: ssl.MemoryBIO, peer: str) -> None:  # fmt: skip
        self.loop = asyncio.get_running_loop()
        self.sock, self.obj, self.incoming, self.outgoing = sock, obj, incoming, outgoing
        self.peer = peer

    async def flush(self) -> None:
        data = self.outgoing.read()
        if data:
            try:
                await self.loop.sock_sendall(self.sock, data)
            except OSError as e:
                raise ConnectionLost(f"{self.peer}: connection lost: {e}") from e

    async def recv(self) -> bytes:
        try:
            data = await self.loop.sock_recv(self.sock, READ)
        except OSError as e:
            raise ConnectionLost(f"{self.peer}: connection lost: {e}") from e
        if not data:
            raise ConnectionLost(f"{self.peer}: connection closed")
        return data

    async def fill(self) -> None:
        self.incoming.write(await self.recv())

    async def handshake(self, turn: Callable[[], Awaitable[None]]) -> None:
        # the ClientHello's record header first: what is not TLS goes without a turn, and what
        # is computed waits for one
        first = b""
        while len(first) < len(TLS_HANDSHAKE_RECORD):
            first += await self.recv()
        if not first.startswith(TLS_HANDSHAKE_RECORD):
            raise Unreachable(f"{self.peer}: not a TLS handshake (it begins {first[:8].hex()})")
        self.incoming.write(first)
        await turn()
        try:
            while True:
                try:
                    self.obj.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    await self.flush()
                    await self.fill()
            await self.flush()
        except ssl.SSLError as e:
            raise Unreachable(f"{self.peer}: TLS handshake failed: {e}") from e

    async def read(self, size: int) -> bytes:
        got = bytearray()
        while len(got) < size:
            try:
                more = self.obj.read(size - len(got))
            except ssl.SSLWantReadError:
                await self.flush()  # TLS 1.3 session tickets, say
                await self.fill()
            except ssl.SSLZeroReturnError as e:
                raise ConnectionLost(f"{self.peer}: connection closed") from e
            except ssl.SSLError as e:
                raise ProtocolError(f"{self.peer}: {e}") from e
            else:
                if not more:  # a close_notify reads as nothing, not as an error: never spin
                    raise ConnectionLost(f"{self.peer}: connection closed")
                got += more
        return bytes(got)


async def accept(
    sock: socket.socket, ctx: ssl.SSLContext, peer: str, io_timeout: float,
    turn: Callable[[], Awaitable[None]],
) -> tuple[Conn, messages.Hello]:  # fmt: skip
    """TLS on the accepted ``sock`` and the receiver's HELLO (a :class:`~.errors.TransferError`
    otherwise; the caller closes ``sock``), the handshake computed once ``turn`` returns. The
    connection it returns is blocking, with ``io_timeout``, for a worker thread."""
    sock.setblocking(False)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_side=True)
    link = _Link(sock, obj, incoming, outgoing, peer)
    await link.handshake(turn)
    header = wire.Header(await link.read(wire.HEADER_SIZE))  # its payload bounded (MAX_CONTROL)
    if header.kind is not wire.Kind.HELLO:
        raise ProtocolError(f"{peer}: expected HELLO, got {header.kind.name}")
    body = await link.read(header.payload_len)
    header.verify(body)
    hello = messages.decode(header.kind, body, messages.Hello)
    sock.setblocking(True)
    sock.settimeout(io_timeout)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return Conn(sock, peer, (obj, incoming, outgoing)), hello

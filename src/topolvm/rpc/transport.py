"""gRPC on asyncio without a C core (grpclib): the servers of lvmd, the CSI node and controller
and the kubelet plugin registration, and lvmd's client.

grpcio's C core keeps a thread pool and timer threads that wake every second while nothing
happens (docs/topolvm-node.md "Footprint"); grpclib serves the same wire protocol from the event
loop, with no thread of its own. Servicers stay as they are: ``async def Method(self, request,
context)`` returning the reply (or an async iterator of replies for server-streaming methods),
ending a call with ``await context.abort(code, details)``. :class:`Service` exposes such an
object under its proto service descriptor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn

from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

log = logging.getLogger(__name__)

__all__ = ["Context", "GRPCError", "Service", "Status", "UnixServer"]


class Context:
    """What a servicer sees of its call."""

    def __init__(self, stream: Stream[Any, Any]) -> None:
        self._stream = stream
        self._cancelled = False

    async def abort(self, code: Any, details: str = "") -> NoReturn:
        """End the call with ``code`` and ``details``; raises. ``code``: a grpclib ``Status``,
        or (while the product still names them so) a grpcio ``StatusCode``."""
        status = code if isinstance(code, Status) else Status(code.value[0])
        raise GRPCError(status, details)

    def cancelled(self) -> bool:
        return self._cancelled

    def deadline(self) -> float | None:
        """Seconds left before the client's deadline, None without one."""
        d = self._stream.deadline
        return None if d is None else d.time_remaining()


class Service:
    """``servicer``'s methods under ``descriptor``'s names (grpclib's ``__mapping__``). A method
    the servicer does not define is left out: grpclib answers UNIMPLEMENTED for it."""

    def __init__(self, descriptor: ServiceDescriptor, servicer: object) -> None:
        self.descriptor = descriptor
        self.servicer = servicer
        self.inflight = 0
        self.drained = asyncio.Event()
        self.drained.set()

    def __mapping__(self) -> Mapping[str, Handler]:
        mapping: dict[str, Handler] = {}
        for m in self.descriptor.methods:
            fn = getattr(self.servicer, m.name, None)
            if fn is None:
                continue
            request = message_factory.GetMessageClass(m.input_type)
            reply = message_factory.GetMessageClass(m.output_type)
            mapping[f"/{self.descriptor.full_name}/{m.name}"] = Handler(
                self._handler(m, fn), _cardinality(m), request, reply
            )
        return mapping

    def _handler(
        self, m: MethodDescriptor, fn: Callable[..., Any]
    ) -> Callable[[Stream[Any, Any]], Awaitable[None]]:
        if m.client_streaming:
            raise ValueError(f"{m.full_name}: client streaming is not served")

        async def unary(stream: Stream[Any, Any]) -> None:
            request = await stream.recv_message()
            await stream.send_message(await fn(request, Context(stream)))

        async def server_streaming(stream: Stream[Any, Any]) -> None:
            request = await stream.recv_message()
            replies: AsyncIterator[Any] = fn(request, Context(stream))
            async for reply in replies:
                await stream.send_message(reply)

        async def counted(stream: Stream[Any, Any]) -> None:
            self.inflight += 1
            self.drained.clear()
            try:
                await unary(stream)
            finally:
                self.inflight -= 1
                if not self.inflight:
                    self.drained.set()

        # a stream is not waited for at stop: lvmd's Watch never ends on its own
        return server_streaming if m.server_streaming else counted


def _cardinality(m: MethodDescriptor) -> Cardinality:
    if m.server_streaming:
        return Cardinality.UNARY_STREAM
    return Cardinality.UNARY_UNARY


class UnixServer:
    """A grpclib server on a UNIX socket; :meth:`stop` lets calls in flight finish."""

    def __init__(self, services: Sequence[Service]) -> None:
        self.services = list(services)
        self._server = Server(self.services)

    async def start(self, path: str) -> None:
        await self._server.start(path=path)

    async def stop(self, path: str, grace: float) -> None:
        """Take the socket away (no new connection), wait up to ``grace`` seconds for unary
        calls in flight, then end the rest (streams end at once)."""
        with contextlib.suppress(OSError):
            os.unlink(path)
        waits = [s.drained.wait() for s in self.services]
        if waits:
            try:
                await asyncio.wait_for(asyncio.gather(*waits), grace)
            except TimeoutError:
                log.warning("gRPC calls still running after the grace period; ending them")
        self._server.close()
        await self._server.wait_closed()

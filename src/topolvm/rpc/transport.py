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
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn

from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from grpclib.client import Channel
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.protocol import H2Protocol
from grpclib.server import Server, Stream

log = logging.getLogger(__name__)

__all__ = ["Context", "GRPCError", "Service", "Status", "UnixClient", "UnixServer"]


class Context:
    """What a servicer sees of its call: ``abort`` ends it with a status."""

    async def abort(self, code: Status, details: str = "") -> NoReturn:
        """End the call with ``code`` and ``details``; raises."""
        raise GRPCError(code, details)


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
            await stream.send_message(await fn(request, Context()))

        async def server_streaming(stream: Stream[Any, Any]) -> None:
            request = await stream.recv_message()
            replies: AsyncIterator[Any] = fn(request, Context())
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


class _Server(Server):
    """grpclib's server, remembering its connections: its ``close`` ends the calls but leaves
    the connections open (a client could still start calls on one), so :meth:`close_clients`
    closes them, as Python 3.12's ``asyncio.Server.close_clients`` would. Pinned grpclib
    (<0.5): ``_protocol_factory`` and the protocol's ``processor`` are its internals."""

    def __init__(self, handlers: Sequence[Service]) -> None:
        super().__init__(handlers)
        self._protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        self._protocols.add(protocol)
        return protocol

    def close_clients(self) -> None:
        for protocol in list(self._protocols):
            processor = getattr(protocol, "processor", None)
            if processor is not None:
                processor.close("server stopped")


class UnixServer:
    """A grpclib server on a UNIX socket; :meth:`stop` lets calls in flight finish."""

    def __init__(self, services: Sequence[Service]) -> None:
        self.services = list(services)
        self._server = _Server(self.services)

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
        self._server.close_clients()


class UnixClient:
    """Calls to a server on ``unix:<path>``. It connects on the first call and again after the
    server went away, at once (the server is local: no backoff); a failed connection is
    UNAVAILABLE, as grpcio says."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._channel = Channel(path=path)

    def _name(self, service: ServiceDescriptor, method: str) -> tuple[str, type[Message]]:
        m = service.methods_by_name[method]
        return f"/{service.full_name}/{method}", message_factory.GetMessageClass(m.output_type)

    def _unavailable(self, e: OSError) -> GRPCError:
        return GRPCError(Status.UNAVAILABLE, f"failed to connect to unix:{self.path}: {e}")

    async def unary(
        self,
        service: ServiceDescriptor,
        method: str,
        request: Message,
        timeout: float | None = None,
    ) -> Any:
        name, reply = self._name(service, method)
        try:
            async with self._channel.request(
                name, Cardinality.UNARY_UNARY, type(request), reply, timeout=timeout
            ) as call:
                await call.send_message(request, end=True)
                answer = await call.recv_message()
        except OSError as e:
            raise self._unavailable(e) from e
        if answer is None:
            raise GRPCError(Status.INTERNAL, f"{name}: no reply")
        return answer

    async def stream(
        self, service: ServiceDescriptor, method: str, request: Message
    ) -> AsyncIterator[Any]:
        name, reply = self._name(service, method)
        try:
            async with self._channel.request(
                name, Cardinality.UNARY_STREAM, type(request), reply
            ) as call:
                await call.send_message(request, end=True)
                async for answer in call:
                    yield answer
        except OSError as e:
            raise self._unavailable(e) from e

    def close(self) -> None:
        self._channel.close()

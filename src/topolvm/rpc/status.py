"""One error tree for every gRPC boundary (lvmd, CSI node, CSI controller).

Code raises a :class:`StatusError` subclass named after the gRPC code it ends the call with;
:func:`rpc` (:func:`stream_rpc` for streams) turns it into that status, logs the call with its
context and timing, and counts it
in ``grpc_server_handled_total`` / ``grpc_server_handling_seconds`` (the names of
go-grpc-prometheus, so existing dashboards work) when the servicer has ``grpc_metrics``.
Errors of other layers (LVM, mount, lvmd client) are mapped by a ``translate`` function the
service passes in; anything else is ``INTERNAL`` and logged with its traceback.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

from grpclib.const import Status
from prometheus_client import CollectorRegistry, Counter, Histogram

from topolvm.rpc.transport import Context

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class StatusError(Exception):
    """Ends an RPC with ``code`` and ``message``; subclasses fix the code."""

    code: Status = Status.INTERNAL

    def __init__(self, message: str, code: Status | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidArgument(StatusError):
    code = Status.INVALID_ARGUMENT


class NotFound(StatusError):
    code = Status.NOT_FOUND


class AlreadyExists(StatusError):
    code = Status.ALREADY_EXISTS


class ResourceExhausted(StatusError):
    code = Status.RESOURCE_EXHAUSTED


class FailedPrecondition(StatusError):
    code = Status.FAILED_PRECONDITION


class OutOfRange(StatusError):
    code = Status.OUT_OF_RANGE


class Aborted(StatusError):
    code = Status.ABORTED


class Unimplemented(StatusError):
    code = Status.UNIMPLEMENTED


class Unavailable(StatusError):
    code = Status.UNAVAILABLE


class DeadlineExceeded(StatusError):
    code = Status.DEADLINE_EXCEEDED


class Internal(StatusError):
    code = Status.INTERNAL


_BY_CODE: dict[Status, type[StatusError]] = {
    cls.code: cls
    for cls in (InvalidArgument, NotFound, AlreadyExists, ResourceExhausted, FailedPrecondition,
                OutOfRange, Aborted, Unimplemented, Unavailable, DeadlineExceeded, Internal)
}  # fmt: skip
_BY_VALUE: dict[int, Status] = {c.value: c for c in Status}


def code_from_int(value: int) -> Status:
    """The status code with number ``value`` (as stored in ``LogicalVolume.status.code``);
    unknown numbers are ``UNKNOWN``."""
    return _BY_VALUE.get(value, Status.UNKNOWN)


def from_code(code: Status | int, message: str) -> StatusError:
    """The error that ends a call with ``code`` (the subclass for it where there is one)."""
    if isinstance(code, int):
        code = code_from_int(code)
    cls = _BY_CODE.get(code)
    return cls(message) if cls is not None else StatusError(message, code)


Translate = Callable[[Exception], StatusError | None]
"""Maps an error of another layer to a status; None leaves it to the INTERNAL fallback."""

Describe = Callable[[Any], Mapping[str, Any]]
"""Log context of a request (ids, names, paths): what a reader needs to find the call."""


class GrpcMetrics:
    """Call counts and latencies of one server, in ``registry``. A servicer opts in by setting
    ``self.grpc_metrics``; :func:`rpc` records every call of its methods there."""

    def __init__(self, registry: CollectorRegistry):
        self.handled = Counter(
            "grpc_server_handled_total",
            "gRPC calls completed by the server, by service, method and status code.",
            ["grpc_service", "grpc_method", "grpc_code"],
            registry=registry,
        )
        self.handling = Histogram(
            "grpc_server_handling_seconds",
            "Time to complete a gRPC call, by service and method.",
            ["grpc_service", "grpc_method"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=registry,
        )

    def observe(self, service: str, method: str, code: Status, secs: float) -> None:
        self.handled.labels(service, method, code.name).inc()
        self.handling.labels(service, method).observe(secs)


def fields_of(request: Any, fields: Mapping[str, str]) -> dict[str, Any]:
    """``{log key: value}`` for each request field in ``fields`` (field → key) that is set."""
    out: dict[str, Any] = {}
    for field, key in fields.items():
        value = getattr(request, field, None)
        if value not in (None, "", 0):
            out[key] = value
    return out


class _Call:
    """One call of a servicer method: its log context, timing and outcome."""

    def __init__(self, servicer: Any, service: str, method: str, ctx: dict[str, Any]) -> None:
        self.servicer, self.service, self.method, self.ctx = servicer, service, method, ctx
        self.started = time.monotonic()

    def _observe(self, code: Status) -> None:
        metrics = getattr(self.servicer, "grpc_metrics", None)
        if isinstance(metrics, GrpcMetrics):
            metrics.observe(self.service, self.method, code, time.monotonic() - self.started)

    def ok(self) -> None:
        log.info("rpc ok", extra={**self.ctx, "code": "OK", "secs": _since(self.started)})
        self._observe(Status.OK)

    def cancelled(self) -> None:
        log.info("rpc cancelled", extra={**self.ctx, "secs": _since(self.started)})
        self._observe(Status.CANCELLED)

    async def fail(self, e: Exception, translate: Translate | None, context: Context) -> None:
        """End the call with the status ``e`` maps to (logged and counted); raises."""
        if isinstance(e, StatusError):
            error = e
        else:
            mapped = translate(e) if translate is not None else None
            if mapped is None:
                log.exception("rpc failed unexpectedly", extra=self.ctx)
                mapped = Internal(f"{type(e).__name__}: {e}")
            error = mapped
        level = logging.ERROR if error.code is Status.INTERNAL else logging.WARNING
        extra = {**self.ctx, "code": error.code.name, "secs": _since(self.started)}
        log.log(level, f"rpc failed: {error.message}", extra=extra)
        self._observe(error.code)
        await context.abort(error.code, error.message)
        raise AssertionError("unreachable")  # context.abort raises


def rpc(service: str, describe: Describe, translate: Translate | None = None) -> Callable[[F], F]:
    """Decorator for the unary methods of a gRPC servicer (see the module docstring)."""

    def decorate(fn: F) -> F:
        method = fn.__name__

        @functools.wraps(fn)
        async def wrapper(self: Any, request: Any, context: Context) -> Any:
            call = _Call(self, service, method, {"rpc": method, **describe(request)})
            try:
                result = await fn(self, request, context)
            except asyncio.CancelledError:
                call.cancelled()
                raise
            except Exception as e:
                await call.fail(e, translate, context)
            call.ok()
            return result

        return cast(F, wrapper)

    return decorate


S = TypeVar("S", bound=Callable[..., AsyncIterator[Any]])


def stream_rpc(service: str, translate: Translate | None = None) -> Callable[[S], S]:
    """:func:`rpc` for server-streaming methods: the stream is logged and counted once, when it
    ends (OK at its end, CANCELLED when the client goes away, else the mapped status)."""

    def decorate(fn: S) -> S:
        method = fn.__name__

        @functools.wraps(fn)
        async def wrapper(self: Any, request: Any, context: Context) -> AsyncIterator[Any]:
            call = _Call(self, service, method, {"rpc": method})
            stream = fn(self, request, context)
            try:
                async for item in stream:
                    yield item
            except (asyncio.CancelledError, GeneratorExit):
                call.cancelled()
                raise
            except Exception as e:
                await call.fail(e, translate, context)
            finally:  # the method's own clean-up runs now, not when the generator is collected
                close = getattr(stream, "aclose", None)
                if close is not None:
                    await close()
            call.ok()

        return cast(S, wrapper)

    return decorate


def unimplemented(decorate: Callable[[F], F], method: str, why: str) -> F:
    """A method that answers UNIMPLEMENTED, logged and counted under its own name ``method``
    (``decorate``: the service's :func:`rpc` decorator)."""

    async def answer(self: Any, request: Any, context: Any) -> Any:
        raise Unimplemented(why)

    answer.__name__ = answer.__qualname__ = method
    return decorate(cast(F, answer))


def _since(started: float) -> float:
    return round(time.monotonic() - started, 4)

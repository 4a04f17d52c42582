"""The standard gRPC health service (grpc.health.v1) lvmd serves: ``Check`` answers a service's
status, ``Watch`` streams it as it changes; after :meth:`enter_graceful_shutdown` every service
is NOT_SERVING and stays so."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from grpc_health.v1 import health_pb2

from topolvm.rpc.transport import Context, Service, Status

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class Health:
    def __init__(self) -> None:
        self._status: dict[str, int] = {}
        self._changed = asyncio.Condition()
        self._shutting_down = False

    def service(self) -> Service:
        return Service(health_pb2.DESCRIPTOR.services_by_name["Health"], self)

    async def set(self, name: str, status: int) -> None:
        if self._shutting_down:
            return
        async with self._changed:
            self._status[name] = status
            self._changed.notify_all()

    async def enter_graceful_shutdown(self) -> None:
        async with self._changed:
            self._shutting_down = True
            self._status = dict.fromkeys(self._status, NOT_SERVING)
            self._changed.notify_all()

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: Context
    ) -> health_pb2.HealthCheckResponse:
        status = self._status.get(request.service)
        if status is None:
            await context.abort(Status.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: Context
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last: int | None = None
        while True:
            async with self._changed:
                status = self._status.get(request.service, SERVICE_UNKNOWN)
                if status == last:
                    await self._changed.wait()
                    continue
            last = status
            yield health_pb2.HealthCheckResponse(status=status)

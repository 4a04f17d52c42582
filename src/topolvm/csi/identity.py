"""CSI Identity service (spec §6.1), shared by topolvm-node and topolvm-controller."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from grpclib.const import Status
from lightkube import AsyncClient
from lightkube.resources.storage_v1 import CSIDriver

from topolvm.constants import Names
from topolvm.k8s import api
from topolvm.proto import csi_pb2 as csi
from topolvm.rpc.transport import Context
from topolvm.version import version

log = logging.getLogger(__name__)

Check = Callable[[], Awaitable[None]]
"""A readiness check: returns when the dependency is usable, raises otherwise."""

DEFAULT_INTERVAL = 60.0
CHECK_TIMEOUT = 10.0
RETRY_FIRST, RETRY_MAX = 0.2, 2.0  # seconds between tries of a check failing transiently


class ReadinessChecker:
    """Runs ``checks`` in order at start and every ``interval`` seconds.

    ``ready`` turns true after the first fully successful round and stays true; ``error`` is the
    failure of the latest round (None when it passed).
    """

    def __init__(
        self,
        checks: Sequence[Check],
        interval: float = DEFAULT_INTERVAL,
        timeout: float = CHECK_TIMEOUT,
    ):
        self.checks = list(checks)
        self.interval = interval
        self.timeout = timeout
        self.ready = False
        self.error: Exception | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_transient = ""

    async def check_once(self) -> None:
        """One round: every check in order, each within ``timeout``. A transient API error
        (throttling, a 5xx, a reset connection) is retried within that time, so one 429 does
        not turn the plugin unhealthy until the next round; any other error fails the round at
        once."""
        try:
            for check in self.checks:
                async with asyncio.timeout(self.timeout):
                    await self._until_not_transient(check)
        except TimeoutError:
            self.error = TimeoutError(
                f"readiness check timed out after {self.timeout}s"
                + (f" (last error: {self._last_transient})" if self._last_transient else "")
            )
        except Exception as e:
            self.error = e
        else:
            if not self.ready:
                log.info("readiness checks passed")
            self.ready, self.error = True, None
            return
        log.warning(f"readiness check failed: {self.error}")

    async def _until_not_transient(self, check: Check) -> None:
        self._last_transient = ""

        def noted(text: str) -> None:
            self._last_transient = text

        await api.retry_transient(check, "readiness check", first=RETRY_FIRST, most=RETRY_MAX,
                                  on_retry=noted)  # fmt: skip

    def status(self) -> tuple[bool, str]:
        """(ready, why), as ``Probe`` answers: the latest round's error, not ready before the
        first round passed, else ready. topolvm-node's own ``/healthz`` serves it."""
        if self.error is not None:
            return False, str(self.error) or repr(self.error)
        if not self.ready:
            return False, "readiness checks have not passed yet"
        return True, "ok"

    async def _loop(self) -> None:
        while True:
            await self.check_once()
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="csi-readiness")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class IdentityService:
    grpc_metrics: object = None  # a rpc.status.GrpcMetrics to count calls in

    def __init__(
        self,
        names: Names,
        checks: Sequence[Check] = (),
        interval: float = DEFAULT_INTERVAL,
        check_timeout: float = CHECK_TIMEOUT,
    ):
        self.names = names
        self.version = version()
        self.checker = ReadinessChecker(checks, interval, check_timeout)

    async def start(self) -> None:
        """Start the readiness checker; its first round runs in the background."""
        self.checker.start()

    async def stop(self) -> None:
        await self.checker.stop()

    async def GetPluginInfo(
        self, request: csi.GetPluginInfoRequest, context: Context
    ) -> csi.GetPluginInfoResponse:
        return csi.GetPluginInfoResponse(name=self.names.plugin, vendor_version=self.version)

    async def GetPluginCapabilities(
        self,
        request: csi.GetPluginCapabilitiesRequest,
        context: Context,
    ) -> csi.GetPluginCapabilitiesResponse:
        cap = csi.PluginCapability
        return csi.GetPluginCapabilitiesResponse(
            capabilities=[
                cap(service=cap.Service(type=cap.Service.CONTROLLER_SERVICE)),
                cap(service=cap.Service(type=cap.Service.VOLUME_ACCESSIBILITY_CONSTRAINTS)),
                cap(volume_expansion=cap.VolumeExpansion(type=cap.VolumeExpansion.ONLINE)),
                cap(volume_expansion=cap.VolumeExpansion(type=cap.VolumeExpansion.OFFLINE)),
            ]
        )

    async def Probe(self, request: csi.ProbeRequest, context: Context) -> csi.ProbeResponse:
        ready, why = self.checker.status()
        if self.checker.error is not None:
            await context.abort(Status.FAILED_PRECONDITION, why)
        resp = csi.ProbeResponse()
        resp.ready.value = ready
        return resp


def csidriver_check(client: AsyncClient, names: Names) -> Check:
    """Readiness check of node and controller: the ``CSIDriver`` object can be read."""

    async def check() -> None:
        if await api.get(client, CSIDriver, names.plugin) is None:
            raise RuntimeError(f"CSIDriver {names.plugin} not found")

    return check

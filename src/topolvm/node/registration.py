"""Kubelet plugin registration, built into topolvm-node (``--register-with-kubelet``): the job of
the csi-node-driver-registrar sidecar, done by the node itself.

The kubelet watches its ``plugins_registry`` folder. For each socket that appears there it calls
the plugin registration API (k8s.io/kubelet/pkg/apis/pluginregistration/v1): ``GetInfo`` asks
what the plugin is and where its CSI socket is, and ``NotifyRegistrationStatus`` tells whether
it accepted it. As the registrar does, the node serves that API on
``<plugins_registry>/<driver>-reg.sock``, opened only once the CSI socket serves (a stale one is
replaced) and removed at a graceful stop; a rejection ends the process with status 1, so that
the kubelet restarts the container and the registration is tried again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any

from topolvm.constants import DEFAULT_REGISTRATION_DIR
from topolvm.daemon import Parts, StartupError, serve_grpc
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import pluginregistration_pb2 as reg
from topolvm.rpc import status
from topolvm.rpc.transport import Context, GRPCError, Service, UnixClient

log = logging.getLogger("topolvm.node")

CSI_PLUGIN = "CSIPlugin"  # the kubelet's type name for a CSI driver
SUPPORTED_VERSIONS = ("1.0.0",)  # as node-driver-registrar answers
SOCKET_MODE = 0o600  # the kubelet runs as root; the registrar's socket is the owner's only too


@dataclass(frozen=True)
class Registration:
    """Where to register: the kubelet's ``plugins_registry`` folder, and the CSI socket's path
    as the kubelet sees it (the endpoint it then calls)."""

    endpoint: str
    directory: str = DEFAULT_REGISTRATION_DIR

    def socket(self, driver: str) -> str:
        """The registration socket, named as node-driver-registrar names it."""
        return os.path.join(self.directory, f"{driver}-reg.sock")


class RegistrationRejected(Exception):
    """The kubelet answered the registration with ``plugin_registered: false``."""


def _describe(request: Any) -> dict[str, Any]:
    if isinstance(request, reg.RegistrationStatus):
        return {"plugin_registered": request.plugin_registered}
    return {}


_rpc = status.rpc("pluginregistration.Registration", _describe)


class RegistrationService:
    """What the kubelet's plugin watcher calls on the registration socket."""

    grpc_metrics: object = None  # a rpc.status.GrpcMetrics to count calls in

    def __init__(self, driver: str, endpoint: str, socket: str):
        self.driver, self.endpoint, self.socket = driver, endpoint, socket
        self._rejected = asyncio.Event()
        self._error = ""

    @property
    def log_context(self) -> dict[str, str]:
        return {"driver": self.driver, "endpoint": self.endpoint, "socket": self.socket}

    @_rpc
    async def GetInfo(self, request: reg.InfoRequest, context: Context) -> reg.PluginInfo:
        log.info("kubelet asked for the plugin's registration info", extra=self.log_context)
        return reg.PluginInfo(
            type=CSI_PLUGIN,
            name=self.driver,
            endpoint=self.endpoint,
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    @_rpc
    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Context
    ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("registered with the kubelet", extra=self.log_context)
        else:
            self._error = request.error or "(the kubelet gave no reason)"
            log.error(
                f"the kubelet rejected the plugin registration: {self._error}; exiting so "
                "that the container restarts and registers again",
                extra={**self.log_context, "kubelet_error": self._error},
            )
            self._rejected.set()
        return reg.RegistrationStatusResponse()

    async def until_rejected(self) -> None:
        """Return never, or raise :class:`RegistrationRejected` once the kubelet rejects the
        registration (a daemon part: it then ends the process)."""
        await self._rejected.wait()
        raise RegistrationRejected(
            f"the kubelet rejected the registration of {self.driver} "
            f"(endpoint {self.endpoint}): {self._error}"
        )


async def driver_name(csi_socket: str, timeout: float = 10.0) -> str:
    """The driver's name as the CSI socket answers it (``GetPluginInfo``), as
    node-driver-registrar asks it: so the registration socket opens only once the CSI socket
    serves, and names the driver that serves there."""
    client = UnixClient(csi_socket)
    try:
        info = await client.unary(
            csi.DESCRIPTOR.services_by_name["Identity"], "GetPluginInfo",
            csi.GetPluginInfoRequest(), timeout,
        )  # fmt: skip
    except GRPCError as e:
        raise StartupError(
            f"cannot register with the kubelet: the CSI socket {csi_socket} does not answer "
            f"GetPluginInfo: {e.status.name}: {e.message}"
        ) from e
    finally:
        client.close()
    return str(info.name)


async def serve_registration(
    parts: Parts, registration: Registration, csi_socket: str, metrics: object = None
) -> RegistrationService:
    """Serve the registration API in ``registration.directory`` until stop (the socket is
    removed then) for the driver that serves ``csi_socket`` (this process's own path of it);
    a rejection by the kubelet fails the daemon."""
    driver = await driver_name(csi_socket)
    path = registration.socket(driver)
    service = RegistrationService(driver, registration.endpoint, path)
    service.grpc_metrics = metrics
    served = [Service(reg.DESCRIPTOR.services_by_name["Registration"], service)]
    await serve_grpc(parts, path, served, mode=SOCKET_MODE, grace=5.0)
    parts.spawn(service.until_rejected(), "kubelet-registration")
    log.info(
        "serving the kubelet plugin registration",
        extra={**service.log_context, "supported_versions": list(SUPPORTED_VERSIONS)},
    )
    return service

"""The CSI gRPC server of topolvm-node: Identity and Node services on a UNIX socket."""

from __future__ import annotations

import contextlib
import logging
import os

import grpc

from topolvm.lvmd.server import prepare_socket
from topolvm.proto import csi_pb2_grpc as csi_grpc

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 30.0


async def start_csi_server(
    socket_path: str, identity: csi_grpc.IdentityServicer, node: csi_grpc.NodeServicer
) -> grpc.aio.Server:
    """Serve ``identity`` and ``node`` on ``unix:<socket_path>`` (parent directory created).

    A stale socket from an earlier run is replaced; a socket someone listens on is an error
    (:class:`topolvm.lvmd.server.StartupError`).
    """
    prepare_socket(socket_path)
    server = grpc.aio.server()
    csi_grpc.add_IdentityServicer_to_server(identity, server)
    csi_grpc.add_NodeServicer_to_server(node, server)
    server.add_insecure_port(f"unix:{socket_path}")
    await server.start()
    log.info("CSI server started", extra={"socket": socket_path})
    return server


async def stop_csi_server(
    server: grpc.aio.Server, socket_path: str, grace: float = SHUTDOWN_GRACE
) -> None:
    """Let in-flight RPCs finish (up to ``grace`` seconds), then remove the socket."""
    await server.stop(grace)
    with contextlib.suppress(OSError):
        os.unlink(socket_path)
    log.info("CSI server stopped", extra={"socket": socket_path})

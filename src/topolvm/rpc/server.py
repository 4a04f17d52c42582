"""gRPC servers on UNIX sockets (lvmd, the CSI node and controller): socket preparation,
start with a chosen file mode, graceful stop that removes the socket."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from collections.abc import Sequence
from pathlib import Path

from topolvm.rpc.transport import Service, UnixServer

log = logging.getLogger(__name__)


class SocketError(Exception):
    """The socket path cannot be used; the message says why."""


def prepare_socket(path: str) -> None:
    """Make ``path`` free to bind: create its folder, remove a stale socket, refuse anything
    else (a regular file, or a socket another process listens on)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = p.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketError(f"socket path {path} exists and is not a socket; refusing to remove it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        p.unlink(missing_ok=True)  # nobody listens: stale socket from an earlier run
        return
    finally:
        probe.close()
    raise SocketError(f"socket {path} is in use by another process (is it already running?)")


async def start_unix_server(
    path: str, services: Sequence[Service], mode: int | None = None
) -> UnixServer:
    """Serve ``services`` on ``unix:<path>``; ``mode`` (e.g. 0o600) is applied to the socket
    from its creation on (umask), not after."""
    prepare_socket(path)
    server = UnixServer(services)
    old_umask = os.umask(0o777 & ~mode) if mode is not None else None
    try:
        await server.start(path)
    finally:
        if old_umask is not None:
            os.umask(old_umask)
    if mode is not None:
        os.chmod(path, mode)
    log.info("gRPC server started", extra={"socket": path})
    return server


async def stop_unix_server(server: UnixServer, path: str, grace: float) -> None:
    """Let in-flight calls finish (up to ``grace`` seconds), then remove the socket."""
    await server.stop(path, grace)
    with contextlib.suppress(OSError):
        os.unlink(path)
    log.info("gRPC server stopped", extra={"socket": path})

"""What every daemon (lvmd, node, controller, scheduler) shares: one start-up error, the parts
it runs under supervision, the serve loop from start to graceful stop, and its listeners (gRPC
on a UNIX socket, metrics, health probes) as parts.

A daemon builds its parts in ``start()``: background tasks with :meth:`Parts.spawn` (one that
ends with an error ends the process with that error, as a crash would, so Kubernetes restarts
it instead of leaving it half-alive) and stop steps with :meth:`Parts.on_stop` (run in reverse
order at shutdown, each bounded so that one stuck part cannot keep the process alive).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from topolvm.gethttp import Answer, GetServer, Route
from topolvm.metrics import exposition
from topolvm.process import bounded, until_terminated
from topolvm.rpc.server import SocketError, start_unix_server, stop_unix_server
from topolvm.rpc.transport import Service, UnixServer

log = logging.getLogger(__name__)

Stop = Callable[[], Awaitable[None]]

STEP_TIMEOUT = 15.0  # seconds each stop step gets
TASK_STOP_TIMEOUT = 15.0  # seconds background tasks get after being cancelled


class StartupError(Exception):
    """A daemon cannot start, or a part of it failed; the message says why and what to check."""


class Parts:
    """A daemon's running parts: supervised background tasks and stop steps."""

    def __init__(self, daemon: str):
        self.daemon = daemon
        self._tasks: list[asyncio.Task[None]] = []
        self._stops: list[tuple[str, Stop, float | None]] = []
        self._failed: asyncio.Future[BaseException] | None = None

    @property
    def failed(self) -> asyncio.Future[BaseException]:
        """Resolves with the error of the first part that failed."""
        if self._failed is None:
            self._failed = asyncio.get_running_loop().create_future()
        return self._failed

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``coro`` in the background; an error (not a cancel) fails the daemon."""

        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except BaseException as e:
                log.exception(f"{self.daemon}: {name} failed")
                if not self.failed.done():
                    self.failed.set_result(e)

        task = asyncio.create_task(guarded(), name=name)
        self._tasks.append(task)
        return task

    def on_stop(self, what: str, stop: Stop, timeout: float | None = None) -> None:
        """Run ``stop`` at shutdown, before the steps added earlier, for at most ``timeout``
        seconds (None: the ``step_timeout`` of :meth:`stop`)."""
        self._stops.append((what, stop, timeout))

    async def stop(
        self, step_timeout: float = STEP_TIMEOUT, task_timeout: float = TASK_STOP_TIMEOUT
    ) -> None:
        """The stop steps (last added first, each given its timeout or ``step_timeout``
        seconds; one that fails is logged and the others still run), then cancel the tasks
        still running (given ``task_timeout`` seconds to end)."""
        steps, self._stops = self._stops, []
        for what, stop, timeout in reversed(steps):
            try:
                await bounded(what, stop(), step_timeout if timeout is None else timeout)
            except Exception:
                log.exception(f"{self.daemon}: stopping {what} failed; going on")
        tasks, self._tasks = [t for t in self._tasks if not t.done()], []
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=task_timeout)
        for task in pending:  # e.g. an LVM command that is let finish: stop waiting for it
            log.warning(
                f"{self.daemon}: task did not stop in time; cancelling again",
                extra={"task": task.get_name()},
            )
            task.cancel()


async def serve_grpc(
    parts: Parts,
    path: str,
    services: Sequence[Service],
    *,
    mode: int | None = None,
    grace: float = 10.0,
) -> UnixServer:
    """Serve ``services`` on the UNIX socket ``path`` until stop, which gives in-flight calls
    ``grace`` seconds and removes the socket."""
    try:
        server = await start_unix_server(path, services, mode=mode)
    except SocketError as e:
        raise StartupError(str(e)) from e
    # in-flight calls get their whole grace; the step's bound only catches a stop that hangs
    parts.on_stop("gRPC server", lambda: stop_unix_server(server, path, grace), grace + 5)
    return server


async def serve_get(
    parts: Parts, routes: Mapping[str, Route], address: tuple[str, int] | None, what: str
) -> None:
    """Serve ``routes`` over HTTP at ``address`` (None: not at all; ``what`` names it in
    errors) until stop."""
    if address is None:
        return
    server = GetServer(routes, what)
    try:
        await server.listen(*address)
    except OSError as e:
        raise cannot_listen(what, address, e) from e
    parts.on_stop(f"{what} server", server.close)


def cannot_listen(what: str, address: tuple[str, int], e: OSError) -> StartupError:
    """The start-up error of a listener that cannot bind ``address``."""
    return StartupError(f"cannot listen for {what} on {address[0]}:{address[1]}: {e.strerror or e}")


async def serve_metrics(
    parts: Parts, registry: CollectorRegistry, address: tuple[str, int] | None
) -> None:
    """Serve ``registry`` on ``/metrics`` at ``address`` (None: not at all) until stop."""
    await serve_get(parts, {"/metrics": lambda: exposition(registry)}, address, "metrics")


Health = Callable[[], tuple[bool, str]]
"""A health or readiness check for :func:`serve_health`: (healthy, why)."""


def alive() -> tuple[bool, str]:
    """The check of a process that answers at all: its event loop runs."""
    return True, "ok"


def _probe(check: Health) -> Route:
    """GET answers 200 with the check's reason when it passes, else 503 with it."""

    def answer() -> Answer:
        ok, why = check()
        return Answer(200 if ok else 503, why.encode())

    return answer


async def serve_health(
    parts: Parts, address: tuple[str, int] | None, checks: Mapping[str, Health]
) -> None:
    """Serve ``checks`` (path -> check, e.g. ``/healthz``, ``/readyz``) at ``address`` (None:
    not at all) until stop, for kubelet's probes."""
    routes = {path: _probe(check) for path, check in checks.items()}
    await serve_get(parts, routes, address, "health")


class Daemon(Protocol):
    parts: Parts

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def serve(daemon: Daemon) -> None:
    """Start ``daemon`` (stopping what did start if that fails), run it until SIGTERM/SIGINT
    or until one of its parts fails, then stop it; a failed part raises :class:`StartupError`
    so the process exits non-zero."""
    try:
        await daemon.start()
    except BaseException:
        await daemon.stop()
        raise
    terminated = asyncio.ensure_future(until_terminated())
    failed = daemon.parts.failed
    either: list[asyncio.Future[Any]] = [terminated, failed]
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    terminated.cancel()
    # A part that fails only while being stopped is logged; the stop was asked for, so the exit
    # status stays 0.
    error = failed.result() if failed.done() else None
    log.info(f"{daemon.parts.daemon}: shutting down")
    await daemon.stop()
    if error is not None:
        raise StartupError(f"a part of {daemon.parts.daemon} failed: {error}") from error


def run(name: str, main: Coroutine[Any, Any, None], *errors: type[Exception]) -> int:
    """``asyncio.run(main)`` for a daemon's command: exit status 1, with one log line saying
    why, on :class:`StartupError` or any of ``errors`` (the daemon's expected failures)."""
    expected: tuple[type[Exception], ...] = (StartupError, *errors)
    try:
        asyncio.run(main)
    except expected as e:
        log.error(f"{name} cannot start: {e}")
        return 1
    return 0

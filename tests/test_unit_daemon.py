"""Host unit tests of the daemon shell every component runs in (topolvm/daemon.py): a part that
fails ends the daemon with its error, stop steps run last-first and bounded, listeners that
cannot open are start-up errors."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from tests.helpers import free_port
from topolvm import daemon
from topolvm.daemon import Parts, StartupError


class Toy:
    """A daemon with one background part and a record of what ran."""

    def __init__(self, part: asyncio.Future[None] | None = None, fail_start: bool = False):
        self.parts = Parts("toy")
        self.events: list[str] = []
        self.part, self.fail_start = part, fail_start

    async def start(self) -> None:
        async def step(name: str) -> None:
            self.events.append(name)

        self.parts.on_stop("first", lambda: step("stop first"))
        if self.part is not None:
            part = self.part

            async def run() -> None:
                await part

            self.parts.spawn(run(), "worker")
        self.parts.on_stop("second", lambda: step("stop second"))
        if self.fail_start:
            raise StartupError("cannot start: port taken")

    async def stop(self) -> None:
        await self.parts.stop()
        self.events.append("stopped")


async def test_a_failing_part_ends_the_daemon_with_its_error() -> None:
    part: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    toy = Toy(part)
    served = asyncio.create_task(daemon.serve(toy))
    await asyncio.sleep(0.05)
    assert not served.done()
    part.set_exception(RuntimeError("informer exploded"))
    with pytest.raises(StartupError, match="a part of toy failed: informer exploded"):
        await asyncio.wait_for(served, 5)
    assert toy.events == ["stop second", "stop first", "stopped"]


async def test_sigterm_stops_the_daemon_cleanly() -> None:
    part: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    toy = Toy(part)
    served = asyncio.create_task(daemon.serve(toy))
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(served, 5)  # returns: exit status 0
    assert toy.events == ["stop second", "stop first", "stopped"]
    assert part.cancelled()  # the running part was cancelled at stop


async def test_a_failed_start_stops_what_did_start() -> None:
    toy = Toy(fail_start=True)
    with pytest.raises(StartupError, match="port taken"):
        await daemon.serve(toy)
    assert toy.events == ["stop second", "stop first", "stopped"]


async def test_a_stuck_stop_step_does_not_hold_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    parts = Parts("toy")
    ran: list[str] = []

    async def later() -> None:
        ran.append("later")

    async def stuck() -> None:
        await asyncio.Event().wait()

    parts.on_stop("later", later)
    parts.on_stop("stuck", stuck)
    with caplog.at_level(logging.ERROR):
        await asyncio.wait_for(parts.stop(step_timeout=0.1), 5)
    assert ran == ["later"]
    assert "shutdown: stuck did not stop within 0.1s" in caplog.text


async def test_a_taken_port_is_a_startup_error_naming_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        parts = Parts("toy")
        with pytest.raises(StartupError, match=f"cannot listen for metrics on 127.0.0.1:{port}"):
            await daemon.serve_metrics(parts, CollectorRegistry(), ("127.0.0.1", port))
        with pytest.raises(StartupError, match=f"cannot listen for health on 127.0.0.1:{port}"):
            await daemon.serve_health(parts, ("127.0.0.1", port), {"/healthz": daemon.alive})
    await parts.stop()


def test_run_turns_expected_errors_into_exit_status_1(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        raise StartupError("volume group 'vg9' not found")

    async def fine() -> None:
        return None

    with caplog.at_level(logging.ERROR):
        assert daemon.run("lvmd", broken()) == 1
    assert "lvmd cannot start: volume group 'vg9' not found" in caplog.text
    assert daemon.run("lvmd", fine()) == 0

    async def unexpected() -> None:
        raise KeyError("bug")

    with pytest.raises(KeyError):  # a bug is not an expected failure: it keeps its traceback
        daemon.run("lvmd", unexpected())


async def test_a_step_with_its_own_timeout_gets_all_of_it(caplog: pytest.LogCaptureFixture) -> None:
    """lvmd gives in-flight calls 60 s at shutdown: the gRPC stop must not be cut at the
    default bound of a step."""
    parts = Parts("toy")
    done: list[str] = []

    async def graceful() -> None:
        await asyncio.sleep(0.3)
        done.append("graceful")

    parts.on_stop("gRPC server", graceful, timeout=5)
    with caplog.at_level(logging.ERROR):
        await parts.stop(step_timeout=0.05)
    assert done == ["graceful"]
    assert "did not stop" not in caplog.text


async def test_a_failing_stop_step_is_logged_and_the_rest_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    parts = Parts("toy")
    ran: list[str] = []

    async def first() -> None:
        ran.append("first")

    async def broken() -> None:
        raise OSError("socket already gone")

    async def forever() -> None:
        await asyncio.Event().wait()

    parts.on_stop("first", first)
    parts.on_stop("broken", broken)
    task = parts.spawn(forever(), "worker")
    with caplog.at_level(logging.ERROR):
        await parts.stop()
    assert ran == ["first"] and task.cancelled()
    assert "toy: stopping broken failed; going on" in caplog.text


async def test_a_part_failing_only_while_stopped_keeps_exit_status_0() -> None:
    class Messy(Toy):
        async def start(self) -> None:
            await super().start()

            async def untidy() -> None:
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    raise RuntimeError("cleanup went wrong") from None

            self.parts.spawn(untidy(), "untidy")

    toy = Messy()
    served = asyncio.create_task(daemon.serve(toy))
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(served, 5)  # no StartupError: the stop was asked for
    assert toy.events == ["stop second", "stop first", "stopped"]


async def test_health_checks_answer_200_or_503_with_their_reason() -> None:
    """The controller's /healthz and /readyz and the node's /healthz are served this way."""
    parts, port = Parts("toy"), free_port()
    checks = {"/healthz": daemon.alive, "/readyz": lambda: (False, "caches not synced yet")}
    await daemon.serve_health(parts, ("127.0.0.1", port), checks)
    await daemon.serve_health(parts, None, {"/healthz": daemon.alive})  # off: nothing served
    try:
        async with aiohttp.ClientSession() as http:
            answers = {}
            for path in ("/healthz", "/readyz", "/metrics"):
                async with http.get(f"http://127.0.0.1:{port}{path}") as r:
                    answers[path] = (r.status, await r.text())
    finally:
        await parts.stop()
    assert answers["/healthz"] == (200, "ok")
    assert answers["/readyz"] == (503, "caches not synced yet")
    assert answers["/metrics"][0] == 404  # only the checks are served

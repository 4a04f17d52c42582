"""The test bed's agent inside a UML node: lets the host run commands and daemons in the guest,
and bridges a TCP port to the guest's CSI socket (UNIX sockets do not cross hostfs).

It listens on the guest's TAP address, inside the test's private network namespace:
    POST /exec    {"argv": [...], "timeout": s, "input": str?} -> {"rc", "stdout", "stderr"}
    POST /spawn   {"name", "argv", "env"?}   start a daemon (its output in /run/tmp/<name>.log)
    POST /signal  {"name", "signal"}         send a signal to a daemon
    GET  /daemon/<name>                      {"running", "rc", "log"} (log: last 60 lines)
    GET  /healthz
    TCP  <bridge port>                       raw bytes to and from the CSI UNIX socket
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

LOG_DIR = Path("/run/tmp")


class Agent:
    def __init__(self) -> None:
        self.daemons: dict[str, asyncio.subprocess.Process] = {}

    async def exec(self, request: web.Request) -> web.Response:
        body = await request.json()
        proc = await asyncio.create_subprocess_exec(
            *body["argv"],
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        data = body.get("input")
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(data.encode() if data else None), body.get("timeout", 120)
            )
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
            err += b"\n(agent: command timed out)"
        return web.json_response(
            {"rc": proc.returncode, "stdout": out.decode(errors="replace"),
             "stderr": err.decode(errors="replace")}
        )  # fmt: skip

    async def spawn(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = body["name"]
        old = self.daemons.get(name)
        if old is not None and old.returncode is None:
            return web.json_response({"error": f"{name} is running"}, status=409)
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        with (LOG_DIR / f"{name}.log").open("ab") as log:
            proc = await asyncio.create_subprocess_exec(
                *body["argv"],
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, **body.get("env", {})},
                start_new_session=True,
            )
        self.daemons[name] = proc
        return web.json_response({"pid": proc.pid})

    async def signal(self, request: web.Request) -> web.Response:
        body = await request.json()
        proc = self.daemons.get(body["name"])
        if proc is None:
            return web.json_response({"error": "no such daemon"}, status=404)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.Signals[body["signal"]])
        if body.get("wait"):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), body["wait"])
        return web.json_response({"running": proc.returncode is None, "rc": proc.returncode})

    async def daemon(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        proc = self.daemons.get(name)
        log = LOG_DIR / f"{name}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        lines = int(request.query.get("lines", "60"))  # 0: the whole log
        return web.json_response(
            {
                "running": proc is not None and proc.returncode is None,
                "rc": None if proc is None else proc.returncode,
                "log": "\n".join(text.splitlines()[-lines:] if lines else text.splitlines()),
            }
        )


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every failure reaches the host as JSON with the reason (a missing binary, a bad signal)."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPException:
        raise
    except Exception as exc:
        return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=500)


async def _bridge(
    socket_path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        up_reader, up_writer = await asyncio.open_unix_connection(socket_path)
    except OSError:
        writer.close()
        return

    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.close()

    await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


async def serve(listen: str, port: int, bridges: list[tuple[int, str]]) -> None:
    agent = Agent()
    app = web.Application(middlewares=[json_errors])
    app.router.add_post("/exec", agent.exec)
    app.router.add_post("/spawn", agent.spawn)
    app.router.add_post("/signal", agent.signal)
    app.router.add_get("/daemon/{name}", agent.daemon)
    app.router.add_get("/healthz", _ok)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, listen, port).start()
    servers = [
        await asyncio.start_server(functools.partial(_bridge, path), listen, bport)
        for bport, path in bridges
    ]
    print(f"agent: listening on {listen}:{port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for s in servers:
            s.close()
        await runner.cleanup()


async def _ok(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def main() -> None:
    parser = argparse.ArgumentParser(description="test bed agent inside a UML node")
    parser.add_argument("--listen", required=True)
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--bridge", action="append", default=[], help="PORT:UNIX_SOCKET_PATH")
    args = parser.parse_args()
    bridges = [(int(b.split(":", 1)[0]), b.split(":", 1)[1]) for b in args.bridge]
    asyncio.run(serve(args.listen, args.port, bridges))


if __name__ == "__main__":
    main()

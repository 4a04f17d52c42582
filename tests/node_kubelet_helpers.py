"""Helpers for tests/test_node_kubelet.py: topolvm-node's kubelet-facing listeners as a process
of their own, and the kubelet's side of them.

``python -m tests.node_kubelet_helpers CHECK_FILE topolvm-ARGS...`` parses ``topolvm-ARGS``
(``--log-format text node --nodename n ...``) with the real ``topolvm`` parser and serves what
``topolvm node`` serves to the kubelet, with ``topolvm.node.app.serve_listeners`` run by the
daemon shell as in the node: the CSI socket, ``/healthz``, ``/metrics`` and the plugin
registration socket. Only what needs the API server and lvmd is left out (the node checks its
Node object first); the one readiness check reads CHECK_FILE: empty passes, any other content
is the failure's message. The exit status is ``topolvm node``'s.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from topolvm import daemon, logs
from topolvm.cli import build_parser
from topolvm.csi.identity import IdentityService
from topolvm.daemon import Parts
from topolvm.node.app import NodeOptions, serve_listeners
from topolvm.node.cli import options_from_args
from topolvm.node.csi_node import NodeService
from topolvm.proto import pluginregistration_pb2 as reg
from topolvm.proto import pluginregistration_pb2_grpc as reg_grpc
from topolvm.rpc.status import GrpcMetrics

NO_LVMD: Any = None  # the kubelet's registration and probes never reach lvmd
NO_VOLUMES: Any = None


class Listeners:
    """topolvm-node's listeners as a daemon (``topolvm.daemon.Daemon``)."""

    def __init__(self, options: NodeOptions, check_file: Path):
        async def check() -> None:
            failure = check_file.read_text().strip()
            if failure:
                raise RuntimeError(failure)

        self.options = options
        self.parts = Parts("topolvm-node")
        self.registry = CollectorRegistry()
        self.identity = IdentityService(options.names, [check], interval=0.1)
        self.node = NodeService(options.node_name, options.names, NO_LVMD, NO_VOLUMES)
        self.node.grpc_metrics = GrpcMetrics(self.registry)

    async def start(self) -> None:
        await serve_listeners(self.parts, self.options, self.identity, self.node, self.registry)

    async def stop(self) -> None:
        await self.parts.stop()


def main(argv: list[str]) -> int:
    check_file, topolvm_args = Path(argv[0]), argv[1:]
    args = build_parser().parse_args(topolvm_args)
    logs.setup(args.log_level, args.log_format)
    listeners = Listeners(options_from_args(args), check_file)
    return daemon.run("topolvm-node", daemon.serve(listeners))


# -- the test's side --------------------------------------------------------------------------


@dataclass
class NodeProcess:
    """One helper process: its sockets, its check file, its output once it ended."""

    tmp: Path
    args: list[str]
    proc: asyncio.subprocess.Process | None = None
    output: str = ""
    check_file: Path = field(init=False)

    def __post_init__(self) -> None:
        self.check_file = self.tmp / "check"
        self.check_file.write_text("")

    async def start(self, wait_for: Path | None) -> None:
        """Start it; wait until ``wait_for`` (a socket) exists, or for nothing."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.node_kubelet_helpers", str(self.check_file),
            "--log-format", "text", "node", "--nodename", "n1", "--metrics-bind-address", "0",
            *self.args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            cwd=Path(__file__).resolve().parent.parent,
        )  # fmt: skip
        if wait_for is None:
            return
        for _ in range(600):
            if wait_for.exists() or self.proc.returncode is not None:
                break
            await asyncio.sleep(0.05)
        if not wait_for.exists():
            code = await self.wait(30)
            raise AssertionError(f"{wait_for} never appeared (exit {code}):\n{self.output}")

    async def wait(self, timeout: float = 30) -> int:
        """Its exit status, once it ended (its output is then in ``output``)."""
        assert self.proc is not None
        out, _ = await asyncio.wait_for(self.proc.communicate(), timeout)
        self.output += out.decode()
        assert self.proc.returncode is not None
        return self.proc.returncode

    async def terminate(self) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await self.wait()

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.wait()


async def kubelet_get_info(socket: Path) -> reg.PluginInfo:
    """The kubelet's plugin watcher: GetInfo on a registration socket."""
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        return await reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=10)


async def kubelet_notify(socket: Path, registered: bool, error: str = "") -> None:
    """The kubelet's verdict: NotifyRegistrationStatus on a registration socket."""
    status = reg.RegistrationStatus(plugin_registered=registered, error=error)
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        await reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(status, timeout=10)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

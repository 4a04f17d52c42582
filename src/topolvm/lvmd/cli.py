"""``topolvm lvmd`` and ``topolvm lvmd health``."""

from __future__ import annotations

import argparse
import asyncio
import logging

import msgspec

from topolvm import daemon
from topolvm.cliargs import bind_address, positive_seconds
from topolvm.config.errors import ConfigError
from topolvm.config.lvmd import LvmdConfig, load_lvmd_config
from topolvm.lvm.command import DEFAULT_PREFIX
from topolvm.lvm.errors import LvmError
from topolvm.lvmd.server import Options, health_check, serve
from topolvm.lvmd.state import DEFAULT_REFRESH_INTERVAL
from topolvm.rpc.transport import GRPCError

log = logging.getLogger("topolvm.lvmd")
DEFAULT_CONFIG = "/etc/topolvm/lvmd.yaml"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("lvmd", help="run lvmd, the gRPC service that manages LVM on this node")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="lvmd config file (YAML)")
    p.add_argument(
        "--lvm-path",
        default="",
        help="deprecated: path of the lvm binary, replaces the last element of the default "
        "command prefix; conflicts with lvm-command-prefix in the config",
    )
    p.add_argument(
        "--metrics-bind-address",
        type=bind_address,
        default=":8080",
        help="host:port serving Prometheus /metrics (process metrics); '0' or '' disables",
    )
    add_lvm_flags(p)
    p.set_defaults(run=run)
    actions = p.add_subparsers(dest="action", metavar="{health}")
    h = actions.add_parser("health", help="exit 0 if the lvmd on the configured socket is serving")
    h.add_argument("--config", default=argparse.SUPPRESS, help="lvmd config file (YAML)")
    h.set_defaults(run=run_health)


DEFAULT_COMMAND_TIMEOUT = 120.0
LVM_FLAGS = ("--refresh-interval", "--command-timeout")


def add_lvm_flags(p: argparse.ArgumentParser, embedded: bool = False) -> None:
    """How lvmd runs LVM: its flags, and topolvm-node's for the lvmd it embeds (``embedded``:
    unset unless given, so that the node can refuse them without --embed-lvmd)."""
    where = " (with --embed-lvmd)" if embedded else ""
    p.add_argument(
        "--refresh-interval",
        type=positive_seconds,
        default=None if embedded else DEFAULT_REFRESH_INTERVAL,
        help="seconds between safety-net LVM state refreshes; changes made outside lvmd are "
        f"seen from the kernel's device events at once (default 600){where}",
    )
    p.add_argument(
        "--command-timeout",
        type=positive_seconds,
        default=None if embedded else DEFAULT_COMMAND_TIMEOUT,
        help="seconds after which an LVM command is killed; one that cannot die (I/O to a "
        f"stalled disk) is left after 10 s more and its RPC fails (default 120){where}",
    )


def lvm_options(
    args: argparse.Namespace, metrics_address: tuple[str, int] | None = None
) -> Options:
    refresh, timeout = args.refresh_interval, args.command_timeout
    return Options(
        refresh_interval=DEFAULT_REFRESH_INTERVAL if refresh is None else refresh,
        command_timeout=DEFAULT_COMMAND_TIMEOUT if timeout is None else timeout,
        metrics_address=metrics_address,
    )


def load(args: argparse.Namespace) -> LvmdConfig:
    config = load_lvmd_config(args.config)
    lvm_path: str = getattr(args, "lvm_path", "")
    if lvm_path:
        if config.lvm_command_prefix is not None:
            raise ConfigError("cannot set both --lvm-path and lvm-command-prefix")
        config = msgspec.structs.replace(
            config, lvm_command_prefix=(*DEFAULT_PREFIX[:-1], lvm_path)
        )
    return config


def run(args: argparse.Namespace) -> int:
    config = load(args)
    options = lvm_options(args, args.metrics_bind_address)
    return daemon.run("lvmd", serve(config, options), LvmError)


def run_health(args: argparse.Namespace) -> int:
    config = load(args)
    try:
        status = asyncio.run(health_check(config.socket_name))
    except GRPCError as e:
        log.error(f"lvmd does not working: {e.status.name}: {e.message}")
        return 1
    if status != "SERVING":
        log.error(f"lvmd does not working: {status}")
        return 1
    print(status)
    return 0

"""The ``topolvm`` command: one binary, a subcommand per component (like upstream hypertopolvm)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from topolvm import logs
from topolvm.config.errors import ConfigError
from topolvm.controller import cli as controller_cli
from topolvm.doctor import cli as doctor_cli
from topolvm.lvmd import cli as lvmd_cli
from topolvm.node import cli as node_cli
from topolvm.ops import drain_cli, move_cli
from topolvm.scheduler import cli as scheduler_cli
from topolvm.version import version

# Upstream's image symlinks component names to one binary; accept being called that way too.
_ARGV0_COMMANDS = {
    "lvmd": "lvmd",
    "topolvm-node": "node",
    "topolvm-scheduler": "scheduler",
    "topolvm-controller": "controller",
}
# As a kubectl plugin (a link named kubectl-topolvm on PATH): `kubectl topolvm doctor ...`.
KUBECTL_PLUGIN = "kubectl-topolvm"


def build_parser(prog: str = "topolvm") -> argparse.ArgumentParser:
    """``prog``: the name the subcommands' usage shows (``kubectl topolvm`` as a plugin)."""
    parser = argparse.ArgumentParser(
        prog=prog, description="TopoLVM: node-local LVM volumes for Kubernetes"
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("TOPOLVM_LOG_LEVEL", "info"),
        choices=["debug", "info", "warning", "error"],
    )
    parser.add_argument(
        "--log-format",
        default=os.environ.get("TOPOLVM_LOG_FORMAT", "json"),
        choices=["json", "text"],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    lvmd_cli.add_parser(sub)
    scheduler_cli.add_parser(sub)
    node_cli.add_parser(sub)
    controller_cli.add_parser(sub)
    doctor_cli.add_parser(sub)
    move_cli.add_parser(sub)
    drain_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    name = os.path.basename(sys.argv[0]) if argv is None else "topolvm"
    if name in _ARGV0_COMMANDS:
        args_in.insert(0, _ARGV0_COMMANDS[name])
    parser = build_parser("kubectl topolvm" if name == KUBECTL_PLUGIN else "topolvm")
    args = parser.parse_args(args_in)
    logs.setup(args.log_level, args.log_format)
    try:
        code: int = args.run(args)
    except ConfigError as e:
        print(f"topolvm {args.command}: invalid configuration:\n{e}", file=sys.stderr)
        return 1
    return code


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())

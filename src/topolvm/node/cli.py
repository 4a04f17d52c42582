"""``topolvm node``: flags and environment as upstream's topolvm-node."""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING

from topolvm import daemon
from topolvm.cliargs import add_bool_flag, add_client_flags, bind_address, positive_seconds
from topolvm.config.errors import ConfigError
from topolvm.constants import DEFAULT_CSI_SOCKET, DEFAULT_LVMD_SOCKET, names
from topolvm.k8s.api import with_client
from topolvm.k8s.errors import KubeError
from topolvm.lvm.errors import LvmError
from topolvm.lvmd import cli as lvmd_cli
from topolvm.lvmd.server import Options

if TYPE_CHECKING:
    from topolvm.node.app import NodeOptions

log = logging.getLogger("topolvm.node")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "node", help="run topolvm-node: CSI node service, LogicalVolume reconciler, capacity"
    )
    p.add_argument(
        "--nodename",
        default=os.environ.get("NODE_NAME", ""),
        help="Kubernetes node name (default: $NODE_NAME)",
    )
    p.add_argument("--csi-socket", default=DEFAULT_CSI_SOCKET, help="UNIX socket of the CSI API")
    p.add_argument("--lvmd-socket", default=DEFAULT_LVMD_SOCKET, help="UNIX socket of lvmd")
    p.add_argument(
        "--metrics-bind-address",
        type=bind_address,
        default=":8080",
        help="host:port serving Prometheus /metrics; '0' or '' disables",
    )
    p.add_argument(
        "--embed-lvmd",
        action="store_true",
        help="run lvmd in this process (reads --config) instead of using --lvmd-socket",
    )
    p.add_argument(
        "--config",
        default=lvmd_cli.DEFAULT_CONFIG,
        help="lvmd config file, used with --embed-lvmd",
    )
    p.add_argument("--lvm-path", default="", help="deprecated: lvm binary, with --embed-lvmd")
    add_client_flags(p)
    p.add_argument(
        "--resync-interval",
        type=positive_seconds,
        default=600.0,
        help="seconds between full re-lists of LogicalVolumes (default 600)",
    )
    add_bool_flag(
        p,
        "--advertise-capacity-resource",
        True,
        "advertise the pod webhook's marker resource <plugin>/capacity on this Node, so pods "
        "carrying it schedule without the scheduler extender; =false removes it",
    )
    p.set_defaults(run=run)


def options_from_args(args: argparse.Namespace) -> NodeOptions:
    from topolvm.node.app import NodeOptions

    if not args.nodename:
        raise ConfigError("node name is not given: set --nodename or NODE_NAME")
    embed = lvmd_cli.load(args) if args.embed_lvmd else None
    if args.lvm_path and not args.embed_lvmd:
        raise ConfigError("--lvm-path only applies with --embed-lvmd")
    return NodeOptions(
        node_name=args.nodename,
        names=names(args.legacy),
        csi_socket=args.csi_socket,
        lvmd_socket=args.lvmd_socket,
        embed_lvmd=embed,
        metrics_address=args.metrics_bind_address,
        resync=args.resync_interval,
        advertise_capacity_resource=args.advertise_capacity_resource,
        lvmd_options=Options(),
    )


def run(args: argparse.Namespace) -> int:
    # Imported here so that ``topolvm --help`` and other commands do not load the node's stack.
    from topolvm.node.app import serve

    options = options_from_args(args)
    main = with_client(args.kubeconfig, lambda client: serve(client, options))
    return daemon.run("topolvm-node", main, LvmError, KubeError)

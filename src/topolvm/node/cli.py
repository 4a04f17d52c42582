"""``topolvm node``: flags and environment as upstream's topolvm-node."""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING

from topolvm import daemon
from topolvm.cliargs import add_bool_flag, add_client_flags, bind_address, positive_seconds
from topolvm.config.errors import ConfigError
from topolvm.constants import (
    DEFAULT_CSI_SOCKET,
    DEFAULT_LVMD_SOCKET,
    DEFAULT_REGISTRATION_DIR,
    names,
)
from topolvm.k8s.api import with_client
from topolvm.k8s.errors import KubeError
from topolvm.lvm.errors import LvmError
from topolvm.lvmd import cli as lvmd_cli

if TYPE_CHECKING:
    from topolvm.node.app import NodeOptions
    from topolvm.node.registration import Registration

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
        "--health-probe-bind-address",
        type=bind_address,
        default="0",
        help="host:port serving /healthz (200 when the CSI Probe says ready, else 503 with the "
        "reason), for kubelet's liveness probe; '0' or '' disables (the default)",
    )
    add_bool_flag(
        p,
        "--register-with-kubelet",
        False,
        "register the CSI driver with the kubelet by serving its plugin registration API on "
        "<--plugin-registration-path>/<driver>-reg.sock, as csi-node-driver-registrar does",
    )
    p.add_argument(
        "--plugin-registration-path",
        default=None,
        metavar="DIR",
        help="the kubelet's plugin registration folder, with --register-with-kubelet "
        f"(default {DEFAULT_REGISTRATION_DIR})",
    )
    p.add_argument(
        "--kubelet-registration-path",
        default=None,
        metavar="PATH",
        help="the CSI socket's path on the host, as the kubelet calls it, with "
        "--register-with-kubelet (default: the --csi-socket value)",
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
    lvmd_cli.add_lvm_flags(p, embedded=True)
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
    given = [f for f in lvmd_cli.LVM_FLAGS if getattr(args, f[2:].replace("-", "_")) is not None]
    if given and not args.embed_lvmd:
        raise ConfigError(f"{', '.join(given)} only applies with --embed-lvmd")
    return NodeOptions(
        node_name=args.nodename,
        names=names(args.legacy),
        csi_socket=args.csi_socket,
        lvmd_socket=args.lvmd_socket,
        embed_lvmd=embed,
        metrics_address=args.metrics_bind_address,
        health_address=args.health_probe_bind_address,
        registration=registration_from_args(args),
        resync=args.resync_interval,
        advertise_capacity_resource=args.advertise_capacity_resource,
        lvmd_options=lvmd_cli.lvm_options(args),
    )


def registration_from_args(args: argparse.Namespace) -> Registration | None:
    """The built-in kubelet registration the flags ask for (None: the registrar sidecar's job)."""
    from topolvm.node.registration import Registration

    given = {
        "--plugin-registration-path": args.plugin_registration_path,
        "--kubelet-registration-path": args.kubelet_registration_path,
    }
    if not args.register_with_kubelet:
        for flag, value in given.items():
            if value is not None:
                raise ConfigError(f"{flag} only applies with --register-with-kubelet")
        return None
    directory, endpoint = given.values()
    registration = Registration(
        endpoint=args.csi_socket if endpoint is None else endpoint,
        directory=DEFAULT_REGISTRATION_DIR if directory is None else directory,
    )
    for flag, value in (
        ("--plugin-registration-path", registration.directory),
        ("--kubelet-registration-path (default: --csi-socket)", registration.endpoint),
    ):
        if not os.path.isabs(value):
            raise ConfigError(f"{flag} must be an absolute path, got {value!r}")
    return registration


def run(args: argparse.Namespace) -> int:
    # Imported here so that ``topolvm --help`` and other commands do not load the node's stack.
    from topolvm.node.app import serve

    options = options_from_args(args)
    main = with_client(args.kubeconfig, lambda client: serve(client, options))
    return daemon.run("topolvm-node", main, LvmError, KubeError)

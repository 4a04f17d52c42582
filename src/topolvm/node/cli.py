"""``topolvm node``: flags and environment as upstream's topolvm-node."""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from topolvm import daemon
from topolvm.cliargs import (
    add_bool_flag,
    add_client_flags,
    bind_address,
    byte_rate,
    positive_seconds,
)
from topolvm.config.errors import ConfigError
from topolvm.constants import (
    DEFAULT_CSI_SOCKET,
    DEFAULT_LVMD_SOCKET,
    DEFAULT_REGISTRATION_DIR,
    DEFAULT_TRANSFER_PORT,
    names,
)
from topolvm.k8s.api import with_client
from topolvm.k8s.errors import KubeError
from topolvm.lvm.errors import LvmError
from topolvm.lvmd import cli as lvmd_cli

if TYPE_CHECKING:
    from topolvm.node.app import NodeOptions, TransferOptions
    from topolvm.node.registration import Registration
    from topolvm.transfer.tokens import Bearer

log = logging.getLogger("topolvm.node")
IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
AUTO_STREAMS = 4  # --transfer-streams 0: one stream per CPU, at most this many


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
    p.add_argument(
        "--lv-accounting-interval",
        type=positive_seconds,
        default=60.0,
        help="seconds between looks for LVs no LogicalVolume accounts for; one is reported "
        "after two looks in a row (default 60)",
    )
    p.add_argument(
        "--cgroup-root",
        default="/sys/fs/cgroup",
        metavar="PATH",
        help="where the node's cgroup v2 hierarchy is visible to this process: IO limits "
        "(docs/qos.md) are written into pods' io.max below it (default /sys/fs/cgroup; the "
        "chart mounts the host's at /host/sys/fs/cgroup); empty: IO limits are off on this node",
    )
    add_bool_flag(
        p,
        "--advertise-capacity-resource",
        True,
        "advertise the pod webhook's marker resource <plugin>/capacity on this Node, so pods "
        "carrying it schedule without the scheduler extender; =false removes it",
    )
    add_transfer_flags(p)
    p.set_defaults(run=run)


def add_transfer_flags(p: argparse.ArgumentParser) -> None:
    """The node-to-node copy (docs/mobility.md)."""
    g = p.add_argument_group("node-to-node copy")
    g.add_argument(
        "--transfer-bind-address",
        type=bind_address,
        default=f":{DEFAULT_TRANSFER_PORT}",
        help="host:port of the TLS transfer port other nodes copy volumes from; '0' or '' "
        f"disables it (default :{DEFAULT_TRANSFER_PORT})",
    )
    g.add_argument(
        "--transfer-advertise-address",
        default=os.environ.get("POD_IP", ""),
        metavar="IP",
        help="the address other nodes reach the transfer port at, published on this Node "
        "(default: $POD_IP); without one the port is not served",
    )
    g.add_argument(
        "--transfer-service-account",
        metavar="NAMESPACE:SERVICEACCOUNT",
        help="the ServiceAccount whose tokens this node shows another node's transfer port, "
        "one per source node, made with TokenRequest and bound to this pod (outside a pod: to "
        "this Node); default: this pod's own, else the first --transfer-peer",
    )
    g.add_argument(
        "--transfer-token-expiration",
        type=int,
        default=600,
        metavar="SECONDS",
        help="the lifetime asked for those tokens (600 or more; default 600); a new one is "
        "obtained when four fifths of it are gone",
    )
    g.add_argument(
        "--transfer-token-file",
        metavar="PATH",
        help="deprecated and ignored: the projected token of the audience topolvm-transfer "
        "that all nodes shared, which this release's ports refuse",
    )
    g.add_argument(
        "--transfer-peer",
        action="append",
        default=[],
        metavar="NAMESPACE:SERVICEACCOUNT",
        help="a ServiceAccount whose tokens may copy from this node (repeatable; default: "
        "this process's own in-cluster ServiceAccount)",
    )
    g.add_argument(
        "--transfer-max-copies",
        type=int,
        default=2,
        metavar="N",
        help="copies this node sends, and receives, at once (default 2); more wait their turn",
    )
    g.add_argument(
        "--transfer-bandwidth",
        type=byte_rate,
        default=0,
        metavar="BYTES",
        help="bytes per second each copy may move (a quantity: 100Mi); 0: no limit (default)",
    )
    g.add_argument(
        "--transfer-compression",
        choices=("none", "zstd"),
        default="none",
        help="zstd: compress what this node sends (a fast level; a link slower than the disks "
        "gains, data that does not compress is soon sent as it is); none (default)",
    )
    g.add_argument(
        "--transfer-streams",
        type=int,
        default=0,
        metavar="N",
        help="connections one copy this node receives may use, each for a part of a volume of "
        "64 MiB or more per part (1 to 16); 0: one per CPU of this node, at most 4 (default)",
    )
    g.add_argument(
        "--transfer-io-timeout",
        type=positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="a connection that moves no byte for this long is given up and resumed (default 30)",
    )


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
        lv_accounting_interval=args.lv_accounting_interval,
        cgroup_root=args.cgroup_root,
        advertise_capacity_resource=args.advertise_capacity_resource,
        lvmd_options=lvmd_cli.lvm_options(args),
        transfer=transfer_from_args(args),
    )


def transfer_from_args(args: argparse.Namespace) -> TransferOptions:
    from topolvm.node.app import TransferOptions
    from topolvm.transfer import plan
    from topolvm.transfer.auth import service_account_user
    from topolvm.transfer.jobs import Limits

    if args.transfer_max_copies < 1:
        raise ConfigError(
            f"--transfer-max-copies must be 1 or more, got {args.transfer_max_copies}"
        )
    peers = []
    for peer in args.transfer_peer or [own_service_account()]:
        if peer is None:
            continue
        namespace, sep, name = peer.partition(":")
        if not sep or not namespace or not name or ":" in name:
            raise ConfigError(f"--transfer-peer takes NAMESPACE:SERVICEACCOUNT, got {peer!r}")
        peers.append(service_account_user(namespace, name))
    if args.transfer_token_expiration < 600:
        raise ConfigError(
            f"--transfer-token-expiration must be 600 or more (the API server's least), got "
            f"{args.transfer_token_expiration}"
        )
    if not 0 <= args.transfer_streams <= plan.MAX_PARTS:
        raise ConfigError(
            f"--transfer-streams takes 0 to {plan.MAX_PARTS}, got {args.transfer_streams}"
        )
    streams = args.transfer_streams or min(os.cpu_count() or 1, AUTO_STREAMS)
    limits = Limits(args.transfer_max_copies, args.transfer_bandwidth, args.transfer_io_timeout,
                    compress=args.transfer_compression == "zstd", streams=streams)  # fmt: skip
    return TransferOptions(address=args.transfer_bind_address,
                           advertise=args.transfer_advertise_address,
                           legacy_token_file=args.transfer_token_file or "", peers=tuple(peers),
                           bearer=bearer(args, peers), token_seconds=args.transfer_token_expiration,
                           limits=limits)  # fmt: skip


def bearer(args: argparse.Namespace, peers: list[str]) -> Bearer | None:
    """Whose tokens this node shows a source's transfer port, and what they are bound to: its
    own pod when it runs as the account's pod, else its Node (None: no account is known)."""
    from topolvm.transfer.tokens import Bearer

    prefix = "system:serviceaccount:"
    own = own_identity()
    chosen = args.transfer_service_account or (own[0] if own else None)
    if chosen is None and peers:
        chosen = peers[0][len(prefix) :]
    if chosen is None:
        return None
    namespace, sep, name = chosen.partition(":")
    if not sep or not namespace or not name or ":" in name:
        raise ConfigError(
            f"--transfer-service-account takes NAMESPACE:SERVICEACCOUNT, got {chosen!r}"
        )
    if own is not None and own[0] == chosen and own[1]:
        return Bearer(namespace, name, "Pod", own[1], own[2])
    return Bearer(namespace, name, "Node", args.nodename)


def own_service_account(path: str | None = None) -> str | None:
    """``namespace:name`` of the ServiceAccount this pod runs as (from its token's subject);
    None outside a pod."""
    own = own_identity(path)
    return None if own is None else own[0]


def own_identity(path: str | None = None) -> tuple[str, str, str] | None:
    """``namespace:name`` of the ServiceAccount this pod runs as, and the name and UID of the
    pod its token is bound to ("" if it is not), from its token's claims (``path``, default
    the in-cluster token); None outside a pod."""
    try:
        payload = Path(path or IN_CLUSTER_TOKEN).read_text().split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        subject = str(claims["sub"])
        pod = (claims.get("kubernetes.io") or {}).get("pod") or {}
        pod_name, pod_uid = str(pod.get("name") or ""), str(pod.get("uid") or "")
    except (OSError, IndexError, KeyError, ValueError, TypeError, AttributeError):
        return None
    prefix = "system:serviceaccount:"
    if not subject.startswith(prefix):
        return None
    return subject[len(prefix) :], pod_name, pod_uid


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

"""``topolvm controller``: flags and environment as upstream's topolvm-controller (spec §1.8)."""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING

from topolvm import daemon
from topolvm.cliargs import add_bool_flag, add_client_flags, bind_address, go_duration
from topolvm.config.errors import ConfigError
from topolvm.constants import DEFAULT_CSI_SOCKET, names
from topolvm.k8s.api import with_client
from topolvm.k8s.errors import KubeError
from topolvm.k8s.lvobject import InvalidQuantity, parse_quantity

if TYPE_CHECKING:
    from topolvm.controller.options import ControllerOptions

log = logging.getLogger("topolvm.controller")

SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
GC_MODES = ("off", "dry-run", "delete")


def _quantity(value: str) -> int:
    try:
        size = parse_quantity(value)
    except InvalidQuantity as e:
        raise argparse.ArgumentTypeError(f"{e} (examples: 8Mi, 300Mi, 1Gi)") from None
    if size < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value!r}")
    return size


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "controller",
        help="run topolvm-controller: CSI controller service, pod webhook, cleanup controllers",
    )
    p.add_argument("--csi-socket", default=DEFAULT_CSI_SOCKET, help="UNIX socket of the CSI API")
    p.add_argument("--metrics-bind-address", type=bind_address, default=":8080",
                   help="host:port serving Prometheus /metrics; '0' disables")  # fmt: skip
    add_bool_flag(p, "--secure-metrics-server", False, "serve metrics over HTTPS (unsupported)")
    p.add_argument("--health-probe-bind-address", type=bind_address, default=":8081",
                   help="host:port serving /healthz and /readyz; '0' disables")  # fmt: skip
    p.add_argument("--webhook-addr", type=bind_address, default=":9443",
                   help="host:port of the HTTPS pod webhook")  # fmt: skip
    add_bool_flag(p, "--enable-webhooks", True, "serve the pod mutating webhook")
    p.add_argument("--cert-dir", default="",
                   help="folder with tls.crt/tls.key (cert-manager); empty: the controller "
                   "makes and renews its own certificates (see --webhook-secret-name)")  # fmt: skip
    add_bool_flag(
        p,
        "--pod-webhook-marker",
        False,
        "also add the topolvm.io/capacity marker resource (upstream's extender mode)",
    )
    p.add_argument("--webhook-secret-name", default="topolvm-webhook-cert",
                   help="Secret holding self-managed webhook certificates")  # fmt: skip
    p.add_argument("--webhook-configuration-name", default="topolvm-hook",
                   help="MutatingWebhookConfiguration whose caBundle is kept current")  # fmt: skip
    p.add_argument(
        "--webhook-service-name",
        default="topolvm-controller",
        help="Service in front of the webhook (names in the serving certificate)",
    )
    add_bool_flag(p, "--leader-election", True, "elect a leader for the controllers")
    p.add_argument("--leader-election-id", default="topolvm", help="name of the Lease")
    p.add_argument("--leader-election-namespace", default="",
                   help="namespace of the Lease (default: the pod's namespace)")  # fmt: skip
    p.add_argument("--leader-election-lease-duration", type=go_duration, default=15.0)
    p.add_argument("--leader-election-renew-deadline", type=go_duration, default=10.0)
    p.add_argument("--leader-election-retry-period", type=go_duration, default=2.0)
    add_bool_flag(
        p,
        "--skip-node-finalize",
        False,
        "on Node deletion only remove the finalizer; leave PVCs and volumes alone",
    )
    p.add_argument("--profiling-bind-address", default="", help="accepted for compatibility")
    for kind, default in (("block", "8Mi"), ("ext4", "32Mi"), ("xfs", "300Mi"),
                          ("btrfs", "200Mi")):  # fmt: skip
        p.add_argument(f"--minimum-allocation-{kind}", type=_quantity, default=default,
                       help=f"smallest {kind} volume (default {default})")  # fmt: skip
    p.add_argument("--lv-gc", choices=GC_MODES, default="off",
                   help="garbage collector for LogicalVolumes no PersistentVolume references: "
                   "off (default), dry-run (log and count only) or delete")  # fmt: skip
    p.add_argument("--lv-gc-grace", type=go_duration, default=3600.0,
                   help="age an unreferenced LogicalVolume must reach (default 1h)")  # fmt: skip
    p.add_argument("--lv-gc-interval", type=go_duration, default=600.0,
                   help="time between garbage-collector scans (default 10m)")  # fmt: skip
    add_client_flags(p)
    p.set_defaults(run=run)


def pod_namespace() -> str:
    """The namespace this pod runs in: $POD_NAMESPACE, then the service account's."""
    ns = os.environ.get("POD_NAMESPACE", "")
    if not ns:
        try:
            with open(SA_NAMESPACE) as f:
                ns = f.read().strip()
        except OSError:
            ns = ""
    return ns


def options_from_args(args: argparse.Namespace) -> ControllerOptions:
    from topolvm.controller.options import ControllerOptions, LeaderOptions
    from topolvm.controller.sizing import MinimumAllocations

    if args.secure_metrics_server:
        raise ConfigError("--secure-metrics-server is not supported; put metrics behind a proxy")
    namespace = pod_namespace()
    leader = None
    if args.leader_election:
        lease_ns = args.leader_election_namespace or namespace
        if not lease_ns:
            raise ConfigError(
                "leader election needs a namespace: set --leader-election-namespace or "
                "POD_NAMESPACE, or pass --leader-election=false"
            )
        if not (args.leader_election_lease_duration > args.leader_election_renew_deadline
                > args.leader_election_retry_period):  # fmt: skip
            raise ConfigError("need lease duration > renew deadline > retry period")
        leader = LeaderOptions(
            name=args.leader_election_id,
            namespace=lease_ns,
            lease_duration=args.leader_election_lease_duration,
            renew_deadline=args.leader_election_renew_deadline,
            retry_period=args.leader_election_retry_period,
        )
    if args.enable_webhooks and args.webhook_addr is None:
        raise ConfigError("--webhook-addr is required with --enable-webhooks")
    if args.enable_webhooks and not args.cert_dir and not namespace:
        raise ConfigError(
            "self-managed webhook certificates need the pod namespace (POD_NAMESPACE); "
            "or give --cert-dir, or pass --enable-webhooks=false"
        )
    return ControllerOptions(
        names=names(args.legacy),
        csi_socket=args.csi_socket,
        namespace=namespace,
        metrics_address=args.metrics_bind_address,
        health_address=args.health_probe_bind_address,
        webhook_address=args.webhook_addr if args.enable_webhooks else None,
        cert_dir=args.cert_dir,
        pod_webhook_marker=args.pod_webhook_marker,
        webhook_secret_name=args.webhook_secret_name,
        webhook_configuration_name=args.webhook_configuration_name,
        webhook_service_name=args.webhook_service_name,
        leader=leader,
        skip_node_finalize=args.skip_node_finalize,
        minimums=MinimumAllocations(
            block=args.minimum_allocation_block,
            ext4=args.minimum_allocation_ext4,
            xfs=args.minimum_allocation_xfs,
            btrfs=args.minimum_allocation_btrfs,
        ),
        lv_gc=args.lv_gc,
        lv_gc_grace=args.lv_gc_grace,
        lv_gc_interval=args.lv_gc_interval,
    )


def run(args: argparse.Namespace) -> int:
    from topolvm.controller.app import serve

    options = options_from_args(args)
    main = with_client(args.kubeconfig, lambda client: serve(client, options))
    return daemon.run("topolvm-controller", main, KubeError)

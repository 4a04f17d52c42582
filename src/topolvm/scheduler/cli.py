"""``topolvm scheduler`` and ``topolvm scheduler print-config``."""

from __future__ import annotations

import argparse
import logging

import msgspec

from topolvm import daemon
from topolvm.cliargs import parse_listen
from topolvm.config.errors import ConfigError
from topolvm.config.scheduler import SchedulerConfig, load_scheduler_config
from topolvm.constants import names
from topolvm.k8s.errors import KubeError
from topolvm.scheduler import schedulerconfig

log = logging.getLogger("topolvm.scheduler")


def positive_int(value: str) -> int:
    if not value.isdigit() or int(value) <= 0:
        raise argparse.ArgumentTypeError(f"must be an integer > 0, got {value!r}")
    return int(value)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "scheduler", help="run topolvm-scheduler, the kube-scheduler extender (capacity filter)"
    )
    p.add_argument("--config", default="", help="scheduler config file (YAML); default: none")
    p.add_argument(
        "--node-cache",
        action="store_true",
        help="nodeCacheCapable mode: accept requests with node names only (needs a Node watch)",
    )
    p.add_argument(
        "--managed-resource",
        action="store_true",
        help="upstream's marker-resource mode (kube-scheduler sends only pods requesting "
        "<plugin>/capacity); reports on /status whether kube-scheduler calls",
    )
    p.add_argument("--listen", default=None, help="[host]:port, overrides 'listen' in the config")
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig for the --node-cache Node watch (default: in-cluster, then $KUBECONFIG)",
    )
    p.set_defaults(run=run)
    actions = p.add_subparsers(dest="action", metavar="{print-config}")
    pc = actions.add_parser(
        "print-config",
        help="print the KubeSchedulerConfiguration that wires kube-scheduler to this extender",
    )
    pc.add_argument(
        "--url",
        default=schedulerconfig.DEFAULT_URL,
        help="urlPrefix kube-scheduler uses to reach the extender "
        f"(default {schedulerconfig.DEFAULT_URL})",
    )
    pc.add_argument("--node-cache", action="store_true", help="nodeCacheCapable: true")
    pc.add_argument(
        "--managed-resource",
        action="store_true",
        help="add upstream's managedResources (<plugin>/capacity, ignoredByScheduler)",
    )
    pc.add_argument("--weight", type=positive_int, default=1, help="extender weight (default 1)")
    pc.add_argument(
        "--kubeconfig",
        default=schedulerconfig.DEFAULT_KUBECONFIG,
        help=f"clientConnection.kubeconfig (default {schedulerconfig.DEFAULT_KUBECONFIG})",
    )
    pc.add_argument(
        "--extender-only",
        action="store_true",
        help="print only the entry for an existing 'extenders:' list",
    )
    pc.set_defaults(run=run_print_config)


def load(args: argparse.Namespace) -> SchedulerConfig:
    config = load_scheduler_config(args.config)
    update: dict[str, object] = {}
    if args.node_cache:
        update["node_cache"] = True
    if args.managed_resource:
        update["managed_resource"] = True
    if args.listen is not None:
        try:
            parse_listen(args.listen)
        except ValueError as e:
            raise ConfigError(f"--listen: {e}") from None
        update["listen"] = args.listen
    return msgspec.structs.replace(config, **update) if update else config


def run(args: argparse.Namespace) -> int:
    config = load(args)
    if config.profiling_bind_address:
        log.warning("profiling-bind-address is not supported (it serves Go's pprof); ignored")
    # Imported here: the server's aiohttp costs about 15 MB, which the per-node daemons (the
    # same program) should not pay (tests/test_unit_footprint.py).
    from topolvm.scheduler import server

    return daemon.run("topolvm-scheduler", server.run(config, args.kubeconfig), KubeError)


def run_print_config(args: argparse.Namespace) -> int:
    if args.extender_only:
        text = schedulerconfig.extender_stanza(
            args.url,
            node_cache=args.node_cache,
            managed_resource=args.managed_resource,
            weight=args.weight,
            plugin_names=names(),
        )
    else:
        text = schedulerconfig.scheduler_configuration(
            args.url,
            node_cache=args.node_cache,
            managed_resource=args.managed_resource,
            weight=args.weight,
            kubeconfig=args.kubeconfig,
            plugin_names=names(),
        )
    print(text, end="")
    return 0

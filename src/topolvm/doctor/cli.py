"""``topolvm doctor`` (also ``kubectl topolvm doctor``): read the cluster with the user's
kubeconfig, read-only, and report what is wrong, why, and how to fix it.

Exit codes: 0 healthy, 1 findings, 2 could not check (unreachable API server, bad kubeconfig,
a pod, PVC or namespace not found, or no check could read what it needs). Checks that
could not read part of it are listed under "could not check" without changing the code."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
import time

from topolvm.cliargs import go_duration
from topolvm.doctor.collect import DoctorError, collect
from topolvm.doctor.render import as_json, as_text
from topolvm.doctor.run import Report, diagnose
from topolvm.doctor.scope import Scope, ScopeError
from topolvm.doctor.snapshot import Settings
from topolvm.k8s.api import make_client
from topolvm.k8s.errors import KubeError

CANNOT_CHECK = 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "doctor",
        help="say why a pod or volume is stuck, and how to fix it (reads the cluster only)",
        description="Reads the cluster with your kubeconfig (list and get only) and reports "
        "findings: what is wrong, the evidence, the cause and the fix. Exit code 0: healthy, "
        "1: findings, 2: could not check.",
    )
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, "
                   "~/.kube/config, then the in-cluster account)")  # fmt: skip
    p.add_argument("--context", default=None, help="the kubeconfig context to use (default: "
                   "its current context)")  # fmt: skip
    p.add_argument("-n", "--namespace", default="", help="only this namespace (and what its "
                   "pods and PVCs depend on); with --pod/--pvc: their namespace")  # fmt: skip
    what = p.add_mutually_exclusive_group()
    what.add_argument("--pod", default="", help="only this pod and what it depends on")
    what.add_argument("--pvc", default="", help="only this PVC and what it depends on")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p.add_argument("--stale-after", type=go_duration, default=600.0, metavar="DURATION",
                   help="a CSIStorageCapacity that disagrees with its node for longer is stale "
                   "(default 10m)")  # fmt: skip
    p.add_argument("--stuck-after", type=go_duration, default=300.0, metavar="DURATION",
                   help="a LogicalVolume deleted longer ago is stuck (default 5m)")  # fmt: skip
    p.add_argument(
        "--thin-data-percent",
        type=float,
        default=80.0,
        metavar="PERCENT",
        help="report thin pools whose data usage is at least this (default 80)",
    )
    p.add_argument(
        "--thin-metadata-percent",
        type=float,
        default=80.0,
        metavar="PERCENT",
        help="report thin pools whose metadata usage is at least this (default 80)",
    )
    p.set_defaults(run=run)


def default_kubeconfig() -> str | None:
    """kubectl's order: $KUBECONFIG (its first file), ~/.kube/config; None: in-cluster."""
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"].split(os.pathsep)[0]
    home = os.path.expanduser("~/.kube/config")
    return home if os.path.exists(home) else None


def run(args: argparse.Namespace) -> int:
    settings = Settings(
        stale_after=datetime.timedelta(seconds=args.stale_after),
        stuck_after=datetime.timedelta(seconds=args.stuck_after),
        thin_data_percent=args.thin_data_percent,
        thin_metadata_percent=args.thin_metadata_percent,
    )
    try:
        kubeconfig = args.kubeconfig or default_kubeconfig()
        report, seconds = asyncio.run(
            examine(kubeconfig, args.namespace, args.pod, args.pvc, settings, args.context)
        )
    except (KubeError, DoctorError, ScopeError) as e:
        print(f"topolvm doctor: could not check: {e}", file=sys.stderr)
        return CANNOT_CHECK
    if args.output == "json":
        print(as_json(report, seconds))
    else:
        colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        sys.stdout.write(as_text(report, seconds, colour))
    return report.exit_code


async def examine(
    kubeconfig: str | None,
    namespace: str,
    pod: str,
    pvc: str,
    settings: Settings,
    context: str | None = None,
) -> tuple[Report, float]:
    """Read the cluster and diagnose it: (report, seconds taken)."""
    t0 = time.monotonic()
    client = make_client(kubeconfig, context=context)
    try:
        if (pod or pvc) and not namespace:
            namespace = client.namespace or "default"
        snap = await collect(client)
    finally:
        await client.close()
    snap.settings = settings
    report = diagnose(snap, Scope(namespace, pod, pvc))
    return report, time.monotonic() - t0

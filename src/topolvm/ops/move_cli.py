"""``topolvm move -n NS pvc/NAME`` (also ``kubectl topolvm move``): move a claim with its data
to another node. The pre-flight checks of :mod:`topolvm.move.rules` run against the live
cluster before anything is created; then a VolumeMove is created and followed.

Exit codes: 0 moved (or, with ``--dry-run``/``--no-wait``, would move / started), 1 refused,
rolled back or not done in time, 2 could not check (API unreachable, bad kubeconfig, no
VolumeMove CRD), 130 interrupted (the move goes on)."""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import sys
from dataclasses import replace

from lightkube import AsyncClient

from topolvm.cliargs import go_duration
from topolvm.constants import Names, names
from topolvm.k8s.api import make_client
from topolvm.k8s.errors import KubeError
from topolvm.move.rules import Refused
from topolvm.ops import cluster
from topolvm.ops.follow import BarDisplay, Display, LineDisplay, Timeout, follow
from topolvm.ops.preflight import Plan, preflight_together
from topolvm.ops.render import dry_run_text, follow_hint, outcome, refusal_line
from topolvm.units import human

REFUSED, CANNOT_CHECK, INTERRUPTED = 1, 2, 130
OTHERS_WAIT = 120.0  # seconds the moves of the other claims may end after the one asked for
_CLAIM_KINDS = ("pvc", "pvcs", "persistentvolumeclaim", "persistentvolumeclaims")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def claim_name(value: str) -> str:
    """argparse type: ``pvc/NAME`` or ``NAME`` → NAME (a PersistentVolumeClaim's name)."""
    kind, slash, name = value.partition("/")
    if not slash:
        kind, name = "", value
    if kind and kind.lower() not in _CLAIM_KINDS:
        raise argparse.ArgumentTypeError(
            f"only PersistentVolumeClaims move: expected pvc/NAME or NAME, got {value!r}"
        )
    if not _DNS_SUBDOMAIN.fullmatch(name):
        raise argparse.ArgumentTypeError(f"not a claim name: {name!r}")
    return name


def node_name(value: str) -> str:
    """argparse type for a node's name."""
    if not _DNS_SUBDOMAIN.fullmatch(value):
        raise argparse.ArgumentTypeError(f"not a node name: {value!r}")
    return value


def add_keep_source(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep-source", type=go_duration, default=None, metavar="DURATION",
                   help="keep the old volume (PV and LogicalVolume, on the old node) this long "
                   "after the move is verified, then remove it (default: at once)")  # fmt: skip


def keep_seconds(args: argparse.Namespace) -> int:
    """``--keep-source`` as whole seconds (0: not given)."""
    keep: float | None = getattr(args, "keep_source", None)
    return math.ceil(keep) if keep else 0


def add_client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, "
                   "~/.kube/config, then the in-cluster account)")  # fmt: skip
    p.add_argument("--context", default=None, help="the kubeconfig context to use")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "move",
        help="move a PersistentVolumeClaim with its data to another node",
        description="Checks that the claim can move, creates a VolumeMove and follows it "
        "until it is done (topolvm-controller moves the data; the pod is down only for the "
        "final copy). Ctrl-C stops following, not the move. Exit code 0: moved, 1: refused, "
        "rolled back or not done in time, 2: could not check.",
    )
    p.add_argument("claim", type=claim_name, metavar="pvc/NAME", help="the claim to move")
    p.add_argument("-n", "--namespace", default="", help="the claim's namespace (default: "
                   "the kubeconfig context's)")  # fmt: skip
    p.add_argument("--to", type=node_name, default=None, metavar="NODE",
                   help="the target node (default: the node with the most free bytes)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true",
                   help="check and say what would happen; change nothing")  # fmt: skip
    p.add_argument("--no-wait", action="store_true",
                   help="create the VolumeMove and return without following it")  # fmt: skip
    p.add_argument("--timeout", type=go_duration, default=None, metavar="DURATION",
                   help="stop following after this long (the move goes on; exit 1)")  # fmt: skip
    add_keep_source(p)
    add_client_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    client: AsyncClient | None = None
    namespace = args.namespace
    try:
        client = make_client(args.kubeconfig or cluster.default_kubeconfig(), context=args.context)
        namespace = namespace or client.namespace or "default"
        return asyncio.run(move(client, names(), namespace, args))
    except KeyboardInterrupt:
        print(f"\ntopolvm move: interrupted; {follow_hint(namespace or 'NS')}", file=sys.stderr)
        return INTERRUPTED
    except (KubeError, cluster.CannotCheck) as e:
        print(f"topolvm move: could not check: {e}", file=sys.stderr)
        return CANNOT_CHECK


async def check(
    client: AsyncClient, n: Names, namespace: str, claim: str, target: str = ""
) -> list[Plan]:
    """The live pre-flight of ``claim`` and of the pod's other node-local claims, which move
    with it (raises Refused); ``claim``'s plan first."""
    common = await cluster.read_common(client, n)
    group = await cluster.group_facts(client, n, common, namespace, claim)
    return preflight_together(group, n, target)


async def move(client: AsyncClient, n: Names, namespace: str, args: argparse.Namespace) -> int:
    try:
        try:
            plans = await check(client, n, namespace, args.claim, args.to or "")
            plans = [replace(p, keep_source_seconds=keep_seconds(args)) for p in plans]
        except Refused as e:
            print(refusal_line("move", e), file=sys.stderr)
            return REFUSED
        if args.dry_run:
            sys.stdout.write(dry_run_text(plans))
            return 0
        try:
            await cluster.start_moves(client, n, plans)
        except Refused as e:
            print(refusal_line("move", e), file=sys.stderr)
            return REFUSED
        plan = plans[0]
        with_text = f" with {', '.join(plan.together)}" if plan.together else ""
        print(
            f"moving claim {plan.key}{with_text}: node {plan.source} → {plan.target}"
            f"{'' if plan.target_node else ' (expected: the controller picks)'} (at most "
            f"{human(sum(p.size for p in plans))}); VolumeMove"
            f"{'s' if len(plans) > 1 else ''} {', '.join(p.key for p in plans)} created"
        )
        if args.no_wait:
            print(follow_hint(namespace))
            return 0
        code = await watch(client, n, namespace, plan.claim, args.timeout)
        for other in plan.together:  # they end with it: the pod starts once all are swapped
            code = max(code, await watch(client, n, namespace, other, OTHERS_WAIT, quiet=True))
        return code
    finally:
        await client.close()


async def watch(
    client: AsyncClient, n: Names, namespace: str, name: str, timeout: float | None,
    *, quiet: bool = False,
) -> int:  # fmt: skip
    """Follow the VolumeMove ``name`` to its end and print how it ended (``quiet``: only
    that); the exit code."""
    display: Display
    if quiet:
        display = LineDisplay(None)
    elif sys.stderr.isatty():
        display = BarDisplay(sys.stderr)
    else:
        display = LineDisplay(sys.stdout)
    try:
        done = await follow(client, n, namespace, name, display, timeout)
    except Timeout as e:
        display.close()
        phase = e.move.status.phase if e.move is not None else "unknown"
        print(f"topolvm move: not done after {timeout:g} s (phase {phase}); "
              f"{follow_hint(namespace)}", file=sys.stderr)  # fmt: skip
        return REFUSED
    except BaseException:
        display.close()
        raise
    display.close()
    if done is None:
        print(f"topolvm move: VolumeMove {namespace}/{name} was deleted", file=sys.stderr)
        return REFUSED
    text, code = outcome(done)
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code

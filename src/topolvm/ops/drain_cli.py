"""``topolvm drain NODE`` (also ``kubectl topolvm drain``): move every TopoLVM claim off a
node, with its data, before the node goes (maintenance, replacement).

The node is cordoned first, so that nothing new lands on it while its claims are checked.
If any claim is refused and ``--skip-refused`` is not given, nothing starts and the cordon is
undone (unless the node was cordoned already). Otherwise the node stays cordoned: the moves
run at most ``--max-parallel`` at a time, never two of one pod, and each only while every
PodDisruptionBudget over its pod allows one more disruption. Other pods are not evicted
(``kubectl drain`` does that). Targets are the controller's choice.

Exit codes: 0 every claim moved (with ``--dry-run``: every claim would move), 1 a claim was
refused, rolled back or not done in time, 2 could not check (API unreachable, bad
kubeconfig, no such node), 130 interrupted (started moves go on)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import TextIO

from lightkube import AsyncClient

from topolvm.cliargs import go_duration
from topolvm.constants import Names, names
from topolvm.k8s import api
from topolvm.k8s.api import make_client
from topolvm.k8s.errors import KubeError
from topolvm.move import reads
from topolvm.ops import cluster, pdb
from topolvm.ops.drain_run import Result, Survey, execute, survey
from topolvm.ops.move_cli import add_client_args, add_keep_source, keep_seconds, node_name
from topolvm.ops.render import downtime_text, why_target
from topolvm.units import human

FAILED, CANNOT_CHECK, INTERRUPTED = 1, 2, 130


def parallel(value: str) -> int:
    """argparse type for ``--max-parallel``: a whole number ≥ 1."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value!r}")
    return n


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "drain",
        help="move every TopoLVM claim off a node, with its data",
        description="Cordons the node, checks each of its TopoLVM claims, then moves them "
        "(a VolumeMove each) within the PodDisruptionBudgets. If a claim is refused nothing "
        "starts (see --skip-refused) and a cordon this run made is undone; otherwise the "
        "node stays cordoned. Exit code 0: all moved, 1: not all, 2: could not check.",
    )
    p.add_argument("node", type=node_name, metavar="NODE", help="the node to empty")
    p.add_argument("--dry-run", action="store_true",
                   help="list the claims, pods, budgets, targets, bytes and downtime; change "
                   "nothing (no cordon)")  # fmt: skip
    p.add_argument("--max-parallel", type=parallel, default=1, metavar="N",
                   help="moves running at once (default 1)")  # fmt: skip
    p.add_argument("--skip-refused", action="store_true",
                   help="move the claims that can move even if others are refused")  # fmt: skip
    p.add_argument("--timeout", type=go_duration, default=None, metavar="DURATION",
                   help="stop after this long (started moves go on; exit 1)")  # fmt: skip
    add_keep_source(p)
    add_client_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        client = make_client(args.kubeconfig or cluster.default_kubeconfig(), context=args.context)
        return asyncio.run(drain(client, names(), args, sys.stdout))
    except KeyboardInterrupt:
        print("\ntopolvm drain: interrupted; started moves go on: follow them with kubectl get "
              "volumemoves -A", file=sys.stderr)  # fmt: skip
        return INTERRUPTED
    except (KubeError, cluster.CannotCheck) as e:
        print(f"topolvm drain: could not check: {e}", file=sys.stderr)
        return CANNOT_CHECK


async def drain(client: AsyncClient, n: Names, args: argparse.Namespace, out: TextIO) -> int:
    try:
        node = await api.get(client, reads.NODE, args.node)
        if node is None:
            raise cluster.CannotCheck(f"node {args.node} does not exist")
        cordoned_before = bool((node.get("spec") or {}).get("unschedulable"))
        ours = not args.dry_run and not cordoned_before
        if ours:
            await cluster.set_cordon(client, args.node, True)
            print(f"node {args.node} cordoned", file=out)
        try:
            found = await survey(client, n, args.node)
        except BaseException:
            if ours:
                await _uncordon(client, args.node, out)
            raise
        for key, e in found.refused:
            print(f"topolvm drain: refused ({e.reason}): {key}: {e.message}", file=sys.stderr)
        if args.dry_run:
            out.write(dry_run_text(args.node, found))
            return FAILED if found.refused else 0
        if found.refused and not args.skip_refused:
            print(f"nothing started: {len(found.refused)} claim(s) refused (--skip-refused "
                  "moves the others)", file=sys.stderr)  # fmt: skip
            if ours:
                await _uncordon(client, args.node, out)
            return FAILED
        plans = [replace(p, keep_source_seconds=keep_seconds(args)) for p in found.plans]
        results = await execute(client, n, plans, found.pdbs, args.max_parallel, args.timeout, out)
        out.write(summary(args.node, results, [k for k, _ in found.refused]))
        ok = not found.refused and all(r.ok for r in results)
        return 0 if ok else FAILED
    finally:
        await client.close()


async def _uncordon(client: AsyncClient, node: str, out: TextIO) -> None:
    await cluster.set_cordon(client, node, False)
    print(f"node {node} uncordoned (this run had cordoned it)", file=out)


def dry_run_text(node: str, found: Survey) -> str:
    """Claims, pods, budgets, expected targets, bytes and downtime: what a drain would do."""
    total = len(found.plans) + len(found.refused)
    lines = [f"node {node}: {total} TopoLVM claim(s); {len(found.plans)} would move, "
             f"{len(found.refused)} refused"]  # fmt: skip
    for plan in found.plans:
        lines += [
            f"  {plan.key}: pod {plan.pod} ({plan.owner})",
            f"    to node {plan.target} (expected; {why_target(plan)})",
            f"    data: at most {human(plan.size)}; downtime {downtime_text(plan.estimate)}",
        ]
        budgets = pdb.budgets(plan.pod_labels, found.pdbs.get(plan.namespace, []), [])
        lines += [f"    {b.name}: PodDisruptionBudget allows {b.allowed} disruption(s)"
                  for b in budgets]  # fmt: skip
        if any(b.allowed < 1 for b in budgets):
            lines.append("    the move would wait until its budgets allow a disruption")
    lines += [f"  {key}: refused ({e.reason}): {e.message}" for key, e in found.refused]
    lines.append("dry run: nothing was changed (the node was not cordoned)")
    return "\n".join(lines) + "\n"


def summary(node: str, results: Sequence[Result], refused: Sequence[str]) -> str:
    """One line per claim and the count, after the moves."""
    moved = sum(1 for r in results if r.ok)
    total = len(results) + len(refused)
    lines = [f"drain of node {node}: {moved} of {total} claim(s) moved"]
    lines += [f"  {'ok' if r.ok else 'FAILED'} {r.key}: {r.text}" for r in results]
    lines += [f"  SKIPPED {key}: refused" for key in refused]
    lines.append(f"node {node} stays cordoned")
    return "\n".join(lines) + "\n"

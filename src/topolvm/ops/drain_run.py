"""The work of ``topolvm drain``: find the node's TopoLVM claims and check each
(:func:`survey`), then run their moves a few at a time within the PodDisruptionBudgets
(:func:`execute`)."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import TextIO

from lightkube import ALL_NS, AsyncClient

from topolvm.constants import Names
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.move import reads, rules
from topolvm.move.rules import Refused
from topolvm.ops import cluster, pdb
from topolvm.ops.preflight import Obj, Plan, preflight_together
from topolvm.ops.render import outcome, progress_line

POLL_SECONDS = 1.0


@dataclass
class Survey:
    """The node's claims: those that may move (with the expected target) and the refused."""

    plans: list[Plan] = field(default_factory=list)
    refused: list[tuple[str, Refused]] = field(default_factory=list)
    pdbs: dict[str, list[Obj]] = field(default_factory=dict)  # namespace → its budgets


def claims_on(pvs: list[Obj], node: str, names: Names) -> list[tuple[str, str]]:
    """``(namespace, claim)`` of every Bound TopoLVM PersistentVolume on ``node``, sorted."""
    out = []
    for pv in pvs:
        spec = pv.get("spec") or {}
        if (spec.get("csi") or {}).get("driver") != names.plugin:
            continue
        if (pv.get("status") or {}).get("phase") != "Bound":
            continue
        ref = spec.get("claimRef") or {}
        if ref.get("name") and rules.source_node(pv, names.topology_key) == node:
            out.append((str(ref.get("namespace") or ""), str(ref["name"])))
    return sorted(out)


async def survey(client: AsyncClient, names: Names, node: str) -> Survey:
    """Pre-flight of every claim on ``node``. Targets are what the controller is expected to
    pick: each claim's volume is counted against its target's free bytes before the next is
    placed, so that room for all of them is checked, not only for each alone."""
    common = await cluster.read_common(client, names)
    pvs, _ = await api.list_all(client, reads.PV)
    pvcs, _ = await api.list_all(client, reads.PVC, namespace=ALL_NS)
    by_key = {(str(p["metadata"].get("namespace")), cluster.name_of(p)): p for p in pvcs}
    moves = await cluster.list_moves(client, names)
    claims = claims_on(pvs, node, names)
    out = Survey()
    pods: dict[str, list[Obj]] = {}
    remaining: dict[str, dict[str, int]] = {}  # device class → node → bytes not yet promised
    for ns in sorted({ns for ns, _ in claims}):
        pods[ns] = (await api.list_all(client, reads.POD, namespace=ns))[0]
        out.pdbs[ns] = (await api.list_all(client, cluster.PDB, namespace=ns))[0]
    planned: set[tuple[str, str]] = set()
    for ns, claim in claims:
        if (ns, claim) in planned:
            continue  # it moves with another claim of its pod
        group = await cluster.group_facts(
            client, names, common, ns, claim, pvc=by_key.get((ns, claim)), pods=pods[ns],
            moves=moves,
        )  # fmt: skip
        left = [dataclasses.replace(f, free=remaining.setdefault(f.device_class, dict(f.free)))
                for f in group]  # fmt: skip
        try:
            plans = preflight_together(left, names)
        except Refused as e:
            out.refused.append((f"{ns}/{claim}", e))
            continue
        for plan in plans:
            remaining[plan.device_class][plan.target] -= plan.size
            planned.add((ns, plan.claim))
            out.plans.append(plan)
    return out


@dataclass
class Result:
    key: str
    ok: bool
    text: str


@dataclass
class _Running:
    plan: Plan
    phase: str = ""


async def execute(
    client: AsyncClient, names: Names, plans: list[Plan], pdbs: dict[str, list[Obj]],
    max_parallel: int, timeout: float | None, out: TextIO,
) -> list[Result]:  # fmt: skip
    """Create the VolumeMoves, at most ``max_parallel`` running, never two of one pod, and
    each only while every budget over its pod has a disruption left (budgets are re-read
    while a move waits). Prints one line per phase change. Moves not started before the
    ``timeout`` are reported as such; started ones go on."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    pending, running = list(plans), dict[str, _Running]()
    results: list[Result] = []
    waiting_for: dict[str, str] = {}  # claim → the reason it waits, last printed
    while pending or running:
        for key, r in list(running.items()):
            try:
                move = await cluster.get_move(client, names, r.plan.namespace, r.plan.claim)
            except kube.KubeError as e:
                if not kube.is_transient(e):
                    raise
                continue  # read again next round: the move goes on meanwhile
            if move is None:
                results.append(Result(key, False, f"VolumeMove {key} was deleted"))
                del running[key]
                continue
            if move.status.phase != r.phase:
                r.phase = move.status.phase
                print(progress_line(move.status, f"[{key}]"), file=out, flush=True)
            if move.done:
                text, code = outcome(move)
                results.append(Result(key, code == 0, text))
                del running[key]
        if pending and len(running) < max_parallel:
            await _refresh_pdbs(client, pending, pdbs)
        for plan in list(pending):
            if len(running) >= max_parallel:
                break
            if plan not in pending:
                continue  # started with another claim of its pod
            why = _why_wait(plan, running, pdbs)
            if why:
                if waiting_for.get(plan.key) != why:
                    waiting_for[plan.key] = why
                    print(f"[{plan.key}] waits: {why}", file=out, flush=True)
                continue
            group = [plan] + [q for q in pending if q.namespace == plan.namespace
                              and q.claim in plan.together]  # fmt: skip
            for q in group:
                pending.remove(q)
            results.extend(await _start(client, names, group, running, out))
        if not (pending or running):
            break
        if deadline is not None and loop.time() >= deadline:
            for plan in pending:
                results.append(Result(plan.key, False, "not started: timed out"))
            for key, r in running.items():
                results.append(Result(key, False, f"not done in time (phase {r.phase}); "
                                      "the move goes on"))  # fmt: skip
            break
        await asyncio.sleep(POLL_SECONDS)
    return results


async def _start(
    client: AsyncClient, names: Names, group: list[Plan], running: dict[str, _Running],
    out: TextIO,
) -> list[Result]:  # fmt: skip
    """Create the VolumeMoves of a pod's claims (if one is refused, none is left)."""
    try:
        await cluster.start_moves(client, names, group)
    except Refused as e:
        return [Result(p.key, False, f"refused ({e.reason}): {e.message}") for p in group]
    for plan in group:
        running[plan.key] = _Running(plan)
        print(f"[{plan.key}] VolumeMove created (pod {plan.pod}, node {plan.source} → "
              f"expected {plan.target})", file=out, flush=True)  # fmt: skip
    return []


async def _refresh_pdbs(
    client: AsyncClient, pending: list[Plan], pdbs: dict[str, list[Obj]]
) -> None:
    for ns in sorted({p.namespace for p in pending}):
        pdbs[ns] = (await api.list_all(client, cluster.PDB, namespace=ns))[0]


def _why_wait(plan: Plan, running: dict[str, _Running], pdbs: dict[str, list[Obj]]) -> str:
    """Why ``plan`` may not start now, or ""."""
    same_ns = [r.plan for r in running.values() if r.plan.namespace == plan.namespace]
    if any(p.pod == plan.pod for p in same_ns):
        return f"pod {plan.pod} is stopped by another move of its claims"
    stuck = pdb.blocking(plan.pod_labels, pdbs.get(plan.namespace, []),
                         [p.pod_labels for p in same_ns])  # fmt: skip
    return "; ".join(str(b) for b in stuck)

"""What ``make demo`` chooses from the layout kube-scheduler gave it (pure: no cluster, no I/O).

kube-scheduler places the Vault replicas by capacity, and with equal scores it may put any of
them alone on its node. The steps that need a certain layout read it and choose from it here:
step 7 (a replica's audit volume snapshotted onto another node) needs a node with room for the
snapshot and room on the replica's node for its cut; step 8 (a replica moved to a new node) picks
the replica whose node has the most room for the move's cuts, and sizes the new node's VG from that
replica's claims. tests/test_demo_plan.py runs these choices over every placement of the 3
replicas on the 3 nodes, with the resize of step 5.

``TOPOLVM_DEMO_PLACEMENT`` forces a placement (``vault-0=uml-2,vault-1=uml-3,vault-2=uml-3``):
the demo then creates the replicas' claims with the node chosen (docs/demo.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from topolvm.node.finalcut import MOVE_COW_SHARE
from topolvm.units import apart, human

GiB = 1 << 30
NODE_VG_GIB = {"uml-1": 12, "uml-2": 22, "uml-3": 36}
THIN_POOL_GIB = 2
SPARE_GIB = 1  # the ssd device class's spare-gb
REPLICAS = 3
PODS = tuple(f"vault-{i}" for i in range(REPLICAS))
CLAIM_SIZES = (("data", 10 * GiB), ("audit", 5 * GiB))  # the StatefulSet's claim templates
RESIZED, RESIZED_TO = "data-vault-0", 12 * GiB  # step 5
SEEDED = "vault-2"  # step 7: its data claim goes, its audit claim is snapshotted and restored
NEW_NODE = "uml-4"
PLACEMENT_ENV = "TOPOLVM_DEMO_PLACEMENT"
EXTENT = 4 << 20  # LVM's default extent size: the VG of a demo node has it

Sizes = Mapping[str, Mapping[str, int]]  # pod -> claim -> bytes


class PlanError(Exception):
    """The layout leaves the demo no way through a step: the message says which and why."""


def replica_claims(pod: str) -> dict[str, int]:
    """A replica's claims and their sizes as the StatefulSet creates them."""
    return {f"{kind}-{pod}": size for kind, size in CLAIM_SIZES}


def parse_placement(text: str, nodes: Iterable[str]) -> dict[str, str]:
    """``vault-0=uml-2,vault-1=uml-3,vault-2=uml-3`` (every replica once) as pod -> node."""
    known = sorted(nodes)
    out: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        pod, sep, node = (s.strip() for s in item.partition("="))
        if not sep or pod not in PODS or node not in known:
            raise PlanError(
                f"{PLACEMENT_ENV}: {item!r} is not POD=NODE with POD one of {', '.join(PODS)} "
                f"and NODE one of {', '.join(known)}"
            )
        if pod in out:
            raise PlanError(f"{PLACEMENT_ENV}: {pod} is placed twice")
        out[pod] = node
    if missing := [p for p in PODS if p not in out]:
        raise PlanError(f"{PLACEMENT_ENV}: {', '.join(missing)} not placed (give every replica)")
    return out


def check_placement(placement: Mapping[str, str], sizes: Sizes, free: Mapping[str, int]) -> None:
    """Every node has room (``free``: the capacity annotation, spare already off) for the
    claims of the replicas placed on it; else :class:`PlanError` names the node."""
    for node in sorted(set(placement.values())):
        pods = sorted(p for p, n in placement.items() if n == node)
        need = sum(sum(sizes[p].values()) for p in pods)
        if need > free.get(node, 0):
            has, wants = apart(free.get(node, 0), need)
            raise PlanError(f"{node} has {has} free in ssd; {', '.join(pods)} need {wants}")


def check_resize(placement: Mapping[str, str], sizes: Sizes, free: Mapping[str, int]) -> None:
    """Step 5's claim can grow to :data:`RESIZED_TO` on its node (``free``: now)."""
    pod = RESIZED.removeprefix("data-")
    node, grow = placement[pod], RESIZED_TO - sizes[pod][RESIZED]
    if grow > free[node]:
        has, wants = apart(free[node], grow)
        raise PlanError(f"{node} has {has} free in ssd; growing {RESIZED} needs {wants}")


def free_after(
    placement: Mapping[str, str], sizes: Sizes, free: Mapping[str, int]
) -> dict[str, int]:
    """Each node's free bytes once the placed replicas' claims are on it."""
    out = dict(free)
    for pod, node in placement.items():
        out[node] -= sum(sizes[pod].values())
    return out


def _cut(room: int, size: int, share: int) -> int | None:
    """The copy-on-write area lvmd gives a move's thick cut of a ``size``-byte volume with
    ``room`` bytes free in the VG (CreateCut with min_cow_bytes = size / share: a quarter of
    the room, at least that, at most the origin; None when it does not fit)."""
    least = size // share
    cow = min(-(-max(least, room // 4, EXTENT) // EXTENT) * EXTENT, size)
    return cow if cow <= room else None


def cuts_fit(sizes: Iterable[int], room: int) -> bool:
    """A move of these thick volumes together has room for its cuts on the source: the first
    cuts (made in either order, as the claims' copies run at once) live on while the second
    ones are made."""
    vols = list(sizes)
    for first, second in itertools.product(itertools.permutations(vols), repeat=2):
        left = room
        for size, share in [(s, MOVE_COW_SHARE[0]) for s in first] + [
            (s, MOVE_COW_SHARE[1]) for s in second
        ]:  # fmt: skip
            cow = _cut(left, size, share)
            if cow is None:
                break
            left -= cow
        else:
            continue
        return False
    return True


def new_node_vg_gib(need: int) -> int:
    """A joining node's VG for a replica of ``need`` bytes: its claims, the thin pool, the
    device class's spare and one GiB for LVM's metadata and the pool's."""
    return -(-need // GiB) + THIN_POOL_GIB + SPARE_GIB + 1


@dataclass(frozen=True)
class MovePlan:
    pod: str
    source: str
    claims: tuple[str, ...]  # the claim named on the command line first
    need: int  # bytes of all its claims
    vg_gib: int  # the new node's VG


def plan_move(placement: Mapping[str, str], sizes: Sizes, free: Mapping[str, int]) -> MovePlan:
    """Step 8's replica: one whose node has room for the move's cuts (``free``: each node's
    capacity annotation now; cuts may use the spare too), the one with the most room to spare
    beyond the cuts' least; the new node is sized for it."""

    def room_left(pod: str) -> int:
        least = sum(s // MOVE_COW_SHARE[0] + s // MOVE_COW_SHARE[1] for s in sizes[pod].values())
        return free[placement[pod]] + SPARE_GIB * GiB - least

    fit = [p for p in sorted(placement)
           if cuts_fit(sizes[p].values(), free[placement[p]] + SPARE_GIB * GiB)]  # fmt: skip
    if not fit:
        shown = ", ".join(f"{n}: {human(free[n])}" for n in sorted(set(placement.values())))
        raise PlanError(f"no replica's node has room for a move's cuts of its claims ({shown})")
    pod = min(fit, key=lambda p: (-room_left(p), p))
    claims = sorted(sizes[pod], key=lambda c: (not c.startswith("data-"), c))
    need = sum(sizes[pod].values())
    return MovePlan(pod, placement[pod], tuple(claims), need, new_node_vg_gib(need))


@dataclass(frozen=True)
class SeedPlan:
    source: str  # SEEDED's node
    keeper: str  # where the snapshot is kept: the other node with the most room
    returns_to: tuple[str, ...]  # where the new SEEDED's claims fit


def plan_seed(placement: Mapping[str, str], sizes: Sizes, free: Mapping[str, int]) -> SeedPlan:
    """Step 7: SEEDED's data claim goes, freeing room on its node for the cut of its audit
    volume (as large as itself); the snapshot goes to the other node with the most room; the
    audit claim goes too, and the new SEEDED goes where both claims fit."""
    src = placement[SEEDED]
    data, audit = (sizes[SEEDED][f"{k}-{SEEDED}"] for k, _ in CLAIM_SIZES)
    room = dict(free)
    room[src] += data
    if room[src] + SPARE_GIB * GiB < audit:
        has, wants = apart(room[src] + SPARE_GIB * GiB, audit)
        raise PlanError(f"{src} has {has} for the cut of audit-{SEEDED}, which needs {wants}")
    others = [n for n in sorted(room) if n != src and room[n] >= audit]
    if not others:
        raise PlanError(f"no node but {src} has room for a {human(audit)} snapshot")
    keeper = max(others, key=lambda n: (room[n], n))
    room[keeper] -= audit
    room[src] += audit
    back = tuple(n for n in sorted(room) if room[n] >= data + audit)
    if not back:
        raise PlanError(f"no node has room for {SEEDED}'s claims once they are made again")
    return SeedPlan(src, keeper, back)

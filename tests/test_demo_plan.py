"""``make demo``'s choices over every placement of its 3 Vault replicas on its 3 nodes
(devtools/demo_plan.py): each placement kube-scheduler can choose, with the resize of step 5,
leads through steps 7 and 8; each it cannot choose is refused up front, naming the node."""

from __future__ import annotations

import itertools

import pytest

from devtools import demo_plan as plan
from devtools.demo_plan import GiB, PlanError

# what a demo node's capacity annotation says for ssd: its VG less the thin pool, its metadata
# (pool metadata, its spare, the VG's own: under 64 MiB in every run) and the spare
OVERHEAD = 64 << 20


def ssd_free(vg_gib: int) -> int:
    return (vg_gib - plan.THIN_POOL_GIB - plan.SPARE_GIB) * GiB - OVERHEAD


FREE = {n: ssd_free(g) for n, g in plan.NODE_VG_GIB.items()}
NODES = sorted(plan.NODE_VG_GIB)
PLACEMENTS = [dict(zip(plan.PODS, nodes, strict=True))
              for nodes in itertools.product(NODES, repeat=plan.REPLICAS)]  # fmt: skip


def fits(placement: dict[str, str]) -> bool:
    return all(
        sum(15 * GiB for n in placement.values() if n == node) <= FREE[node]
        for node in set(placement.values())
    )  # fmt: skip


def test_27_placements_of_which_kube_scheduler_can_choose_three() -> None:
    assert len(PLACEMENTS) == 27
    # uml-1 holds no replica, uml-2 one, uml-3 two: which replica is alone is the scheduler's
    assert sorted(tuple(p.values()) for p in PLACEMENTS if fits(p)) == [
        ("uml-2", "uml-3", "uml-3"), ("uml-3", "uml-2", "uml-3"), ("uml-3", "uml-3", "uml-2")
    ]  # fmt: skip


@pytest.mark.parametrize("placement", PLACEMENTS, ids=lambda p: ",".join(p.values()))
def test_every_placement(placement: dict[str, str]) -> None:
    sizes = {p: plan.replica_claims(p) for p in plan.PODS}
    if not fits(placement):
        with pytest.raises(PlanError, match=r"^uml-\d has .* free in ssd; vault-"):
            plan.check_placement(placement, sizes, FREE)
        return
    plan.check_placement(placement, sizes, FREE)
    # 5: data-vault-0 grows to 12 GiB where it is
    free = plan.free_after(placement, sizes, FREE)
    plan.check_resize(placement, sizes, free)
    sizes["vault-0"][plan.RESIZED] = plan.RESIZED_TO
    free = plan.free_after(placement, sizes, FREE)
    # 7: vault-2's audit volume kept on another node; vault-2 comes back where its claims fit
    seed = plan.plan_seed(placement, sizes, free)
    assert seed.source == placement["vault-2"] and seed.keeper == "uml-1"
    assert seed.returns_to == (seed.source,)  # no other node has room for 15 GiB then
    free[seed.keeper] -= 5 * GiB
    # 8: a replica whose node has room for its cuts moves to a new node sized for it
    move = plan.plan_move(placement, sizes, free)
    assert plan.cuts_fit(sizes[move.pod].values(), free[move.source] + plan.SPARE_GIB * GiB)
    assert move.claims == (f"data-{move.pod}", f"audit-{move.pod}")
    assert move.need == sum(sizes[move.pod].values())
    assert ssd_free(move.vg_gib) >= move.need  # what failed: 17 GiB needed, 17 GiB - ε free
    if placement["vault-0"] == "uml-2":
        # the resized replica alone on uml-2 has less room for its cuts than uml-3's replicas
        assert plan.cuts_fit(sizes["vault-0"].values(), free["uml-2"] + plan.SPARE_GIB * GiB)
        assert (move.pod, move.source, move.need) == ("vault-1", "uml-3", 15 * GiB)
    else:
        alone = next(p for p, n in placement.items() if n == "uml-2")
        assert (move.pod, move.source, move.need) == (alone, "uml-2", 15 * GiB)


def test_the_new_node_fits_the_resized_replica() -> None:
    """The run that failed: the 17 GiB replica moved; the new node used to be 20 GiB."""
    assert plan.new_node_vg_gib(17 * GiB) == 21 and ssd_free(21) >= 17 * GiB
    assert ssd_free(20) < 17 * GiB


def test_cut_room() -> None:
    # a 12 GiB and a 5 GiB volume: first cuts at least 1/8, second at least 1/32 of each
    assert plan.cuts_fit([12 * GiB, 5 * GiB], 3 * GiB)
    assert not plan.cuts_fit([12 * GiB, 5 * GiB], 2 * GiB)
    # as large as its origin (a quarter of the room), once room is plenty
    assert plan._cut(100 * GiB, 5 * GiB, 8) == 5 * GiB
    assert plan._cut(GiB, 12 * GiB, 8) is None


def test_no_replica_can_move() -> None:
    placement = {"vault-0": "uml-2", "vault-1": "uml-3", "vault-2": "uml-3"}
    sizes = {p: plan.replica_claims(p) for p in plan.PODS}
    with pytest.raises(PlanError, match="no replica's node has room for a move's cuts"):
        plan.plan_move(placement, sizes, {"uml-2": 0, "uml-3": 0})


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("vault-0=uml-2,vault-1=uml-3", "vault-2 not placed"),
        ("vault-0=uml-2,vault-0=uml-3,vault-1=uml-3,vault-2=uml-3", "vault-0 is placed twice"),
        ("vault-0=uml-9,vault-1=uml-3,vault-2=uml-3", "'vault-0=uml-9' is not POD=NODE"),
        ("vault-0:uml-2", "'vault-0:uml-2' is not POD=NODE"),
        ("vault-7=uml-2", "'vault-7=uml-2' is not POD=NODE"),
    ],
)  # fmt: skip
def test_forced_placement_is_checked(text: str, error: str) -> None:
    with pytest.raises(PlanError, match=error):
        plan.parse_placement(text, plan.NODE_VG_GIB)


def test_forced_placement() -> None:
    got = plan.parse_placement(" vault-0=uml-2, vault-1=uml-3,vault-2=uml-3 ", plan.NODE_VG_GIB)
    assert got == {"vault-0": "uml-2", "vault-1": "uml-3", "vault-2": "uml-3"}

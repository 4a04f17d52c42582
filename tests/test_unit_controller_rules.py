"""The controller's pure rules: sizes and placement (controller/sizing.py) and the in-flight
reservations that keep GetCapacity and CreateVolume from offering the same bytes twice
(controller/inflight.py). No I/O; the clock is a variable."""

from __future__ import annotations

import pytest

from topolvm.constants import NORMAL
from topolvm.controller.copies import PlacementError, placement, restore_node, snapshot_node
from topolvm.controller.inflight import InFlight
from topolvm.controller.sizing import (
    GiB,
    MinimumAllocations,
    SizingError,
    largest,
    node_from_topology,
    volume_size,
)

# --- sizing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("required", "limit", "size"),
    [
        (0, 0, GiB),  # nothing asked: 1 GiB
        (0, 2 * GiB, GiB),
        (0, GiB, GiB),
        (0, 10_000, 8192),  # only a limit below 1 GiB: the limit, aligned down
        (1, 0, 4096),  # rounded up to 4096
        (4096, 4096, 4096),
        (5 * GiB + 1, 0, 5 * GiB + 4096),
    ],
)
def test_volume_size(required: int, limit: int, size: int) -> None:
    assert volume_size(required, limit) == size


@pytest.mark.parametrize(
    ("required", "limit", "message"),
    [
        (-1, 0, "must not be negative"),
        (0, -1, "must not be negative"),
        (8192, 4096, "exceed the limit"),
        (4097, 5000, "rounded up to 8192 exceed limit 5000"),
        (0, 100, "smaller than one 4096-byte block"),
    ],
)
def test_volume_size_refuses_ranges_it_cannot_meet(required: int, limit: int, message: str) -> None:
    with pytest.raises(SizingError, match=message):
        volume_size(required, limit)


def test_minimum_allocation_by_access_type() -> None:
    m = MinimumAllocations(block=1, ext4=2, xfs=3, btrfs=4)
    assert m.for_volume(block=True, fs_type="xfs") == 1
    assert [m.for_volume(block=False, fs_type=f) for f in ("ext4", "xfs", "btrfs")] == [2, 3, 4]
    assert m.for_volume(block=False, fs_type="vfat") == 0


def test_node_from_topology_prefers_preferred_then_requisite() -> None:
    key = "topology.topolvm.io/node"
    assert node_from_topology([{key: "a"}], [{key: "b"}], key) == "a"
    assert node_from_topology([{"other": "x"}, {key: ""}], [{key: "b"}], key) == "b"
    assert node_from_topology([], [{"other": "x"}], key) is None


def test_largest_breaks_ties_by_name() -> None:
    assert largest({"b": 5, "a": 5, "c": 1}) == ("a", 5)
    assert largest({"b": 7, "a": 5}) == ("b", 7)
    assert largest({}) is None


# --- in-flight reservations -----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_a_reservation_counts_once_per_name(clock: Clock) -> None:
    f = InFlight(clock=clock)
    f.reserve("v1", "n1", "ssd", 10, "100")
    f.reserve("v1", "n1", "ssd", 99, "100")  # a retry keeps the first reservation
    f.reserve("v2", "n1", "hdd", 5, "50")
    assert f.taken("n1", "ssd") == 10
    assert f.taken("n1", "hdd") == 5
    assert f.taken("n2", "ssd") == 0
    # LogicalVolumes another replica is creating count too, but a name only once.
    assert f.taken("n1", "ssd", creating=[("v1", 10), ("v3", 7), ("v3", 7)]) == 17
    assert f.totals() == {("n1", "ssd"): 10, ("n1", "hdd"): 5}
    f.release("v1")
    assert f.taken("n1", "ssd") == 0 and len(f) == 1


def test_settled_reservation_stays_until_the_node_recounts_after_the_delay(clock: Clock) -> None:
    f = InFlight(clock=clock, settle_delay=5, settle_timeout=120)
    f.reserve("v1", "n1", "ssd", 10, "100")
    f.observe("n1", lambda dc: "90")  # not settled yet: a change means nothing
    assert f.taken("n1", "ssd") == 10
    f.settle("v1")
    clock.now += 1
    f.observe("n1", lambda dc: "90")  # changed, but too soon: maybe another volume's re-count
    assert f.taken("n1", "ssd") == 10
    clock.now += 5
    f.observe("n1", lambda dc: "100")  # unchanged: the node has not re-counted yet
    assert f.taken("n1", "ssd") == 10
    f.observe("n2", lambda dc: "90")  # another node's update
    assert f.taken("n1", "ssd") == 10
    f.observe("n1", lambda dc: "90")
    assert f.taken("n1", "ssd") == 0


def test_a_reservation_for_a_made_lv_ends_after_the_delay_without_a_change(clock: Clock) -> None:
    """A CreateVolume retried after the LV was made: the annotation may count it already."""
    f = InFlight(clock=clock, settle_delay=5, settle_timeout=120)
    f.reserve("v1", "n1", "ssd", 10, "90", made=True)
    f.reserve("v2", "n1", "ssd", 20, "90")  # made by this process, settled at the same time
    f.settle("v1")
    f.settle("v2")
    clock.now += 4
    assert f.taken("n1", "ssd") == 30  # a burst's node may not have re-counted it yet
    clock.now += 1
    assert f.taken("n1", "ssd") == 20  # the annotation never changes: ended all the same
    f.observe("n1", lambda dc: "90")
    assert f.taken("n1", "ssd") == 20


def test_a_lost_update_frees_the_space_after_the_timeout(clock: Clock) -> None:
    f = InFlight(clock=clock, settle_delay=5, settle_timeout=120)
    f.reserve("v1", "n1", "ssd", 10, "100")
    f.reserve("v2", "n1", "ssd", 20, "100")  # never settles: CreateVolume still running
    f.settle("v1")
    clock.now += 120
    assert f.taken("n1", "ssd") == 30
    clock.now += 1
    assert f.taken("n1", "ssd") == 20
    f.settle("v2")
    f.settle("v2")  # settling twice keeps the first time
    clock.now += 121
    f.observe("n1", lambda dc: "100")
    assert len(f) == 0


def test_a_cancelled_create_keeps_its_reservation_for_the_retry(clock: Clock) -> None:
    """The caller's deadline passed while the node was making the LV: its bytes stay taken."""
    f = InFlight(clock=clock, settle_delay=5, settle_timeout=120)
    f.reserve("v1", "n1", "ssd", 10, "90")
    f.abandon("v1")
    clock.now += 60
    f.observe("n1", lambda dc: "80")  # a re-count, maybe for another volume
    assert f.taken("n1", "ssd") == 10
    f.reserve("v1", "n1", "ssd", 10, "80", made=True)  # the retry finds the LV made
    f.settle("v1")
    clock.now += 5
    assert f.taken("n1", "ssd") == 10  # the first reservation: ends on a change, not on time
    f.observe("n1", lambda dc: "80")
    assert f.taken("n1", "ssd") == 0  # "80" differs from "90", seen after the delay


def test_a_cancelled_create_never_retried_frees_the_space_after_the_timeout(
    clock: Clock,
) -> None:
    f = InFlight(clock=clock, settle_delay=5, settle_timeout=120)
    f.reserve("v1", "n1", "ssd", 10, "90")
    f.abandon("v1")
    clock.now += 120
    assert f.taken("n1", "ssd") == 10
    clock.now += 1
    assert f.taken("n1", "ssd") == 0


def test_an_ended_reservation_says_why_and_when(clock: Clock) -> None:
    f = InFlight(clock=clock, settle_delay=5, settle_timeout=120)
    f.reserve("v1", "n1", "ssd", 10, "90")
    f.reserve("v2", "n1", "ssd", 20, "90", made=True)
    f.settle("v1")
    f.settle("v2")
    clock.now += 6
    [made] = f.expire()
    assert (made.reservation.name, made.why, made.after) == ("v2", "made before it was reserved", 6)
    [changed] = f.observe("n1", lambda dc: "80")
    assert (changed.reservation.name, changed.why) == ("v1", "the node's annotation changed")


def test_a_retry_on_another_node_moves_the_reservation(clock: Clock) -> None:
    f = InFlight(clock=clock, settle_delay=5, settle_timeout=120)
    f.reserve("v1", "n1", "ssd", 10, "90")
    f.abandon("v1")
    f.reserve("v1", "n2", "ssd", 10, "90")
    assert (f.taken("n1", "ssd"), f.taken("n2", "ssd")) == (0, 10)


# -- where restores, clones and snapshots go (docs/mobility.md) ------------------------------

KEY = "topology.topolvm.io/node"


def _segments(*nodes: str) -> list[dict[str, str]]:
    return [{KEY: n} for n in nodes]


def test_a_restore_follows_the_scheduler_and_stays_home_without_one() -> None:
    pref, req = _segments("b", "a", "c"), _segments("a", "b", "c")
    assert restore_node("a", pref, req, KEY, scheduled=True) == "b"  # the scheduler chose b
    assert restore_node("a", pref, req, KEY, scheduled=None) == "b"  # unknown: follow it
    assert restore_node("a", pref, req, KEY, scheduled=False) == "a"  # Immediate: no copy
    # Immediate with a topology that excludes the source's node: the first allowed one
    assert restore_node("a", _segments("c"), _segments("c"), KEY, scheduled=False) == "c"


def test_snapshot_placement_parameters_and_the_node_chosen() -> None:
    assert not placement({}, NORMAL).off_node
    where = placement({NORMAL.snapshot_node_selector_param: "backup=true, zone"}, NORMAL)
    assert where.off_node and where.selector == (("backup", "true"), ("zone", None))
    free = {"a": 100, "b": 50, "c": 80, "d": 80}
    labels = {"b": {"backup": "true", "zone": "1"}, "c": {"backup": "true"}, "d": {}}
    assert snapshot_node(where, "a", free, labels, 40) == "b"  # c lacks the zone label
    anywhere = placement({NORMAL.snapshot_placement_param: "other-node"}, NORMAL)
    assert snapshot_node(anywhere, "a", free, labels, 40) == "c"  # most room, never the source
    assert snapshot_node(anywhere, "a", free, labels, 90) is None
    for bad in ({NORMAL.snapshot_placement_param: "elsewhere"},
                {NORMAL.snapshot_node_selector_param: "=x"},
                {NORMAL.snapshot_placement_param: "source-node",
                 NORMAL.snapshot_node_selector_param: "a=b"}):  # fmt: skip
        with pytest.raises(PlacementError):
            placement(bad, NORMAL)

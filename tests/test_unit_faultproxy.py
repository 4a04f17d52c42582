"""The fault proxy's schedule (devtools/testbed/faultproxy.py): seeded, and each fault only
where the API server could answer with it."""

from __future__ import annotations

from collections import Counter

from devtools.testbed.faultproxy import (
    CONFLICT,
    DROPPED,
    ENDED,
    ERROR,
    GONE,
    LOST,
    THROTTLED,
    Schedule,
)

N = 4000


def test_the_same_seed_draws_the_same_faults() -> None:
    a, b, c = Schedule("s"), Schedule("s"), Schedule("t")
    draws = [(a.request(k, "PUT", False, True), a.watch(k)) for k in range(200)]
    assert draws == [(b.request(k, "PUT", False, True), b.watch(k)) for k in range(200)]
    assert draws != [(c.request(k, "PUT", False, True), c.watch(k)) for k in range(200)]


def test_each_fault_only_where_it_can_happen() -> None:
    s = Schedule("unit")
    reads = Counter(s.request(k, "GET", False, False) for k in range(N))
    assert set(reads) == {None, THROTTLED, ERROR}
    watches = Counter(s.request(k, "GET", True, False) for k in range(N))
    assert set(watches) == {None, THROTTLED, ERROR}
    writes = Counter(s.request(k, "PATCH", False, False) for k in range(N))
    assert set(writes) == {None, THROTTLED, ERROR, LOST}
    guarded = Counter(s.request(k, "PUT", False, True) for k in range(N))
    assert set(guarded) == {None, CONFLICT, THROTTLED, ERROR, LOST}
    assert abs(guarded[CONFLICT] / N - s.conflict) < 0.03
    assert abs(reads[THROTTLED] / N - s.throttle) < 0.02


def test_the_rare_faults_come_first_if_not_drawn() -> None:
    s = Schedule("unit", conflict=0, throttle=0, error=0, lost=0)
    assert s.request(0, "PUT", False, True) is None
    assert s.request(0, "PUT", False, True, unseen=[CONFLICT, LOST]) == CONFLICT
    assert s.request(0, "PUT", False, True, unseen=[LOST]) == LOST
    assert s.request(0, "POST", False, False, unseen=[CONFLICT]) is None
    assert s.request(0, "GET", False, False, unseen=[CONFLICT, LOST]) is None
    assert s.request(0, "GET", True, False, unseen=[CONFLICT, LOST]) is None


def test_every_watch_ends_within_its_life() -> None:
    s = Schedule("unit")
    ends = [s.watch(k) for k in range(N)]
    assert all(0 <= when <= s.watch_life for when, _ in ends)
    kinds = Counter(how for _, how in ends)
    assert set(kinds) == {GONE, DROPPED, ENDED}
    assert sum(1 for when, _ in ends if when == 0) > N // 10  # some at once, before any event

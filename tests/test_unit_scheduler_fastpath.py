"""The node-cache fast path (nodeCacheCapable mode) against the plain per-node rules.

``CacheView.filter`` and ``CacheView.priorities`` answer from indexes (``CapacityOrder``, reply
fragments); the reference here asks :meth:`CacheView.get` and the rules of
``topolvm.scheduler.extender`` node by node, as the extender did before the fast path.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from topolvm.config.scheduler import parse_scheduler_config
from topolvm.constants import NORMAL
from topolvm.scheduler import nodecache
from topolvm.scheduler.extender import (
    HostPriority,
    encode_filter_names,
    encode_priorities,
    filter_reason,
    node_score,
    unknown_reason,
)
from topolvm.scheduler.nodecache import CapacityOrder, NodeCache
from topolvm.scheduler.verbs import Extender

GiB = 1 << 30
PREFIX = NORMAL.capacity_prefix
DEVICE_CLASSES = ("00default", "hdd", "nvme", "ssd")
VALUES = ("0", "1", "5", str(GiB), str(3 * GiB), str(100 * GiB), str(7 << 40), str((1 << 64) - 1))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def node(name: str, **caps: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {PREFIX + k: v for k, v in caps.items()}}}


def body(names: list[str], requested: dict[str, int]) -> bytes:
    annotations = {PREFIX + dc: str(v) for dc, v in requested.items()}
    pod = {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations}}
    return json.dumps({"Pod": pod, "NodeNames": names}).encode()


def reference(
    cache: NodeCache, ext: Extender, names: list[str], requested: dict[str, int]
) -> tuple[bytes, bytes]:
    """The /predicate and /prioritize replies, node by node."""
    view = cache.view()
    if view.unsynced is not None:
        why = unknown_reason(requested, view.unsynced)
        return (
            encode_filter_names([], dict.fromkeys(names, why)),
            encode_priorities([HostPriority(n, 0) for n in names]),
        )
    failed: dict[str, str] = {}
    scores = []
    for name in names:
        entry = view.get(name)
        if isinstance(entry, str):
            failed[name] = unknown_reason(requested, entry)
            scores.append(HostPriority(name, 0))
            continue
        reason = filter_reason(entry.lookup, requested, NORMAL)
        if reason is not None:
            failed[name] = reason
        scores.append(HostPriority(name, node_score(entry.lookup, requested, ext.divisor)))
    passing = [n for n in names if n not in failed]
    return encode_filter_names(passing, failed), encode_priorities(scores)


def random_node(r: random.Random, name: str) -> dict[str, Any]:
    caps = {}
    for dc in DEVICE_CLASSES:
        if r.random() < 0.75:
            caps[dc] = r.choice(VALUES) if r.random() > 0.08 else r.choice(("bad", "-5", " 1"))
    return node(name, **caps)


@pytest.mark.parametrize("seed", range(40))
def test_fast_path_replies_match_the_per_node_rules(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = random.Random(seed)
    monkeypatch.setattr(nodecache, "_BULK", r.choice((0, 2, 32)))
    monkeypatch.setattr(nodecache, "MAX_FRAGMENT_SETS", r.choice((1, 2, 16)))
    clock = Clock()
    config = parse_scheduler_config(
        r.choice(
            ("node-cache: true\n", "node-cache: true\ndefault-divisor: 0.5\ndivisors: {ssd: 4}\n")
        )
    )
    cache = NodeCache(NORMAL, max_age=100, clock=clock)
    cache.use_divisor(config.divisor)
    ext = Extender(config, cache, NORMAL)
    size = r.randint(0, 60)
    nodes = [random_node(r, f"n{i}") for i in range(size)]
    if r.random() < 0.9:
        cache.replace(nodes)
    for _ in range(25):
        action = r.random()
        if action < 0.3:
            clock.now += r.choice((0, 10, 60, 120))
            cache.upsert(random_node(r, f"n{r.randrange(size + 3)}"))
        elif action < 0.4 and nodes:
            clock.now += r.choice((0, 60, 120))
            cache.upsert(r.choice(nodes))  # unchanged capacities: only refreshes the entry
        elif action < 0.5:
            cache.delete(f"n{r.randrange(size + 1)}")
        elif action < 0.55:
            cache.mark_unsynced("watch broken")
        elif action < 0.6:
            cache.mark_synced()
        names = [f"n{r.randrange(size + 3)}" for _ in range(r.randint(0, size + 5))]
        if r.random() < 0.5:
            names = list(dict.fromkeys(names))
        chosen = r.sample(DEVICE_CLASSES, r.randint(1, 3))
        requested = {dc: r.choice((0, 1, GiB, 2 * GiB, 50 * GiB, 1 << 50)) for dc in sorted(chosen)}
        predicate, prioritize = reference(cache, ext, names, requested)
        assert ext.predicate(body(names, requested)) == predicate
        assert ext.prioritize(body(names, requested)) == prioritize


def test_capacity_order_finds_the_nodes_short_of_a_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for bulk in (0, 100):
        monkeypatch.setattr(nodecache, "_BULK", bulk)
        order = CapacityOrder()
        for name, value in (("c", 5), ("a", 5), ("bad", -1), ("z", 0), ("big", 1 << 64)):
            order.add(name, value)
        assert [n for _, n, _ in order.below(5)] == ["bad", "z"]
        order.remove("z", 0)
        order.add("d", 3)  # waits until the next below()
        order.remove("d", 3)
        order.add("e", 4)
        assert order.below(6) == [
            (-1, "bad", ""),
            (4, "e", "available 4 bytes"),
            (5, "a", "available 5 bytes"),
            (5, "c", "available 5 bytes"),
        ]
        assert len(order.below(1 << 65)) == 5
        assert order.below(0) == [(-1, "bad", "")]


def test_unchanged_upsert_refreshes_the_entry_only() -> None:
    clock = Clock()
    cache = NodeCache(NORMAL, max_age=100, clock=clock)
    cache.replace([node("a", ssd="5"), node("b", ssd="7")])
    fragments = cache._fragments(("ssd",))
    clock.now += 150
    assert cache.view().stale == {"a", "b"}
    assert cache.upsert(node("a", ssd="5"))
    assert cache.view().stale == {"b"}
    assert list(cache._entries) == ["b", "a"]  # oldest first
    assert cache._fragments(("ssd",)) is fragments


def test_priority_fragments_follow_updates() -> None:
    config = parse_scheduler_config("node-cache: true\n")
    cache = NodeCache(NORMAL)
    cache.replace([node("a", ssd=str(4 * GiB), hdd=str(1024 * GiB)), node("b", hdd="0")])
    ext = Extender(config, cache, NORMAL)
    names = ["a", "b", "c"]
    reply = ext.prioritize(body(names, {"hdd": 1, "ssd": 1}))
    assert json.loads(reply) == [
        {"Host": "a", "Score": 2},
        {"Host": "b", "Score": 0},
        {"Host": "c", "Score": 0},
    ]
    cache.upsert(node("b", hdd=str(16 * GiB)))
    cache.upsert(node("c", ssd=str(GiB)))
    cache.delete("a")
    reply = ext.prioritize(body(names, {"hdd": 1, "ssd": 1}))
    assert json.loads(reply) == [
        {"Host": "a", "Score": 0},
        {"Host": "b", "Score": 4},
        {"Host": "c", "Score": 1},
    ]
    cache.use_divisor(lambda _dc: 0.25)
    reply = ext.prioritize(body(names, {"hdd": 1, "ssd": 1}))
    assert [p["Score"] for p in json.loads(reply)] == [0, 6, 2]


def test_cache_keeps_its_own_copy_of_names() -> None:
    name = "".join(["node-", "1"])
    cache = NodeCache(NORMAL)
    cache.replace([node(name, ssd="5"), node("\ud800", ssd="1")])
    key = next(iter(cache._entries))
    assert key == name and key is not name
    assert cache.upsert(node(name, ssd="6"))  # the copy stays
    assert next(k for k in cache._caps["ssd"] if k == name) is key
    view = cache.view()
    passing, failed = view.filter(["\ud800", name], {"ssd": 2}, NORMAL)
    assert passing == [name] and list(failed) == ["\ud800"]

"""The transfer port's limits as rules (topolvm.transfer.gate, topolvm.transfer.turns;
docs/security.md): an address's new connection pushes out its own oldest; a full port pushes
out the oldest of an address holding the most (its own if the newcomer is one of them), ties
drawn at random, never a node's one connection; an address connects at its rate; what is
logged is logged once per key in a while; turns are handed out round robin by address, within
slots and a rate, and a waiter that gives up leaves no turn behind."""

from __future__ import annotations

import asyncio
import random

import pytest

from topolvm.transfer.gate import EVICTED, PEER_LIMIT, Buckets, Gate, Notes
from topolvm.transfer.turns import FairTurns


def test_an_address_pushes_out_its_own_oldest_and_a_full_port_the_largest_holders() -> None:
    gate: Gate[str] = Gate(3, 7, random.Random(1))
    for i in range(3):
        assert gate.admit("crowd", i, f"c{i}") == (None, "")
    assert gate.admit("crowd", 3, "c3") == ("c0", PEER_LIMIT)  # its own oldest, not the newest
    assert gate.admit("node", 10, "n") == (None, "")
    for i in range(3):
        assert gate.admit("other", 20 + i, f"o{i}") == (None, "")
    assert len(gate) == 7
    pushed = [gate.admit("late", 30 + i, f"l{i}") for i in range(2)]
    assert all(why == EVICTED for _, why in pushed)
    assert sorted(str(who)[0] for who, _ in pushed) == ["c", "o"]  # never the node's one
    assert gate.pending("node") == 1 and len(gate) == 7
    gate.release("node", 10)
    gate.release("node", 10)  # twice: nothing more
    assert gate.pending("node") == 0 and len(gate) == 6


def test_ties_among_the_largest_holders_are_drawn_at_random() -> None:
    """Who gives way is not predictable from the order of arrival."""
    losers = set()
    for seed in range(20):
        gate: Gate[str] = Gate(2, 4, random.Random(seed))
        for peer in ("a", "b"):
            for i in range(2):
                gate.admit(peer, hash((peer, i)), f"{peer}{i}")
        evicted, _ = gate.admit("c", 99, "c0")
        losers.add(evicted)
    assert losers == {"a0", "b0"}
    with pytest.raises(ValueError, match="per_peer"):
        Gate(4, 2)


def test_a_full_port_takes_the_newcomers_own_oldest_when_it_holds_as_many_as_any() -> None:
    """An address among the largest holders of a full port pushes out its own oldest, never
    another's (whatever the draw); one that holds fewer pushes out a largest holder's."""
    for seed in range(20):
        gate: Gate[str] = Gate(3, 4, random.Random(seed))
        for peer in ("a", "b"):
            for i in range(2):
                gate.admit(peer, hash((peer, i)), f"{peer}{i}")
        assert gate.admit("a", 7, "a2") == ("a0", EVICTED)
        assert gate.pending("a") == 2 and gate.pending("b") == 2
        evicted, why = gate.admit("b", 8, "b2")
        assert (evicted, why) == ("b0", EVICTED)
        gate.release("b", hash(("b", 1)))
        gate.admit("c", 9, "c0")  # 2, 1, 1: a holds the most
        assert gate.admit("b", 10, "b3") == ("a1", EVICTED)


def test_an_address_connects_at_its_rate_after_a_burst() -> None:
    buckets = Buckets(rate=2.0, burst=3, size=2)
    assert [buckets.take("a", 0.0) for _ in range(4)] == [True, True, True, False]
    assert buckets.take("b", 0.0)  # another address has its own
    assert not buckets.take("a", 0.4) and buckets.take("a", 0.6)  # one more in half a second
    assert buckets.take("c", 0.6)  # a third address: the bucket kept longest unused goes
    assert buckets.take("a", 5.0) and buckets.take("a", 5.0)


def test_a_note_is_due_once_per_key_in_its_window_and_the_keys_are_bounded() -> None:
    notes = Notes(30.0, size=3)
    assert notes.due(("a", "rate"), 0.0) and not notes.due(("a", "rate"), 29.0)
    assert notes.due(("a", "handshake"), 1.0) and notes.due(("a", "rate"), 30.5)
    for i in range(10):
        assert notes.due((f"b{i}", "rate"), 40.0)
    assert len(notes._until) <= 3


async def test_turns_go_round_robin_by_address_within_their_slots() -> None:
    turns = FairTurns(slots=1)
    await turns.take("flood")  # held
    order: list[str] = []

    async def one(who: str) -> None:
        await turns.take(who)
        order.append(who)
        await asyncio.sleep(0)
        turns.give_back()

    waiting = [asyncio.create_task(one("flood")) for _ in range(5)]
    await asyncio.sleep(0)
    waiting.append(asyncio.create_task(one("node")))
    await asyncio.sleep(0)
    turns.give_back()
    await asyncio.gather(*waiting)
    assert order.index("node") <= 1, order  # behind one of the flood's, not all five


async def test_a_waiter_that_gives_up_leaves_no_turn_behind_and_the_rate_holds() -> None:
    turns = FairTurns(slots=1)
    await turns.take("a")
    gone = asyncio.create_task(turns.take("b"))
    await asyncio.sleep(0)
    gone.cancel()
    turns.give_back()
    await asyncio.wait_for(turns.take("c"), 1)  # the slot is free again
    assert turns.waiting() == 0

    paced = FairTurns(rate=20, burst=2)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await asyncio.gather(*(paced.take(f"x{i % 3}") for i in range(8)))
    assert loop.time() - began >= (8 - 2) / 20 - 0.02

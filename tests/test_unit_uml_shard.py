"""How the real-LVM tier splits its tests over guests (tests/uml_tier.py ``shard``)."""

from __future__ import annotations

from tests.uml_tier import shard

IDS = [
    "tests/test_a.py::test_1",
    "tests/test_a.py::test_2",
    "tests/test_b.py::test_1",
    "tests/test_c.py::test_1",
    "tests/test_c.py::test_2",
    "tests/test_c.py::test_3",
]


def test_modules_stay_whole_and_in_their_order() -> None:
    shards = shard(IDS, 2)
    assert sorted(map(len, shards)) == [3, 3]
    assert [
        "tests/test_c.py::test_1",
        "tests/test_c.py::test_2",
        "tests/test_c.py::test_3",
    ] in shards
    assert [
        "tests/test_a.py::test_1",
        "tests/test_a.py::test_2",
        "tests/test_b.py::test_1",
    ] in shards


def test_one_guest_or_one_module_is_one_shard() -> None:
    assert shard(IDS, 1) == [IDS]
    one_module = IDS[3:]
    assert shard(one_module, 2) == [one_module]


def test_never_more_shards_than_modules() -> None:
    shards = shard(IDS, 8)
    assert len(shards) == 3
    assert sorted(n for s in shards for n in s) == sorted(IDS)

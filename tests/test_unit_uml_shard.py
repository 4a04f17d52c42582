"""How the real-LVM tier splits its tests over guests (tests/uml_tier.py ``shard``,
``guest_count``)."""

from __future__ import annotations

import pytest

from tests import uml_tier
from tests.uml_tier import guest_count, shard

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


def test_guests_default_to_one_per_core_at_most_two() -> None:
    assert guest_count(None, 1) == 1
    assert guest_count(None, None) == 1
    assert guest_count("", 8) == 2
    assert guest_count("3", 2) == 3


@pytest.mark.parametrize("setting", ["two", "0", "-1", "1.5"])
def test_a_bad_guest_setting_is_named(setting: str) -> None:
    with pytest.raises(ValueError, match="TOPOLVM_UML_GUESTS must be a whole number") as e:
        guest_count(setting, 2)
    assert repr(setting) in str(e.value)


def test_a_proxy_names_its_guests_share_and_nothing_else_does() -> None:
    """make test's scheduler sends a share whole to one worker, any other test by module."""
    from tests.xdist_scheduling import unit_of as split

    assert uml_tier.share_of("tests/test_lvmd_cli.py::test_x[a]@uml-1") == "uml-1"
    assert split("tests/test_lvmd_cli.py::test_x[a]@uml-1") == "uml-1"
    assert split("tests/test_cluster_e2e.py::test_y[b@uml-x]") == "tests/test_cluster_e2e.py"
    assert uml_tier.share_of("tests/test_unit_k8s.py::test_z[user@uml-]") is None

"""IO limits from a VolumeAttributesClass's parameters (src/topolvm/iolimits.py): the keys and
their OpenEBS aliases, refusals that name the key, scaling per GiB, the spec and io.max forms."""

from __future__ import annotations

import pytest

from topolvm import iolimits
from topolvm.iolimits import GiB, InvalidLimits, IoLimits, Limit, io_max_line, parse

MiB = 1 << 20


def test_each_key_sets_its_limits() -> None:
    got = parse({"topolvm.io/write-bytes-per-second": "20Mi", "topolvm.io/iops": "1000"})
    assert got.at(10 * GiB) == {"rbps": None, "wbps": 20 * MiB, "riops": 1000, "wiops": 1000}
    assert parse({}).none and parse({"topolvm.io/iops": "max"}).none


def test_one_direction_refines_both() -> None:
    got = parse({"topolvm.io/iops": "1000", "topolvm.io/read-iops": "max",
                 "topolvm.io/bytes-per-second": "10Mi",
                 "topolvm.io/read-bytes-per-second": "30Mi"})  # fmt: skip
    assert got.at(GiB) == {"rbps": 30 * MiB, "wbps": 10 * MiB, "riops": None, "wiops": 1000}


def test_openebs_names_carry_over() -> None:
    ours = parse({"topolvm.io/read-iops": "500", "topolvm.io/write-bytes-per-second": "7000Mi"})
    theirs = parse({"qosIopsReadLimit": "500", "qosBandwithWritePerSec": "7000Mi"})
    assert theirs == ours
    assert set(iolimits.ALIASES.values()) <= set(iolimits.KEYS)


def test_per_gib_limits_scale_with_the_volume_and_never_reach_zero() -> None:
    got = parse(
        {"topolvm.io/write-iops-per-gib": "10", "topolvm.io/read-bytes-per-second-per-gib": "1Mi"}
    )
    assert got.at(4 * GiB)["wiops"] == 40
    assert got.at(6 * GiB)["wiops"] == 60  # after an expansion from 4 GiB
    assert got.at(4 * GiB)["rbps"] == 4 * MiB
    assert got.at(100 * MiB)["wiops"] == 2  # 0 would be no IO at all, and io.max refuses 1
    assert Limit(10, per_gib=True).at(GiB + 1) == 11


@pytest.mark.parametrize(("params", "key", "words"), [
    ({"topolvm.io/iops": "0"}, "topolvm.io/iops", "whole quantity"),
    ({"topolvm.io/iops": "-5"}, "topolvm.io/iops", "whole quantity"),
    ({"topolvm.io/iops": "fast"}, "topolvm.io/iops", "whole quantity"),
    ({"topolvm.io/iops": "500m"}, "topolvm.io/iops", "whole quantity"),
    ({"topolvm.io/iops": "1.5"}, "topolvm.io/iops", "whole quantity"),
    ({"topolvm.io/iops": "1"}, "topolvm.io/iops", "at least 2"),
    ({"topolvm.io/iops": ""}, "topolvm.io/iops", "whole quantity"),
    ({"topolvm.io/read-ops": "5"}, "topolvm.io/read-ops", "not an IO limit key"),
    ({"qosIopsReadLimit": "5", "topolvm.io/read-iops": "6"}, "topolvm.io/read-iops",
     "sets readIOPS"),
    ({"topolvm.io/iops": "5", "topolvm.io/iops-per-gib": "2"}, "topolvm.io/iops-per-gib", "sets"),
])  # fmt: skip
def test_a_bad_parameter_is_refused_naming_its_key(
    params: dict[str, str], key: str, words: str
) -> None:
    with pytest.raises(InvalidLimits) as e:
        parse(params)
    assert e.value.key == key and words in str(e.value), str(e.value)
    assert str(e.value).startswith(f"{key}: ")


def test_the_spec_keeps_what_was_asked() -> None:
    got = parse({"topolvm.io/write-iops-per-gib": "10", "topolvm.io/read-bytes-per-second": "1Gi"})
    spec = got.to_spec()
    assert spec == {"readBytesPerSecond": GiB, "writeIOPSPerGiB": 10}
    assert IoLimits.from_spec(spec) == got
    assert IoLimits.from_spec(None).none


@pytest.mark.parametrize("spec", [
    {"readIops": 5}, {"readIOPS": 0}, {"readIOPS": 1}, {"readIOPS": "5"}, {"readIOPS": True},
    {"readIOPS": 5, "readIOPSPerGiB": 1},
])  # fmt: skip
def test_a_spec_written_by_hand_is_checked(spec: dict[str, object]) -> None:
    with pytest.raises(InvalidLimits):
        IoLimits.from_spec(spec)


def test_the_io_max_line_names_every_key_and_any_minor() -> None:
    got = parse({"topolvm.io/write-bytes-per-second": "20Mi"})
    # device-mapper minors pass 255: the number is written whole, never split as rdev // 256
    assert (
        io_max_line(253, 300, got, GiB) == f"253:300 rbps=max wbps={20 * MiB} riops=max wiops=max"
    )
    assert io_max_line(253, 0, IoLimits(), GiB) == "253:0 rbps=max wbps=max riops=max wiops=max"


def test_a_new_class_changes_what_it_names_and_max_lifts() -> None:
    """CSI: a key a class does not name changes nothing; max lifts a limit."""
    old = parse({"topolvm.io/write-bytes-per-second": "20Mi", "topolvm.io/read-iops": "100"})
    new = iolimits.parse_change({"topolvm.io/write-bytes-per-second": "50Mi",
                                 "topolvm.io/read-iops": "max"}).applied_to(old)  # fmt: skip
    assert new.at(GiB) == {"rbps": None, "wbps": 50 * MiB, "riops": None, "wiops": None}
    kept = iolimits.parse_change({"topolvm.io/iops": "300"}).applied_to(old)
    assert kept.at(GiB) == {"rbps": None, "wbps": 20 * MiB, "riops": 300, "wiops": 300}
    # per GiB replaces the plain limit of the same field, and the other way round
    per_gib = iolimits.parse_change({"topolvm.io/write-bytes-per-second-per-gib": "5Mi"})
    assert per_gib.applied_to(old).to_spec() == {
        "readIOPS": 100,
        "writeBytesPerSecondPerGiB": 5 * MiB,
    }
    assert iolimits.parse_change({}).applied_to(old) == old


def test_a_limit_past_what_io_max_takes_is_no_limit() -> None:
    huge = parse({"topolvm.io/bytes-per-second-per-gib": str(2**62),
                  "topolvm.io/iops-per-gib": str(2**31)})  # fmt: skip
    assert huge.at(GiB) == {"rbps": 2**62, "wbps": 2**62, "riops": 2**31, "wiops": 2**31}
    assert huge.at(4 * GiB) == dict.fromkeys(("rbps", "wbps", "riops", "wiops"))

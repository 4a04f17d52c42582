"""The chart tests' check that no container was refused by the API server
(devtools/testbed/chart.py): an HTTP 403 or the word, not the digits of a duration."""

from __future__ import annotations

import pytest

from devtools.testbed.chart import forbidden_lines


@pytest.mark.parametrize(
    "line",
    ['E1129 reflector.go: pods is forbidden: User "x" cannot list', '"code": 403,',
     "status 403 Forbidden", "the API server answered 403."],
)  # fmt: skip
def test_a_refusal_is_found(line: str) -> None:
    assert forbidden_lines(f"ok\n{line}\nok") == [line]


@pytest.mark.parametrize(
    "line", ['{"rpc": "DeleteVolume", "code": "OK", "secs": 0.403}', "size 14030 bytes", "v1.403.2"]
)
def test_a_number_with_403_in_it_is_not(line: str) -> None:
    assert forbidden_lines(line) == []

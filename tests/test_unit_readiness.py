"""The readiness round behind CSI Probe and /healthz: a throttled or briefly failing API server
does not turn the plugin unhealthy (a liveness probe would restart it); a real failure does, and
says what failed."""

from __future__ import annotations

from topolvm.csi.identity import Check, ReadinessChecker
from topolvm.k8s import errors


def scripted(*outcomes: BaseException | None) -> tuple[list[int], Check]:
    calls: list[int] = []

    async def check() -> None:
        outcome = outcomes[min(len(calls), len(outcomes) - 1)]
        calls.append(1)
        if outcome is not None:
            raise outcome

    return calls, check


def throttled() -> errors.StatusError:
    return errors.TooManyRequests(429, "TooManyRequests", "Too many requests, please try again")


async def test_throttling_and_server_errors_are_retried_within_the_round() -> None:
    calls, check = scripted(
        throttled(), errors.ServerError(500, "InternalError", "etcdserver: leader changed"), None
    )
    checker = ReadinessChecker([check], timeout=5)
    await checker.check_once()
    assert (checker.ready, checker.error, len(calls)) == (True, None, 3)
    assert checker.status() == (True, "ok")


async def test_a_lasting_throttle_fails_the_round_and_names_the_last_error() -> None:
    calls, check = scripted(throttled())
    checker = ReadinessChecker([check], timeout=0.5)
    await checker.check_once()
    ready, why = checker.status()
    assert not ready and len(calls) >= 2
    assert "timed out after 0.5s" in why and "429" in why and "Too many requests" in why


async def test_a_permanent_error_fails_at_once_without_retrying() -> None:
    calls, check = scripted(errors.Forbidden(403, "Forbidden", "cannot get csidrivers"))
    checker = ReadinessChecker([check], timeout=5)
    await checker.check_once()
    ready, why = checker.status()
    assert (ready, len(calls)) == (False, 1)
    assert "cannot get csidrivers" in why


async def test_a_passed_check_is_not_run_again_when_a_later_one_retries() -> None:
    first, check_a = scripted(None)
    second, check_b = scripted(throttled(), None)
    checker = ReadinessChecker([check_a, check_b], timeout=5)
    await checker.check_once()
    assert (checker.ready, len(first), len(second)) == (True, 1, 2)

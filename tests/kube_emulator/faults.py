"""Injected failures: the next matching requests answer with a Status and change nothing, or
are served late (a delay: a request that a later one overtakes)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.kube_emulator.errors import ApiFailure, conflict, details_of
from tests.kube_emulator.objects import ResourceType


@dataclass
class Fault:
    method: str | None
    plural: str
    name: str | None
    subresource: str | None
    code: int
    reason: str | None
    message: str | None
    times: int
    delay: float = 0.0  # served after this many seconds instead of failing


class Faults:
    """The injected failures not served yet (see :meth:`KubeEmulator.inject`)."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []

    def add(self, fault: Fault) -> None:
        self._faults.append(fault)

    @property
    def pending(self) -> int:
        """How many injected failures have not been served yet."""
        return sum(f.times for f in self._faults)

    def check(
        self, rtype: ResourceType, method: str, name: str | None, sub: str | None, watch: bool
    ) -> float:
        """Raise the first injected failure that matches this request, if any; or return
        the seconds an injected delay holds it (0 without one)."""
        verbs = {method}
        if method == "GET" and name is None:
            verbs.add("WATCH" if watch else "LIST")
        for fault in self._faults:
            if fault.times <= 0 or fault.plural != rtype.plural:
                continue
            if fault.method is not None and fault.method not in verbs:
                continue
            if fault.name is not None and fault.name != name:
                continue
            if fault.subresource not in ("*", sub):
                continue
            fault.times -= 1
            self._faults = [f for f in self._faults if f.times > 0]
            if fault.delay:
                return fault.delay
            if fault.code == 409 and fault.reason in (None, "Conflict") and fault.message is None:
                raise conflict(rtype, name or "")
            raise ApiFailure(
                fault.code,
                fault.message or f"injected failure ({fault.code})",
                fault.reason,
                details_of(rtype, name),
            )
        self._faults = [f for f in self._faults if f.times > 0]
        return 0.0

"""How ``make test``'s two pytest-xdist workers share the run (tests/conftest.py asks for it).

A unit of work is a module, so a module's test bed (its fixtures of module scope: UML nodes, a
control plane's objects) is made once, on one worker; the real-LVM tier's proxies go by guest's
share instead (tests/uml_tier.py), one share per worker, so that both guests boot at the start.
Units go out in the order the workers collected them (tests/conftest.py puts the long ones
first), a new one to a worker as it runs out. xdist's own ``loadgroup`` would do this from
marks, but it names the groups by rewriting an item's node id, which pytest 9.2 ignores."""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

from tests import uml_tier


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its guest's share, or its module."""
    return uml_tier.share_of(nodeid) or nodeid.split("::", 1)[0]


class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist has no types
    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def schedule(self) -> None:
        # The collection's order, not xdist's largest-unit-first: a module of many quick tests
        # is not a long unit, a module of one chaos campaign is.
        self.config.option.loadscopereorder = False
        super().schedule()

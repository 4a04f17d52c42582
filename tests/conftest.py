"""Shared fixtures. Tests marked ``uml`` run inside User-Mode Linux (see tests/uml_tier.py)."""

from __future__ import annotations

import pytest

from tests import uml_tier
from tests.lvm_fixtures import *  # noqa: F403  (fixtures for the real-LVM tier)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    if not uml_tier.IN_UML:
        uml_tier.proxy_items(items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if uml_tier.IN_UML:
        uml_tier.record(report)

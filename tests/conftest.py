"""Shared fixtures. Tests marked ``uml`` run inside User-Mode Linux (see tests/uml_tier.py)."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
from collections.abc import Iterator

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


@pytest.fixture(autouse=True)
def _hang_report() -> Iterator[None]:
    """If a test (with its teardown) runs for over 3 minutes, print every pending asyncio task's
    stack, so a hang inside UML says where it is instead of only timing out the whole run."""
    timer = threading.Timer(180, _dump_tasks)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _dump_tasks() -> None:
    out = sys.__stderr__
    tasks = [o for o in gc.get_objects() if isinstance(o, asyncio.Task) and not o.done()]
    print(f"\n=== test running for over 180 s; {len(tasks)} pending asyncio tasks ===", file=out)
    for task in tasks:
        print(repr(task), file=out)
        task.print_stack(file=out)
    if uml_tier.IN_UML:  # a suspended device-mapper table hangs every LVM command and I/O
        try:
            dm = subprocess.run(
                ["dmsetup", "info", "-c"], check=False, capture_output=True, text=True, timeout=10
            )
            print(dm.stdout + dm.stderr, file=out)
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"dmsetup info: {e}", file=out)
    if out is not None:
        out.flush()

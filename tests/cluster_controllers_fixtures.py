"""Fixtures for tests/test_cluster_controllers_*.py: the reconcilers' test bed (a namespace, the
objects a test makes, their clients) with the session's topolvm-controller stopped meanwhile."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from lightkube import AsyncClient

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from tests.cluster_controllers_helpers import Bed, rules
from tests.cluster_fixtures import session_controller_paused


@pytest.fixture(scope="module")
def no_other_reconcilers(driver: DriverStack) -> Iterator[None]:
    """The session's topolvm-controller runs the same reconcilers (with other flags) on the
    same cluster: stop it while this module's reconcilers are under test."""
    with session_controller_paused():
        yield


@pytest.fixture
async def bed(
    control_plane: ControlPlane,
    cluster_client: AsyncClient,
    tmp_path: Path,
    no_other_reconcilers: None,
) -> AsyncIterator[Bed]:
    b = Bed(control_plane, cluster_client, tmp_path)
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture
async def client(bed: Bed) -> AsyncClient:
    """The reconcilers' client: a service account with the documented ClusterRole."""
    return bed.sa_client(rules())

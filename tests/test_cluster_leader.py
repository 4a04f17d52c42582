"""Lease leader election against the real kube-apiserver: one leader among two electors, the
Lease as the server stores it, and a takeover after the leader releases. (Conflicts and request
counts are tested against the emulator in tests/test_k8s_leader.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from lightkube import AsyncClient
from lightkube.resources.coordination_v1 import Lease

from devtools.testbed.controlplane import ControlPlane
from tests.cluster_fixtures import unique
from tests.leader_helpers import MICRO, Work, first_leader, stop
from topolvm.k8s import api
from topolvm.k8s.api import make_client
from topolvm.k8s.leader import LeaderElector

pytestmark = pytest.mark.cluster
NS = "kube-system"


@pytest.fixture
async def second_client(control_plane: ControlPlane) -> AsyncIterator[AsyncClient]:
    client = make_client(str(control_plane.kubeconfig))
    try:
        yield client
    finally:
        await client.close()


def elector(client: AsyncClient, lease: str, identity: str) -> LeaderElector:
    return LeaderElector(
        client, name=lease, namespace=NS, identity=identity,
        lease_duration=2.0, renew_deadline=1.5, retry_period=0.2,
    )  # fmt: skip


async def test_one_leader_then_takeover_after_release(
    cluster_client: AsyncClient, second_client: AsyncClient
) -> None:
    lease = unique("topolvm-controller")
    work = Work()
    ea, eb = elector(cluster_client, lease, "a"), elector(second_client, lease, "b")
    tasks = {
        "a": asyncio.create_task(ea.run(work.callback("a"))),
        "b": asyncio.create_task(eb.run(work.callback("b"))),
    }
    try:
        leader = await first_leader(work, "a", "b")
        other = "b" if leader == "a" else "a"
        await asyncio.sleep(1.0)  # several renew periods: the other must not lead meanwhile
        assert work.active == {leader} and work.max_active == 1
        stored = await api.get(cluster_client, Lease, lease, namespace=NS)
        assert stored is not None
        spec = stored["spec"]
        assert spec["holderIdentity"] == leader and spec["leaseDurationSeconds"] == 2
        assert MICRO.match(spec["renewTime"]) and MICRO.match(spec["acquireTime"])

        await stop(tasks[leader])  # cancelling run() releases the Lease
        await asyncio.wait_for(work.started[other].wait(), 10)
        assert work.max_active == 1
        after = await api.get(cluster_client, Lease, lease, namespace=NS)
        assert after is not None and after["spec"]["holderIdentity"] == other
        assert after["spec"]["leaseTransitions"] == spec.get("leaseTransitions", 0) + 1
    finally:
        await stop(*tasks.values())

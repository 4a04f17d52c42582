"""Lease-based leader election against the Kubernetes API emulator."""

# ruff: noqa: F811  (pytest fixtures imported from tests.kube_fixtures are parameters here)

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import pytest
from lightkube import AsyncClient

from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import client_for, kube, kube_client  # noqa: F401
from tests.leader_helpers import MICRO, Work, first_leader, stop
from topolvm.k8s.leader import LeaderElector, LeadershipLost

NS, LEASE = "kube-system", "topolvm-controller"


def elector(client: AsyncClient, identity: str) -> LeaderElector:
    return LeaderElector(
        client,
        name=LEASE,
        namespace=NS,
        identity=identity,
        lease_duration=0.5,
        renew_deadline=0.3,
        retry_period=0.1,
    )


@pytest.fixture
async def second_client(kube: KubeEmulator) -> AsyncIterator[AsyncClient]:
    client = client_for(kube)
    try:
        yield client
    finally:
        await client.close()


async def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


def lease_writes(kube: KubeEmulator) -> int:
    return sum(
        r.method in ("PUT", "POST") and "/leases" in r.path and not r.path.endswith("/status")
        for r in kube.requests
    )


async def test_only_one_leads_and_lease_looks_like_kubernetes(
    kube: KubeEmulator, kube_client: AsyncClient, second_client: AsyncClient
) -> None:
    work = Work()
    ea, eb = elector(kube_client, "a"), elector(second_client, "b")
    ta = asyncio.create_task(ea.run(work.callback("a")))
    tb = asyncio.create_task(eb.run(work.callback("b")))
    try:
        leader = await first_leader(work, "a", "b")
        le, follower = (ea, eb) if leader == "a" else (eb, ea)
        writes = lease_writes(kube)
        await wait_for(lambda: lease_writes(kube) >= writes + 5)  # several renewals later
        assert le.is_leader and not follower.is_leader
        assert work.active == {leader} and work.max_active == 1

        lease = kube.get("leases", LEASE, NS)
        assert lease is not None
        assert lease["apiVersion"] == "coordination.k8s.io/v1" and lease["kind"] == "Lease"
        spec = lease["spec"]
        assert spec["holderIdentity"] == leader
        assert spec["leaseDurationSeconds"] == 1 and spec["leaseTransitions"] == 0
        assert MICRO.match(spec["acquireTime"]) and MICRO.match(spec["renewTime"])
        assert spec["renewTime"] > spec["acquireTime"]
        assert set(spec) == {
            "holderIdentity",
            "leaseDurationSeconds",
            "acquireTime",
            "renewTime",
            "leaseTransitions",
        }
    finally:
        await stop(ta, tb)
    assert work.max_active == 1


async def test_takeover_after_release(
    kube: KubeEmulator, kube_client: AsyncClient, second_client: AsyncClient
) -> None:
    work = Work()
    electors = {"a": elector(kube_client, "a"), "b": elector(second_client, "b")}
    tasks = {k: asyncio.create_task(e.run(work.callback(k))) for k, e in electors.items()}
    try:
        leader = await first_leader(work, "a", "b")
        other = "b" if leader == "a" else "a"
        acquired = kube.get("leases", LEASE, NS)
        assert acquired is not None

        await electors[leader].release()
        await asyncio.wait_for(tasks[leader], 5)  # run() returned normally
        assert work.cancelled[leader].is_set() and not electors[leader].is_leader

        await asyncio.wait_for(work.started[other].wait(), 5)
        assert electors[other].is_leader and work.max_active == 1
        spec = (kube.get("leases", LEASE, NS) or {})["spec"]
        assert spec["holderIdentity"] == other and spec["leaseTransitions"] == 1
        assert spec["acquireTime"] > acquired["spec"]["acquireTime"]
        # The release wrote an empty holder with a 1 s duration first.
        released = [
            r.body["spec"]
            for r in kube.requests
            if r.method == "PUT" and isinstance(r.body, dict) and "/leases/" in r.path
        ]
        assert any(s["holderIdentity"] == "" and s["leaseDurationSeconds"] == 1 for s in released)
    finally:
        await stop(*tasks.values())


async def test_cancelling_run_releases(
    kube: KubeEmulator, kube_client: AsyncClient, second_client: AsyncClient
) -> None:
    work = Work()
    ea = elector(kube_client, "a")
    ta = asyncio.create_task(ea.run(work.callback("a")))
    await asyncio.wait_for(work.started["a"].wait(), 5)
    await stop(ta)
    assert work.cancelled["a"].is_set() and not ea.is_leader
    spec = (kube.get("leases", LEASE, NS) or {})["spec"]
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1

    eb = elector(second_client, "b")  # a fresh replica need not wait for any expiry
    tb = asyncio.create_task(eb.run(work.callback("b")))
    try:
        await asyncio.wait_for(work.started["b"].wait(), 5)
        assert (kube.get("leases", LEASE, NS) or {})["spec"]["leaseTransitions"] == 1
    finally:
        await stop(tb)


async def test_takeover_after_leader_stops_renewing(
    kube: KubeEmulator, kube_client: AsyncClient
) -> None:
    work = Work()
    doomed = client_for(kube)
    ea = elector(doomed, "a")
    ta = asyncio.create_task(ea.run(work.callback("a")))
    await asyncio.wait_for(work.started["a"].wait(), 5)
    eb = elector(kube_client, "b")
    tb = asyncio.create_task(eb.run(work.callback("b")))
    try:
        writes = lease_writes(kube)
        await wait_for(lambda: lease_writes(kube) >= writes + 3)
        assert not eb.is_leader
        await doomed.close()  # "a" is cut off from the API server: its renewals fail
        with pytest.raises(LeadershipLost):
            await asyncio.wait_for(ta, 5)
        assert work.cancelled["a"].is_set() and not ea.is_leader
        await asyncio.wait_for(work.started["b"].wait(), 10)
        assert eb.is_leader and work.max_active == 1
        spec = (kube.get("leases", LEASE, NS) or {})["spec"]
        assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    finally:
        await stop(ta, tb)
        await doomed.close()


async def test_conflict_during_renew_does_not_make_two_leaders(
    kube: KubeEmulator, kube_client: AsyncClient, second_client: AsyncClient
) -> None:
    work = Work()
    ea, eb = elector(kube_client, "a"), elector(second_client, "b")
    ta = asyncio.create_task(ea.run(work.callback("a")))
    await asyncio.wait_for(work.started["a"].wait(), 5)
    tb = asyncio.create_task(eb.run(work.callback("b")))
    try:
        kube.inject("PUT", "leases", name=LEASE)  # the leader's next renewal gets a 409
        await wait_for(lambda: kube.pending_faults == 0)
        writes = lease_writes(kube)
        await wait_for(lambda: lease_writes(kube) >= writes + 5)  # renewing again
        assert ea.is_leader and not eb.is_leader
        assert not work.started["b"].is_set() and work.max_active == 1
        assert not ta.done()
        spec = (kube.get("leases", LEASE, NS) or {})["spec"]
        assert spec["holderIdentity"] == "a" and spec["leaseTransitions"] == 0
    finally:
        await stop(ta, tb)


async def test_conflicting_writer_wins_and_leader_steps_down(
    kube: KubeEmulator, kube_client: AsyncClient
) -> None:
    work = Work()
    ea = elector(kube_client, "a")
    ta = asyncio.create_task(ea.run(work.callback("a")))
    await asyncio.wait_for(work.started["a"].wait(), 5)
    lease = kube.get("leases", LEASE, NS)
    assert lease is not None
    lease["spec"]["holderIdentity"] = "intruder"  # someone else wrote the lease
    await kube.put(lease)
    with pytest.raises(LeadershipLost, match="intruder"):
        await asyncio.wait_for(ta, 5)
    assert work.cancelled["a"].is_set() and not ea.is_leader
    assert (kube.get("leases", LEASE, NS) or {})["spec"]["holderIdentity"] == "intruder"


async def test_expiry_is_judged_by_the_local_clock(
    kube: KubeEmulator, kube_client: AsyncClient
) -> None:
    # A holder whose renewTime is an hour ahead (clock skew) and that never renews again.
    future = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    kube.create(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": LEASE, "namespace": NS},
            "spec": {
                "holderIdentity": "skewed",
                "leaseDurationSeconds": 1,
                "acquireTime": future,
                "renewTime": future,
                "leaseTransitions": 3,
            },
        }
    )
    work = Work()
    eb = elector(kube_client, "b")
    tb = asyncio.create_task(eb.run(work.callback("b")))
    try:
        writes = lease_writes(kube)
        await wait_for(lambda: sum(r.method == "GET" for r in kube.requests) >= 3)
        assert lease_writes(kube) == writes and not eb.is_leader  # still valid at first
        await asyncio.wait_for(work.started["b"].wait(), 10)
        spec = (kube.get("leases", LEASE, NS) or {})["spec"]
        assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 4
    finally:
        await stop(tb)


async def test_callback_failure_releases_and_propagates(kube: KubeEmulator) -> None:
    client = client_for(kube)
    try:
        e = elector(client, "a")

        async def boom() -> None:
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            await e.run(boom)
        assert not e.is_leader
        assert (kube.get("leases", LEASE, NS) or {})["spec"]["holderIdentity"] == ""
    finally:
        await client.close()


def test_durations_are_checked() -> None:
    with pytest.raises(ValueError):
        LeaderElector(
            AsyncClient.__new__(AsyncClient),
            name="x",
            namespace="y",
            identity="z",
            lease_duration=1,
            renew_deadline=2,
        )

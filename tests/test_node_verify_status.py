"""The verification's status as topolvm-node reports a wait (node/verify.py), against the API
emulator: a job that wrote Cut and then waits on an error (lvmd restarting mid-read, say) keeps
Cut in the status while it says why it waits. Read back as Pending, its next try would cut the
volume again, after the moved pod may have written: a spurious Unverified move."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from lightkube import AsyncClient

from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import kube, kube_client  # noqa: F401
from topolvm.constants import NORMAL
from topolvm.k8s import api
from topolvm.k8s.lvobject import LogicalVolumeObject
from topolvm.node.lvmd_client import SocketLvmd
from topolvm.node.verify import VerifyJobs

RES = api.logicalvolume_resource(NORMAL)


@pytest.fixture
async def jobs(kube_client: AsyncClient) -> AsyncIterator[VerifyJobs]:  # noqa: F811
    lvmd = SocketLvmd("/nonexistent/lvmd.sock")  # a wait's report asks lvmd nothing
    j = VerifyJobs(kube_client, NORMAL, "node1", lvmd)
    try:
        yield j
    finally:
        await j.stop()
        await lvmd.close()


async def _volume(client: AsyncClient, verify: dict[str, Any] | None) -> LogicalVolumeObject:
    """A LogicalVolume asked for verification v2, with ``verify`` as its status; the object
    as the job read it before it wrote that status (no status.verify)."""
    obj = {"apiVersion": f"{NORMAL.group}/v1", "kind": "LogicalVolume",
           "metadata": {"name": "vol"},
           "spec": {"name": "vol", "nodeName": "node1", "size": "1Gi",
                    "verify": {"id": "v2", "sizeBytes": 1 << 30}}}  # fmt: skip
    created = await api.create(client, RES.from_dict(obj))
    before = LogicalVolumeObject.from_dict(created)
    if verify is not None:
        await api.patch_merge(client, RES.Status, "vol", {"status": {"verify": verify}})
    return before


def _status(kube: KubeEmulator) -> dict[str, Any]:  # noqa: F811
    obj = kube.get("logicalvolumes", "vol", group=NORMAL.group) or {}
    return dict((obj.get("status") or {}).get("verify") or {})


async def test_a_wait_after_the_cut_keeps_the_cut(
    kube: KubeEmulator,  # noqa: F811
    kube_client: AsyncClient,  # noqa: F811
    jobs: VerifyJobs,
) -> None:
    cut = {"id": "v2", "phase": "Cut", "message": "cut made; reading it",
           "cutTime": "2026-11-29T04:00:00Z"}  # fmt: skip
    stale = await _volume(kube_client, cut)
    await jobs._waiting(stale, "waiting: lvmd unavailable; next try in 2s")
    st = _status(kube)
    assert st["phase"] == "Cut" and st["id"] == "v2", st
    assert st["cutTime"] == "2026-11-29T04:00:00Z"
    assert st["message"] == "waiting: lvmd unavailable; next try in 2s"


@pytest.mark.parametrize(
    "verify",
    [None, {"id": "v1", "phase": "Done", "digest": "ab", "completionTime": "2026-11-28T00:00:00Z"}],
)
async def test_a_wait_before_the_cut_says_pending_for_the_id_asked(
    kube: KubeEmulator,  # noqa: F811
    kube_client: AsyncClient,  # noqa: F811
    jobs: VerifyJobs,
    verify: dict[str, Any] | None,
) -> None:
    """No status yet, or an earlier verification's: Pending for v2, never the earlier Done."""
    stale = await _volume(kube_client, verify)
    await jobs._waiting(stale, "waiting: lvmd unavailable; next try in 2s")
    st = _status(kube)
    assert st["id"] == "v2" and st["phase"] == "Pending", st
    assert "digest" not in st or not st["digest"], st


async def test_a_wait_after_the_answer_leaves_the_answer(
    kube: KubeEmulator,  # noqa: F811
    kube_client: AsyncClient,  # noqa: F811
    jobs: VerifyJobs,
) -> None:
    done = {"id": "v2", "phase": "Done", "digest": "ab12", "sizeBytes": 1 << 30,
            "completionTime": "2026-11-29T04:00:00Z"}  # fmt: skip
    stale = await _volume(kube_client, done)
    await jobs._waiting(stale, "waiting: lvmd unavailable; next try in 2s")
    st = _status(kube)
    assert st["phase"] == "Done" and st["digest"] == "ab12", st

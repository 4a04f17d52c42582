"""A copy's reports reach status in the order they happened, however the API server orders
concurrent requests (issue 42: a move's final copy of a few MiB ended within milliseconds of
its ACCEPT; the late "copying" patch landed after Done, the move never saw its final copy end,
and rolled back 7 minutes later). The API emulator serves the first status patch late, as a
busy API server may."""

from __future__ import annotations

import asyncio
import threading

from lightkube import AsyncClient
from prometheus_client import CollectorRegistry

from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import kube, kube_client  # noqa: F401
from topolvm.constants import names
from topolvm.k8s import api
from topolvm.k8s.lvobject import CopyPhase, CopyStatus
from topolvm.node.copyreport import CopyReporter, Run
from topolvm.transfer import messages
from topolvm.transfer.metrics import TransferMetrics

NAMES = names(legacy=False)


async def _target(client: AsyncClient) -> Run:
    res = api.logicalvolume_resource(NAMES)
    obj = {
        "apiVersion": f"{NAMES.group}/v1",
        "kind": "LogicalVolume",
        "metadata": {"name": "final"},
        "spec": {"name": "final", "nodeName": "n2", "size": "8Mi", "source": "origin"},
    }
    await client.create(res.from_dict(obj))
    reporter = CopyReporter(client, NAMES, "n2", TransferMetrics(CollectorRegistry(), "n2"))
    lv = await reporter.read("final")
    assert lv is not None
    status = CopyStatus(round=2, phase=CopyPhase.COPYING, source_node="n1", attempts=1)
    await reporter.write(lv, status)
    return Run(lv, status, 0.0, 0)


async def test_a_copy_that_ends_at_once_reads_done_even_when_its_start_report_is_slow(
    kube: KubeEmulator,  # noqa: F811
    kube_client: AsyncClient,  # noqa: F811
) -> None:
    run = await _target(kube_client)
    reporter = CopyReporter(kube_client, NAMES, "n2", TransferMetrics(CollectorRegistry(), "n2"))
    # the API server takes 1 s over the next status patch: the ACCEPT's "copying" report
    kube.inject("PATCH", "logicalvolumes", name="final", subresource="status", delay=1.0)
    loop = asyncio.get_running_loop()
    accept = messages.Accept(size=8 << 20, offset=0, source_id="s" * 32, source="node n1")
    # the worker thread hears ACCEPT and, milliseconds later, END
    thread = threading.Thread(target=reporter.accepted_soon, args=(run, accept, loop))
    thread.start()
    await asyncio.to_thread(thread.join)
    await reporter.done(run, b"\x01" * 32, "node n1")

    await asyncio.sleep(1.5)  # past the slow patch, whatever order it was served in
    lv = await reporter.read("final")
    assert lv is not None and lv.copy is not None
    assert lv.copy.phase == CopyPhase.DONE, lv.copy
    assert lv.copy.digest == "01" * 32
    assert lv.copy.total_bytes == 8 << 20  # what ACCEPT said is kept, not lost
    assert kube.pending_faults == 0

"""topolvm-node's capacity exporter: what each lvmd Watch message costs the API server, and what
it does with a Node that is gone or being deleted (API emulator; no lvmd is dialled, the tests
hand ``publish`` the messages lvmd would send). Its effect on kube-scheduler is tested against
the real control plane in tests/test_cluster_marker.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node
from prometheus_client import CollectorRegistry

from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import kube, kube_client  # noqa: F401
from topolvm.constants import NORMAL
from topolvm.node.exporter import CapacityExporter, NodeMetrics
from topolvm.node.extresource import ADVERTISED_COUNT
from topolvm.node.lvmd_client import SocketLvmd
from topolvm.proto import lvmd_pb2 as pb

GiB = 1 << 30
NODE = "n1"
MARKER = NORMAL.capacity_resource


def watch(free_gib: int) -> pb.WatchResponse:
    return pb.WatchResponse(
        free_bytes=free_gib * GiB,
        items=[pb.WatchItem(device_class="ssd", free_bytes=free_gib * GiB, size_bytes=10 * GiB)],
    )


@pytest.fixture
async def exporter(kube_client: AsyncClient) -> AsyncIterator[CapacityExporter]:  # noqa: F811
    lvmd = SocketLvmd("/nonexistent/lvmd.sock")  # never dialled: publish() gets the messages
    metrics = NodeMetrics(CollectorRegistry(), NODE)
    yield CapacityExporter(kube_client, NORMAL, NODE, lvmd, metrics)
    await lvmd.close()


def node(emu: KubeEmulator) -> dict[str, Any]:
    obj = emu.get("nodes", NODE)
    assert obj is not None
    return obj


def writes(emu: KubeEmulator) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in emu.requests]


async def test_a_message_costs_one_patch_after_the_first(
    kube: KubeEmulator,  # noqa: F811
    exporter: CapacityExporter,
) -> None:
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    assert await exporter.publish(watch(5))
    first = node(kube)
    assert first["metadata"]["annotations"]["capacity.topolvm.io/ssd"] == str(5 * GiB)
    assert first["metadata"]["annotations"]["capacity.topolvm.io/00default"] == str(5 * GiB)
    assert NORMAL.node_finalizer in first["metadata"]["finalizers"]
    assert first["status"]["allocatable"][MARKER] == str(ADVERTISED_COUNT)
    # the first message reads the Node, then sets up the finalizer and the extended resource
    assert [m for m, _ in writes(kube)] == ["GET", "PATCH", "PATCH", "PATCH"]
    # the finalizer goes on before the annotations: a Node never shows capacity without it
    assert kube.requests[1].body["metadata"]["finalizers"] == [NORMAL.node_finalizer]
    assert "annotations" in kube.requests[2].body["metadata"]

    kube.requests.clear()
    assert await exporter.publish(watch(4))
    assert writes(kube) == [("PATCH", f"/api/v1/nodes/{NODE}")]
    assert node(kube)["metadata"]["annotations"]["capacity.topolvm.io/ssd"] == str(4 * GiB)
    assert exporter.updates == 2

    # something drops the finalizer: the next message's answer shows it, and it is put back
    dropped = node(kube)
    del dropped["metadata"]["finalizers"]
    kube.create(dropped)
    kube.requests.clear()
    assert await exporter.publish(watch(3))
    assert len(kube.requests) == 2
    assert node(kube)["metadata"]["finalizers"] == [NORMAL.node_finalizer]


async def test_a_node_being_deleted_at_start_is_not_written(
    kube: KubeEmulator,  # noqa: F811
    kube_client: AsyncClient,  # noqa: F811
    exporter: CapacityExporter,
) -> None:
    kube.create(
        {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": NODE, "finalizers": ["example.com/hold"]}}
    )  # fmt: skip
    await kube_client.delete(Node, NODE)
    assert node(kube)["metadata"].get("deletionTimestamp")  # held by its finalizer
    kube.requests.clear()
    assert not await exporter.publish(watch(5))
    assert writes(kube) == [("GET", f"/api/v1/nodes/{NODE}")]
    after = node(kube)
    assert after["metadata"]["finalizers"] == ["example.com/hold"]
    assert "annotations" not in after["metadata"]


async def test_a_node_deleted_later_gets_nothing_after_the_patch_that_shows_it(
    kube: KubeEmulator,  # noqa: F811
    kube_client: AsyncClient,  # noqa: F811
    exporter: CapacityExporter,
) -> None:
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    assert await exporter.publish(watch(5))
    await kube_client.delete(Node, NODE)  # held by the exporter's finalizer
    kube.requests.clear()
    assert not await exporter.publish(watch(4))
    assert writes(kube) == [("PATCH", f"/api/v1/nodes/{NODE}")]
    assert node(kube)["metadata"]["finalizers"] == [NORMAL.node_finalizer]  # for the controller


async def test_a_missing_node_is_reported_and_the_export_goes_on(
    kube: KubeEmulator,  # noqa: F811
    kube_client: AsyncClient,  # noqa: F811
    exporter: CapacityExporter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert await exporter.publish(watch(5))  # True: keep following lvmd
    assert "Node object not found; capacity not published" in caplog.text
    assert exporter.updates == 0
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    assert await exporter.publish(watch(5))
    assert node(kube)["metadata"]["annotations"]["capacity.topolvm.io/ssd"] == str(5 * GiB)

    # gone again while running: the patch's 404 says so, and the next message reads first
    released = node(kube)
    del released["metadata"]["finalizers"]
    kube.create(released)
    await kube_client.delete(Node, NODE)
    assert kube.get("nodes", NODE) is None
    kube.requests.clear()
    assert await exporter.publish(watch(4))
    assert await exporter.publish(watch(3))
    assert [m for m, _ in writes(kube)] == ["PATCH", "GET"]

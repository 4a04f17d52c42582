"""Which LogicalVolume events make topolvm-node reconcile (pure: the informer's objects)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from topolvm.constants import CREATED_BY_LABEL, NORMAL
from topolvm.node.reconciler import LogicalVolumeReconciler

NODE = "node-a"
LABEL, VALUE = CREATED_BY_LABEL


def done_lv() -> dict[str, Any]:
    """A LogicalVolume this node has finished: finalized, labelled, created at its size."""
    return {
        "metadata": {
            "name": "pvc-1",
            "uid": "0d1e2f",
            "finalizers": [NORMAL.lv_finalizer],
            "labels": {LABEL: VALUE},
        },
        "spec": {"name": "pvc-1", "nodeName": NODE, "size": "1Gi", "deviceClass": "ssd"},
        "status": {"volumeID": "0d1e2f", "currentSize": "1Gi"},
    }


def reconciler() -> LogicalVolumeReconciler:
    return LogicalVolumeReconciler(None, NORMAL, NODE, None)  # type: ignore[arg-type]


def test_a_finished_volume_needs_nothing() -> None:
    assert not reconciler().needs_work(done_lv())


def _new(obj: dict[str, Any]) -> None:
    del obj["status"]
    obj["metadata"].pop("finalizers")
    obj["metadata"].pop("labels")


@pytest.mark.parametrize(
    "change",
    [
        _new,
        lambda o: o["metadata"].update(finalizers=[]),
        lambda o: o["metadata"].update(labels={}),
        lambda o: o["status"].pop("volumeID"),
        lambda o: o["status"].pop("currentSize"),
        lambda o: o["spec"].update(size="2Gi"),  # expansion asked
        lambda o: o["metadata"].update(deletionTimestamp="2026-11-24T00:00:00Z"),
        lambda o: o["spec"].update(size="ten"),  # malformed: reconcile logs it
    ],
    ids=[
        "new",
        "no-finalizer",
        "no-label",
        "no-volume-id",
        "no-current-size",
        "expand",
        "deleting",
        "malformed",
    ],
)
def test_work_left_is_seen(change: Any) -> None:
    obj = copy.deepcopy(done_lv())
    change(obj)
    assert reconciler().needs_work(obj)


def test_other_nodes_volumes_are_not_ours() -> None:
    obj = done_lv()
    del obj["status"]
    obj["spec"]["nodeName"] = "node-b"
    assert not reconciler().needs_work(obj)


class Handlers:
    """Stands in for the informer and the controller: records the handler and the keys queued."""

    def __init__(self) -> None:
        self.handler: Any = None
        self.queued: list[str] = []

    def add_handler(self, handler: Any) -> None:
        self.handler = handler

    def enqueue(self, key: str) -> None:
        self.queued.append(key)


def test_the_echo_of_its_own_write_and_older_versions_are_not_queued() -> None:
    r = reconciler()
    events = Handlers()
    r.watch(events, events)  # type: ignore[arg-type]
    obj = done_lv()
    del obj["status"]  # the finalizer write's echo: no volume yet, but the writer goes on
    obj["metadata"]["resourceVersion"] = "5"
    r._acted["pvc-1"] = 5  # as the finalizer write records it
    events.handler("MODIFIED", obj)
    assert events.queued == []
    obj["metadata"]["resourceVersion"] = "4"  # a late event from before it: superseded
    events.handler("MODIFIED", obj)
    assert events.queued == []
    obj["metadata"]["resourceVersion"] = "6"  # somebody else's change after it
    events.handler("MODIFIED", obj)
    assert events.queued == ["pvc-1"]
    events.handler("DELETED", obj)
    obj["metadata"]["resourceVersion"] = "5"  # a new object of the same name starts afresh
    events.handler("ADDED", obj)
    assert events.queued == ["pvc-1", "pvc-1"]

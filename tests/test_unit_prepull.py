"""A move's image pre-pull pod and how its pull is read (src/topolvm/move/prepull.py)."""

from __future__ import annotations

from typing import Any

from topolvm.move import prepull

WORKLOAD: dict[str, Any] = {
    "metadata": {"name": "db-0", "namespace": "shop"},
    "spec": {
        "serviceAccountName": "db", "imagePullSecrets": [{"name": "regcred"}],
        "initContainers": [{"name": "init", "image": "reg/tools:1"}],
        "containers": [{"name": "db", "image": "reg/db:2", "imagePullPolicy": "Always"},
                       {"name": "side", "image": "reg/tools:1"}],
    },
}  # fmt: skip


def test_one_container_per_image_pinned_to_the_target_with_the_workloads_credentials() -> None:
    pod = prepull.prepull_pod(WORKLOAD, "n2", "topolvm-prepull-x", {"a": "b"})
    spec = pod["spec"]
    assert pod["metadata"]["namespace"] == "shop"
    assert pod["metadata"]["labels"] == {"a": "b", prepull.COMPONENT_LABEL: prepull.COMPONENT}
    assert spec["nodeName"] == "n2" and spec["restartPolicy"] == "Never"
    assert spec["serviceAccountName"] == "db"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["automountServiceAccountToken"] is False
    assert [(c["image"], c.get("imagePullPolicy")) for c in spec["containers"]] == [
        ("reg/tools:1", None), ("reg/db:2", "Always")
    ]  # fmt: skip
    assert all(c["command"] == [prepull.NEVER_RUNS] for c in spec["containers"])


def _pod(*statuses: dict[str, Any], phase: str = "Pending") -> dict[str, Any]:
    pod = prepull.prepull_pod(WORKLOAD, "n2", "p", {})
    pod["status"] = {"phase": phase, "containerStatuses": list(statuses)}
    return pod


def test_pull_state() -> None:
    assert not prepull.pull_state(_pod()).done  # nothing reported yet
    creating = {"waiting": {"reason": "ContainerCreating"}}
    pulling = _pod({"name": "pull-0", "imageID": "sha256:1"}, {"name": "pull-1", "state": creating})
    state = prepull.pull_state(pulling)
    assert not state.done and state.pulled == ("reg/tools:1",) and state.waiting == ("reg/db:2",)
    done = prepull.pull_state(_pod(
        {"name": "pull-0", "imageID": "sha256:1",
         "state": {"terminated": {"reason": "StartError"}}},
        {"name": "pull-1", "state": {"waiting": {"reason": "ImagePullBackOff",
                                                 "message": "not found"}}},
    ))  # fmt: skip
    assert done.done and done.failed == ("reg/db:2: not found",)
    assert done.describe() == "pulled reg/tools:1; could not pull reg/db:2: not found"
    ended = prepull.pull_state(_pod({"name": "pull-0", "imageID": "sha256:1"}, phase="Failed"))
    assert ended.done and ended.failed == ("reg/db:2: the pod ended",)


def test_a_container_the_kubelet_tried_to_start_has_its_image() -> None:
    """The kubelet creates and starts a container only after its pull: a start that failed
    (the pre-pull's command does not exist) says the image is there, imageID or not."""
    state = prepull.pull_state(_pod(
        {"name": "pull-0", "state": {"waiting": {"reason": "RunContainerError"}}},
        {"name": "pull-1", "state": {"terminated": {"reason": "StartError", "exitCode": 128}}},
    ))  # fmt: skip
    assert state.done and state.pulled == ("reg/tools:1", "reg/db:2") and not state.failed

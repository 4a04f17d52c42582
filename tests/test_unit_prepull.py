"""A move's image pre-pull pod and how its pull is read (src/topolvm/move/prepull.py)."""

from __future__ import annotations

from typing import Any

import pytest

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


@pytest.mark.parametrize(("image", "full"), [
    ("busybox", "docker.io/library/busybox:latest"),
    ("busybox:1.36", "docker.io/library/busybox:1.36"),
    ("bitnami/mysql", "docker.io/bitnami/mysql:latest"),
    ("index.docker.io/library/busybox:1", "docker.io/library/busybox:1"),
    ("quay.io/ns/app", "quay.io/ns/app:latest"),
    ("localhost/app:2", "localhost/app:2"),
    ("registry:5000/app", "registry:5000/app:latest"),
    ("registry:5000/app@sha256:ab", "registry:5000/app@sha256:ab"),
    ("busybox@sha256:ab", "docker.io/library/busybox@sha256:ab"),
])  # fmt: skip
def test_image_names_are_spelled_as_the_runtime_lists_them(image: str, full: str) -> None:
    assert prepull.reference(image) == full


def test_only_images_the_node_lists_count_as_there() -> None:
    workload = {"spec": {"initContainers": [{"image": "busybox:1"}],
                         "containers": [{"image": "quay.io/ns/app:2"}]}}  # fmt: skip
    node = {"status": {"images": [{"names": ["docker.io/library/busybox:1"]}]}}
    assert prepull.missing(workload, node) == ["quay.io/ns/app:2"]
    node["status"]["images"].append({"names": ["quay.io/ns/app@sha256:1", "quay.io/ns/app:2"]})
    assert prepull.missing(workload, node) == []
    assert prepull.missing(workload, {}) == ["busybox:1", "quay.io/ns/app:2"]  # no status: pull


def test_an_image_pulled_at_every_start_is_pulled_ahead_even_when_there() -> None:
    """Its tag may have moved: the pull before the stop fetches the new layers."""
    node = {"status": {"images": [{"names": ["docker.io/library/busybox:latest",
                                             "quay.io/ns/app:2"]}]}}  # fmt: skip
    latest = {"spec": {"containers": [{"image": "busybox"}]}}  # the API server's default: Always
    assert prepull.missing(latest, node) == ["busybox"]
    always = {"spec": {"containers": [{"image": "quay.io/ns/app:2", "imagePullPolicy": "Always"}]}}
    assert prepull.missing(always, node) == ["quay.io/ns/app:2"]
    pinned = {"spec": {"containers": [{"image": "busybox", "imagePullPolicy": "IfNotPresent"}]}}
    assert prepull.missing(pinned, node) == []

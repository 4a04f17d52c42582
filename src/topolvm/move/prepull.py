"""A move's image pre-pull (pure): the pod's images are pulled on the target node while the
pre-copy runs, so that the pod's start there after the swap does not wait for a pull with the
workload down (docs/mobility.md, "Move").

The pull is done the way any container runtime does it: by the target's kubelet, for a
short-lived pod pinned to the target (``spec.nodeName``, so no scheduler and no capacity
check), in the workload's namespace with its ServiceAccount and ``imagePullSecrets`` (the
credentials the workload itself pulls with), one container per image, each with the pull policy
the workload gives it. It carries the workload's tolerations, node selector, required node
affinity and runtime class, nothing more: it is made only on a node where the workload itself
may run (:mod:`.fits`), and pulls for the runtime the workload uses. The containers are not
meant to run: each runs a command that cannot exist, as a non-root user with no privileges, a
read-only root, tiny limits and a deadline, so the kubelet pulls the image, then fails to start
it (or starts nothing). What the
kubelet reports decides: a container status with an ``imageID`` is pulled; ``ErrImagePull`` /
``ImagePullBackOff`` is a pull that fails (the move goes on: the pod's own start pulls, or
fails, as it would have).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
NEVER_RUNS = "/.topolvm-prepull-does-not-run"
PULL_FAILED = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                         "ErrImageNeverPull", "RegistryUnavailable", "ImageInspectError",
                         "SignatureValidationFailed"})  # fmt: skip
DEADLINE = 900  # seconds the pod may live (its activeDeadlineSeconds), whatever the controller
AFTER_PULL = frozenset({"CreateContainerError", "CreateContainerConfigError",
                        "RunContainerError", "StartError", "CrashLoopBackOff"})  # fmt: skip
RESTRICTED_CONTAINER: Obj = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                             "capabilities": {"drop": ["ALL"]}}  # fmt: skip
LIMITS = {"cpu": "10m", "memory": "16Mi"}
COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "topolvm-prepull"


class ImagesPulled:
    """The VolumeMove's ``ImagesPulled`` condition: its type and reasons."""

    TYPE = "ImagesPulled"
    PULLED = "Pulled"  # True: every image is on the target node (or there was none)
    FAILED = "PullFailed"  # False: the kubelet could not pull one (the message says which)
    TIMED_OUT = "PullTimedOut"  # False: not over in time; the pod's start pulls
    SKIPPED = "PullSkipped"  # False: the pre-pull pod could not be made
    PRESENT = "AlreadyPresent"  # True: the target's Node lists every image (no pod made)


def pod_name(move_uid: str) -> str:
    return f"topolvm-prepull-{move_uid[:13]}"


def images(pod: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(image, pull policy) of the pod's init and app containers, each image once."""
    spec = pod.get("spec") or {}
    seen: dict[str, str] = {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        image = str((c or {}).get("image") or "")
        if image and image not in seen:
            seen[image] = str(c.get("imagePullPolicy") or "")
    return list(seen.items())


def reference(image: str) -> str:
    """``image`` as the container runtime names it: the registry and, on Docker Hub, the
    ``library/`` path spelled out, ``:latest`` when neither a tag nor a digest is given
    (``busybox`` is ``docker.io/library/busybox:latest``)."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        domain, path = first, rest
    else:
        domain, path = "docker.io", image
    if domain in ("index.docker.io", "registry-1.docker.io"):
        domain = "docker.io"
    if domain == "docker.io" and "/" not in path:
        path = f"library/{path}"
    last = path.rsplit("/", 1)[-1]
    if "@" not in last and ":" not in last:
        path += ":latest"
    return f"{domain}/{path}"


def missing(workload: Mapping[str, Any], node: Mapping[str, Any]) -> list[str]:
    """The workload's images to pull on ``node``: those its status does not list (the kubelet
    reports the images it holds, up to its ``nodeStatusMaxImages``; one the list does not show,
    for any reason, counts as missing), and those pulled ``Always`` (the pod's start asks the
    registry again: a tag moved since is pulled now, not with the workload down). None means
    there is nothing to pull."""
    held = {reference(str(name)) for entry in (node.get("status") or {}).get("images") or []
            for name in entry.get("names") or []}  # fmt: skip
    return [image for image, policy in images(workload)
            if _always(image, policy) or reference(image) not in held]  # fmt: skip


def _always(image: str, policy: str) -> bool:
    """Whether the kubelet pulls ``image`` at every start: its policy, or the API server's
    default for none (``Always`` for ``:latest`` or no tag)."""
    if policy:
        return policy == "Always"
    last = reference(image).rsplit("/", 1)[-1]
    return "@" not in last and last.endswith(":latest")


def prepull_pod(
    workload: Mapping[str, Any], target_node: str, name: str, labels: Mapping[str, str]
) -> Obj:
    """The pod that pulls ``workload``'s images on ``target_node``."""
    spec = workload.get("spec") or {}
    meta = workload.get("metadata") or {}
    containers = []
    for i, (image, policy) in enumerate(images(workload)):
        c: Obj = {"name": f"pull-{i}", "image": image, "command": [NEVER_RUNS],
                  "resources": {"requests": LIMITS, "limits": LIMITS},
                  "securityContext": RESTRICTED_CONTAINER}  # fmt: skip
        if policy:
            c["imagePullPolicy"] = policy
        containers.append(c)
    body: Obj = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": meta.get("namespace", ""),
                     "labels": {**labels, COMPONENT_LABEL: COMPONENT}},
        "spec": {
            "nodeName": target_node, "restartPolicy": "Never", "containers": containers,
            "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
            "enableServiceLinks": False, "activeDeadlineSeconds": DEADLINE,
            # what the Pod Security Standards' "restricted" level asks (it never runs anyway;
            # an image whose user is root is refused a start, after its pull)
            "securityContext": {"runAsNonRoot": True,
                                "seccompProfile": {"type": "RuntimeDefault"}},
        },
    }  # fmt: skip
    for key in ("serviceAccountName", "imagePullSecrets", "tolerations", "nodeSelector",
                "runtimeClassName"):  # fmt: skip
        if spec.get(key):
            body["spec"][key] = spec[key]
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required:
        body["spec"]["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": required}}  # fmt: skip
    return body


@dataclass(frozen=True)
class Pull:
    done: bool  # every image pulled, or failed for good
    pulled: tuple[str, ...]
    failed: tuple[str, ...]  # "image: reason"
    waiting: tuple[str, ...]  # images still being pulled

    def describe(self) -> str:
        parts = []
        if self.pulled:
            parts.append(f"pulled {', '.join(self.pulled)}")
        if self.failed:
            parts.append(f"could not pull {'; '.join(self.failed)}")
        if self.waiting:
            parts.append(f"pulling {', '.join(self.waiting)}")
        return "; ".join(parts) or "no image to pull"


def pull_state(pod: Mapping[str, Any]) -> Pull:
    """How far the kubelet got with the pre-pull pod's images."""
    spec_images = {c["name"]: c["image"] for c in (pod.get("spec") or {}).get("containers") or []}
    statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("containerStatuses") or []}
    pulled, failed, waiting = [], [], []
    for name, image in spec_images.items():
        s = statuses.get(name) or {}
        reason = str(((s.get("state") or {}).get("waiting") or {}).get("reason") or "")
        # the image is there once the kubelet names it, or tried to create or start its
        # container (which it does only after the pull)
        if s.get("imageID") or (s.get("state") or {}).get("terminated") or reason in AFTER_PULL:
            pulled.append(image)
        elif reason in PULL_FAILED:
            message = ((s.get("state") or {}).get("waiting") or {}).get("message") or reason
            failed.append(f"{image}: {message}")
        else:
            waiting.append(image)
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") and waiting:
        # the pod ended without a word on these (it was rejected on the node, say)
        reason = (pod.get("status") or {}).get("reason") or "the pod ended"
        failed += [f"{image}: {reason}" for image in waiting]
        waiting = []
    return Pull(not waiting, tuple(pulled), tuple(failed), tuple(waiting))

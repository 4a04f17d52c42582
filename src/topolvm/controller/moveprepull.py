"""A move pulls its pod's images on the target node during the pre-copy (docs/mobility.md,
"The pod's images are pulled before it stops"): the pod, once stopped, starts on the target
without waiting for a pull with the workload down.

The pre-pull pod (:mod:`topolvm.move.prepull`) is made at the first PreCopy pass, so the pull
runs beside the copy; the move leaves PreCopy once the copy is done *and* the pull is over. The
outcome is the VolumeMove's ``ImagesPulled`` condition (an Event says it too):

- True, ``Pulled``: every image is on the target node;
- False, ``PullFailed`` (a registry refused, say), ``PullTimedOut`` (not over within
  :data:`TIMEOUT`) or ``PullSkipped`` (the pod could not be made: a quota, an admission
  policy): the move goes on, and the pod's own start pulls, as it would have without this.

A pull never holds a move for ever and never fails it. The pre-pull pod is deleted once the
condition is set, and when the move rolls back (a delete that names the pod's UID)."""

from __future__ import annotations

import logging

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from topolvm.k8s import api, stamps
from topolvm.k8s import errors as kube
from topolvm.k8s.moveobject import Condition, VolumeMoveObject
from topolvm.move import prepull

log = logging.getLogger(__name__)

IP = prepull.ImagesPulled
TIMEOUT = 600.0  # seconds a pull may hold the move's pre-copy (the workload still runs)
MOVE_LABEL = "topolvm.io/move-uid"


def _over(status: str, reason: str, message: str) -> Condition:
    return Condition(IP.TYPE, status, reason, message, stamps.now())


class PrePull:
    def __init__(self, client: AsyncClient, timeout: float = TIMEOUT) -> None:
        self.client = client
        self.timeout = timeout

    async def check(self, vm: VolumeMoveObject) -> tuple[Condition | None, str]:
        """The ``ImagesPulled`` condition once the pull is over (None while it runs), and what
        to say meanwhile. Makes the pre-pull pod on the first call."""
        name = prepull.pod_name(vm.uid)
        ns, target = vm.namespace, vm.status.target_node
        puller = await api.get(self.client, Pod, name, namespace=ns)
        if puller is None:
            workload = await api.get(self.client, Pod, vm.status.pod, namespace=ns)
            if workload is None or not prepull.images(workload):
                return _over("True", IP.PULLED, "none to pull (no pod)"), ""
            body = prepull.prepull_pod(workload, target, name, {MOVE_LABEL: vm.uid})
            try:
                await api.create(self.client, Pod.from_dict(body))
            except kube.AlreadyExists:
                pass
            except kube.KubeError as e:  # a quota, an admission policy: the pod's start pulls
                text = f"the pre-pull pod could not be made ({kube.describe(e)})"
                ctx = {"move": f"{ns}/{vm.name}", "node": target, "error": kube.describe(e)}
                log.warning("a move's image pre-pull is skipped", extra=ctx)
                return _over("False", IP.SKIPPED, text), ""
            return None, f"pulling the pod's images on node {target}"
        pull = prepull.pull_state(puller)
        if pull.done:
            ok = not pull.failed
            text = f"on node {target}: {pull.describe()}"
            return _over("True" if ok else "False", IP.PULLED if ok else IP.FAILED, text), ""
        if stamps.seconds_since(puller["metadata"].get("creationTimestamp", "")) > self.timeout:
            text = f"on node {target} after {self.timeout:.0f} s: {pull.describe()}"
            return _over("False", IP.TIMED_OUT, text), ""
        return None, f"pulling the pod's images on node {target} ({pull.describe()})"

    async def remove(self, vm: VolumeMoveObject) -> None:
        """Delete the move's pre-pull pod, if there is one (only the pod this move made)."""
        name = prepull.pod_name(vm.uid)
        puller = await api.get(self.client, Pod, name, namespace=vm.namespace)
        if puller is None or (puller["metadata"].get("labels") or {}).get(MOVE_LABEL) != vm.uid:
            return
        await api.delete(self.client, Pod, name, namespace=vm.namespace,
                         uid=puller["metadata"]["uid"])  # fmt: skip

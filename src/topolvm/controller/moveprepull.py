"""A move pulls its pod's images on the target node during the pre-copy (docs/mobility.md,
"The pod's images are pulled before it stops"): the pod, once stopped, starts on the target
without waiting for a pull with the workload down.

The pre-pull pod (:mod:`topolvm.move.prepull`) is made at the first PreCopy pass, so the pull
runs beside the copy; the move leaves PreCopy once the copy is done *and* the pull is over. The
outcome is the VolumeMove's ``ImagesPulled`` condition (an Event says it too):

- True, ``Pulled``: every image is on the target node; ``AlreadyPresent``: the target's Node
  already lists every one of them (its ``status.images``), so no pre-pull pod is made;
- False, ``PullFailed`` (a registry refused, say), ``PullTimedOut`` (not over within
  :data:`TIMEOUT`) or ``PullSkipped`` (the pod could not be made: a quota, an admission
  policy): the move goes on, and the pod's own start pulls, as it would have without this.

A pull never holds a move for ever and never fails it. The pre-pull pod is deleted once the
condition is set, and when the move rolls back (a delete that names the pod's UID)."""

from __future__ import annotations

import logging

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, Pod

from topolvm.k8s import api, stamps
from topolvm.k8s import errors as kube
from topolvm.k8s.moveobject import Condition, VolumeMoveObject
from topolvm.move import fits, prepull

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
        to say meanwhile. Makes the pre-pull pod on the first call. Transient API errors are
        raised (the pass is tried again); a refusal skips the pull."""
        name = prepull.pod_name(vm.uid)
        ns, target = vm.namespace, vm.status.target_node
        # the pull's time runs from the move's start: a pre-pull pod deleted and made again
        # never makes it longer
        late = stamps.seconds_since(vm.status.start_time) > self.timeout
        timed_out = _over("False", IP.TIMED_OUT, f"on node {target}: not over after "
                          f"{self.timeout:.0f} s; the pod's start pulls")  # fmt: skip
        puller = await api.get(self.client, Pod, name, namespace=ns)
        if puller is not None:
            spec, labels = puller.get("spec") or {}, puller["metadata"].get("labels") or {}
            if labels.get(MOVE_LABEL) != vm.uid or spec.get("nodeName") != target:
                return _over("False", IP.SKIPPED, f"pod {name} is there, but this move did "
                             f"not make it for node {target}"), ""  # fmt: skip
            pull = prepull.pull_state(puller)
            if not pull.done:
                if late:
                    return timed_out, ""
                return None, f"pulling the pod's images on node {target} ({pull.describe()})"
            ok = not pull.failed
            text = f"on node {target}: {pull.describe()}"
            return _over("True" if ok else "False", IP.PULLED if ok else IP.FAILED, text), ""
        if late:
            return timed_out, ""
        workload = await api.get(self.client, Pod, vm.status.pod, namespace=ns)
        if workload is None or not prepull.images(workload):
            return _over("True", IP.PULLED, "none to pull (no pod)"), ""
        node = await api.get(self.client, Node, target)
        if why := fits.refusal(workload, node or {"metadata": {"name": target}}):
            return _over("False", IP.SKIPPED, f"not pulled on node {target}: {why}"), ""
        if node is not None and not prepull.missing(workload, node):
            held = ", ".join(image for image, _ in prepull.images(workload))
            return _over("True", IP.PRESENT, f"on node {target} already: {held}"), ""
        body = prepull.prepull_pod(workload, target, name, {MOVE_LABEL: vm.uid})
        body["metadata"]["ownerReferences"] = [{  # gone with its VolumeMove, whatever happens
            "apiVersion": "topolvm.io/v1", "kind": "VolumeMove", "name": vm.name,
            "uid": vm.uid}]  # fmt: skip
        try:
            await api.create(self.client, Pod.from_dict(body))
        except kube.AlreadyExists:
            pass  # made by a pass just before: the next pass reads it
        except kube.KubeError as e:
            if kube.is_transient(e):
                raise
            # a quota, an admission policy: the pod's own start pulls
            ctx = {"move": f"{ns}/{vm.name}", "node": target, "error": kube.describe(e)}
            log.warning("a move's image pre-pull is skipped", extra=ctx)
            return _over("False", IP.SKIPPED, f"the pre-pull pod could not be made "
                         f"({kube.describe(e)})"), ""  # fmt: skip
        return None, f"pulling the pod's images on node {target}"

    async def remove(self, vm: VolumeMoveObject) -> None:
        """Delete the move's pre-pull pod, if there is one (only the pod this move made, by its
        UID). Best effort: a failure is logged, and the VolumeMove's deletion takes the pod with
        it (its owner reference)."""
        name = prepull.pod_name(vm.uid)
        try:
            puller = await api.get(self.client, Pod, name, namespace=vm.namespace)
            if puller is None or (puller["metadata"].get("labels") or {}).get(MOVE_LABEL) != vm.uid:
                return
            await api.delete(self.client, Pod, name, namespace=vm.namespace,
                             uid=puller["metadata"]["uid"])  # fmt: skip
        except kube.KubeError as e:
            ctx = {"move": f"{vm.namespace}/{vm.name}", "pod": name, "error": kube.describe(e)}
            log.warning("a move's pre-pull pod is not deleted now", extra=ctx)

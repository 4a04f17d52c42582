"""No pod stays held by a move's scheduling gate (docs/mobility.md, "Fencing").

The pod webhook gives a pod the gate ``<plugin>/move`` while a move of one of its claims is in
a downtime phase; the move lifts it when it starts the pod on the target or rolls back. A pod
admitted in the instant the move rolls back can be stored after the rollback lifted the gates
of the pods it saw, and a done move is never looked at again. So the leader sweeps: every
``interval`` seconds, and at once when a move ends, it lifts the gate from each pod none of
whose claims has a move in progress (:func:`topolvm.move.claims.stale_gates`).

It lists the pods first and the moves second: a pod it saw was gated by a move in progress at
its admission, so a move found done (or gone) afterwards will not lift it; the gate is removed
with the pod's resourceVersion, so a pod that changed meanwhile is left to the next sweep. The
first sweep after the leader starts looks at every namespace; later ones at the namespaces
that have, or had since, a VolumeMove.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

from lightkube import ALL_NS, AsyncClient
from lightkube.resources.core_v1 import Pod

from topolvm.constants import Names
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.move import claims

log = logging.getLogger(__name__)
INTERVAL = 30.0


async def lift_gate(client: AsyncClient, pod: api.Obj, gate: str) -> bool:
    """Remove ``gate`` from ``pod`` as read (its resourceVersion a precondition); False when
    the pod is gone or changed since (a later look decides again)."""
    meta = pod["metadata"]
    patch = {"metadata": {"resourceVersion": meta["resourceVersion"]},
             "spec": {"schedulingGates": claims.without_gate(pod, gate)}}  # fmt: skip
    try:
        await api.patch_merge(client, Pod, meta["name"], patch, namespace=meta["namespace"])
    except (kube.NotFound, kube.Conflict) as e:
        log.info("scheduling gate not lifted: the pod changed; looked at again later",
                 extra={"pod": f"{meta['namespace']}/{meta['name']}",
                        "detail": kube.describe(e)})  # fmt: skip
        return False
    return True


class GateSweep:
    def __init__(self, client: AsyncClient, names: Names, *, interval: float = INTERVAL) -> None:
        self.client = client
        self.gate = claims.gate_name(names.plugin)
        self.moves = api.volumemove_resource(names)
        self.interval = interval
        self.namespaces: set[str] = set()  # that have had a VolumeMove, since the start
        self._now = asyncio.Event()
        self.lifted = 0  # gates lifted since the start

    def soon(self, namespace: str) -> None:
        """Sweep at once (a move in ``namespace`` ended)."""
        self.namespaces.add(namespace)
        self._now.set()

    def seen(self, namespace: str) -> None:
        self.namespaces.add(namespace)

    async def run(self) -> None:
        """Sweep every namespace once, then the namespaces of moves every ``interval`` (and
        when :meth:`soon` asks), until cancelled. A failed sweep is logged and tried again
        at the next round."""
        everywhere = True
        while True:
            self._now.clear()
            try:
                await self.sweep(None if everywhere else sorted(self.namespaces))
                everywhere = False
            except kube.KubeError as e:
                log.warning("scheduling gate sweep failed; trying again",
                            extra={"gate": self.gate, "detail": kube.describe(e)})  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._now.wait(), self.interval)

    async def sweep(self, namespaces: Iterable[str] | None = None) -> int:
        """Lift the gate from the pods of ``namespaces`` (None: all) that no move holds; how
        many it lifted."""
        lifted = 0
        for ns in [ALL_NS] if namespaces is None else list(namespaces):
            pods, _ = await api.list_all(self.client, Pod, namespace=ns)
            gated = [p for p in pods if claims.gated(p, self.gate)]
            if not gated:
                continue
            moves, _ = await api.list_all(self.client, self.moves, namespace=ns)  # after pods
            for pod in claims.stale_gates(gated, moves, self.gate):
                meta = pod["metadata"]
                if await lift_gate(self.client, pod, self.gate):
                    lifted += 1
                    log.warning(
                        "lifted a move's scheduling gate that no move in progress holds",
                        extra={"pod": f"{meta['namespace']}/{meta['name']}", "gate": self.gate},
                    )  # fmt: skip
        self.lifted += lifted
        return lifted

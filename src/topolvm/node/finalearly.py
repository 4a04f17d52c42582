"""A move's final cut, made the moment its source closes (docs/mobility.md, "Moving a claim").

A move's final copy reads a second cut of the source, made once nothing holds the source open,
and sends what differs from the first. Made when the target's node asks, that cut and its delta
(a few LVM commands, seconds on a slow node) came after the pod's stop was noticed, the final
copy asked for and the target's node connected, all with the pod down. This publish hook makes
them as soon as the kubelet unmounts such a source (its pre-copy done: the only unmount to come
is the move's stop of its pod), so the final copy finds both ready. A publish of the source
before the final copy reads the cut drops it; the final copy then cuts again once the source
closes (:class:`~topolvm.node.transfer.TransferService`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from topolvm.k8s import errors as kube
from topolvm.k8s.lvstore import AmbiguousVolumeId, LogicalVolumeStore
from topolvm.node.orphans import final_pending
from topolvm.node.transfer import TransferService

log = logging.getLogger(__name__)


class EarlyFinalCuts:
    """:class:`~topolvm.node.csihooks.PublishHooks` of the moves whose source is on this node."""

    def __init__(self, store: LogicalVolumeStore, transfer: TransferService, node: str) -> None:
        self.store = store
        self.transfer = transfer
        self.node = node

    async def published(self, volume_id: str, target: str, context: Mapping[str, str]) -> None:
        await self.transfer.source_published(volume_id)

    async def unpublishing(self, volume_id: str, target: str) -> None:
        """Nothing yet: the source is still mounted."""

    async def unpublished(self, volume_id: str, target: str) -> None:
        try:
            source = await self.store.find_by_volume_id(volume_id)
        except (kube.KubeError, AmbiguousVolumeId) as e:
            log.info("no early final cut: the volume's LogicalVolume is not known",
                     extra={"volume_id": volume_id, "error": str(e)})  # fmt: skip
            return
        if source is None or source.node_name != self.node:
            return
        for lv in self.store.all():
            if lv.copy_source == source.name and final_pending(lv):
                self.transfer.final_early_soon(lv, source)

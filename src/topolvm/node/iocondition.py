"""The Node condition :data:`topolvm.iolimits.NODE_CONDITION` (docs/qos.md): ``True`` when this
node cannot put IO limits in force at all (limits turned off, cgroup v1, no io controller for
the pods, a kernel without block throttling), with the reason and what to change; ``False``
when it can. Set when topolvm-node starts (from the cgroup files it sees) and whenever a limit
meets a node-wide cause later (the pods' cgroups are checked only once a pod has one).

Written as a strategic merge patch of the Node's status, so the kubelet's conditions and
others' (node-problem-detector) stay as they are; only a change of the answer writes, and
``lastTransitionTime`` moves only when ``status`` does.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from topolvm.iolimits import NODE_CONDITION
from topolvm.k8s import api, stamps
from topolvm.k8s import errors as kube
from topolvm.node import podcgroup
from topolvm.node.podcgroup import Support

log = logging.getLogger(__name__)


def condition_patch(support: Support, conditions: list[api.Obj], now: str) -> api.Obj | None:
    """The Node status patch that says ``support`` (None: the Node's ``conditions`` already
    say it). Pure."""
    status = "False" if support.ok else "True"
    before = next((c for c in conditions if c.get("type") == NODE_CONDITION), None)
    if before is not None and (before.get("status"), before.get("reason"),
                               before.get("message")) == (status, support.reason,
                                                          support.message):  # fmt: skip
        return None
    since = now
    if before is not None and before.get("status") == status:
        since = before.get("lastTransitionTime") or now
    entry = {
        "type": NODE_CONDITION, "status": status, "reason": support.reason,
        "message": support.message, "lastHeartbeatTime": now, "lastTransitionTime": since,
    }  # fmt: skip
    return {"status": {"conditions": [entry]}}


def read_support(node: str, root: Path | None, folder: Path | None = None) -> Support:
    """What this node's cgroup files say (blocking reads; in a worker thread). ``folder``: a
    pod's cgroup, else the kubelet's pods' folder when one of the usual places has it."""
    if root is None:
        return podcgroup.support(node, None)
    try:
        controllers = (root / "cgroup.controllers").read_text()
    except OSError:
        return podcgroup.support(node, str(root), v2=False)
    if folder is None:
        folder = next((root / d for d in podcgroup.PODS_PARENTS if (root / d).is_dir()), None)
    if folder is None:
        return podcgroup.support(node, str(root), controllers=controllers)
    try:
        enabled = (folder / "cgroup.controllers").read_text()
    except OSError:
        enabled = ""
    return podcgroup.support(node, str(root), controllers=controllers, folder=str(folder),
                             folder_controllers=enabled,
                             folder_io_max=(folder / "io.max").exists())  # fmt: skip


class NodeCondition:
    """This node's condition, written when the answer changes."""

    def __init__(self, client: AsyncClient, node: str, root: Path | None) -> None:
        self.client = client
        self.node = node
        self.root = root
        self.said: Support | None = None  # what the Node shows, as this process wrote or read it
        self._lock = asyncio.Lock()

    @property
    def confirmed(self) -> bool:
        """Whether the Node says a pod's cgroup took a limit (nothing left to check)."""
        return self.said is not None and self.said.reason == podcgroup.SUPPORTED

    async def start(self) -> None:
        """Say what the node's cgroups allow (retried while the API server cannot be reached)."""
        support = await asyncio.to_thread(read_support, self.node, self.root)
        if not support.ok:
            log.warning("IO limits cannot be put in force on this node",
                        extra={"reason": support.reason, "why": support.message})  # fmt: skip
        await self.report(support, retry=True)

    async def report(self, support: Support, *, retry: bool = False) -> None:
        """Say ``support`` (a sync met a node-wide cause, or found the pods' cgroups fine);
        ``retry``: while the API server cannot be reached. A failure (RBAC, an admission
        policy: the node works on without it) is logged; the next report tries again."""
        try:
            if retry:
                await api.retry_transient(lambda: self._write(support), "io limits: node "
                                          "condition", first=1.0, most=30.0)  # fmt: skip
            else:
                await self._write(support)
        except kube.KubeError as e:
            log.warning("io limits: cannot set the Node condition",
                        extra={"condition": NODE_CONDITION, "error": kube.describe(e)})  # fmt: skip

    async def _write(self, support: Support) -> None:
        async with self._lock:
            if support == self.said or (support.reason == podcgroup.UNCHECKED and self.said):
                return  # said already, or a vaguer answer than the one said
            node = await api.get(self.client, Node, self.node)
            if node is None:
                return
            conditions = (node.get("status") or {}).get("conditions") or []
            patch = condition_patch(support, conditions, stamps.now())
            if patch is not None:
                await api.patch_strategic(self.client, Node.Status, self.node, patch)
                log.info("node condition set", extra={"condition": NODE_CONDITION,
                         "status": not support.ok, "reason": support.reason})  # fmt: skip
            self.said = support

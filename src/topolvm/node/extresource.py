"""Advertises ``<plugin>/capacity`` (``topolvm.io/capacity``) as an extended resource of this
node, so that the pod webhook's marker can never strand a pod.

Upstream's pod webhook puts ``<plugin>/capacity: 1`` in the requests and limits of container 0
of every pod with a TopoLVM volume. Only a kube-scheduler wired to topolvm-scheduler with
``managedResources: [{name: <plugin>/capacity, ignoredByScheduler: true}]`` ignores it; without
that wiring, kube-scheduler's NodeResourcesFit rejects every node with ``Insufficient
<plugin>/capacity`` and the pods stay Pending. A node that advertises the resource passes that
check: the pod schedules, only without capacity filtering and scoring.

The count is :data:`ADVERTISED_COUNT`. Its size does not matter as long as it is never reached:
each pod takes exactly 1 (the webhook puts "1" on one container), and the number of pods on a
node is bounded by its ``pods`` allocatable (kubelet's ``--max-pods``, 110 by default). The
resource says nothing about free space; the capacity annotations do.

The resource is written the way Kubernetes documents advertising a node-level extended resource
(a PATCH of the Node's ``status`` subresource), to ``status.capacity`` and
``status.allocatable``: kubelet copies capacity to allocatable for resources it does not manage,
and there is no kubelet in some environments (the test bed). kubelet keeps such resources; it
only zeroes every extended resource when it re-registers a Node whose device-plugin checkpoint
is gone (a re-provisioned machine), so :func:`sync` treats a missing *or different* count as
"not advertised" and writes it again.
"""

from __future__ import annotations

import logging
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from topolvm.k8s import api
from topolvm.k8s.lvobject import InvalidQuantity, parse_quantity

log = logging.getLogger(__name__)

ADVERTISED_COUNT = 1_000_000
"""Never reached: each pod takes 1, and max-pods (110 by default) bounds the pods of a node."""

_FIELDS = ("capacity", "allocatable")


def _count(value: Any) -> int | None:
    try:
        return parse_quantity(value)
    except InvalidQuantity:
        return None


def advertised(node: api.Obj, resource: str) -> dict[str, int | None]:
    """``{"capacity": n, "allocatable": n}`` of ``resource`` on ``node`` (None = absent or not a
    quantity). The API server stores quantities in canonical form ("1000000" reads back "1M")."""
    status = node.get("status") or {}
    out: dict[str, int | None] = {}
    for key in _FIELDS:
        value = (status.get(key) or {}).get(resource)
        out[key] = None if value is None else _count(value)
    return out


def needs_patch(node: api.Obj, resource: str, enabled: bool) -> bool:
    """True when the Node does not already show what ``enabled`` asks for."""
    counts = advertised(node, resource).values()
    if enabled:
        return any(c != ADVERTISED_COUNT for c in counts)
    status = node.get("status") or {}
    return any(resource in (status.get(key) or {}) for key in _FIELDS)


def status_patch(resource: str, enabled: bool) -> api.Obj:
    """A JSON merge patch for the ``status`` subresource; ``null`` removes the key."""
    value = str(ADVERTISED_COUNT) if enabled else None
    return {"status": {key: {resource: value} for key in _FIELDS}}


async def sync(
    client: AsyncClient, node_name: str, resource: str, enabled: bool, node: api.Obj
) -> bool:
    """Make ``node`` (as just read) advertise ``resource`` (or not, when ``enabled`` is False).
    Only writes when the Node differs; returns True if it wrote."""
    if not needs_patch(node, resource, enabled):
        return False
    before = advertised(node, resource)
    await api.patch_merge(client, Node.Status, node_name, status_patch(resource, enabled))
    if enabled:
        log.info(
            f"advertising extended resource {resource}={ADVERTISED_COUNT} on the Node, so that "
            f"pods carrying the {resource} marker schedule even without the scheduler extender",
            extra={"node": node_name, "before": before},
        )
    else:
        log.info(
            f"removed extended resource {resource} from the Node "
            "(--advertise-capacity-resource=false)",
            extra={"node": node_name, "before": before},
        )
    return True

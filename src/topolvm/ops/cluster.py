"""What ``topolvm move`` and ``topolvm drain`` read and write, through :mod:`topolvm.k8s.api`
(objects as the API's JSON; errors are :mod:`topolvm.k8s.errors`)."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from lightkube import ALL_NS, AsyncClient
from lightkube.generic_resource import create_global_resource, create_namespaced_resource

from topolvm.constants import Names
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.moveobject import (
    GROUP,
    PLURAL,
    MovePhase,
    OldVolume,
    VolumeMoveObject,
    manifest,
)
from topolvm.move import reads
from topolvm.move.reads import NODE, POD, PV, PVC
from topolvm.move.rules import Refused, uses_claim
from topolvm.ops.preflight import Facts, Obj, Plan, copy_rates, find_lv, past_downtimes

log = logging.getLogger(__name__)

STORAGE_CLASS = create_global_resource("storage.k8s.io", "v1", "StorageClass", "storageclasses")
PDB = create_namespaced_resource("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets")
DELETE_WAIT = 30.0  # seconds a finished VolumeMove may take to go before a new one replaces it


class CannotCheck(Exception):
    """The cluster could not be read or written as needed (exit code 2)."""


def default_kubeconfig() -> str | None:
    """kubectl's order: $KUBECONFIG (its first file), ~/.kube/config; None: in-cluster."""
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"].split(os.pathsep)[0]
    home = os.path.expanduser("~/.kube/config")
    return home if os.path.exists(home) else None


def move_resource(names: Names) -> Any:
    """The namespaced VolumeMove resource (``topolvm.io`` in either mode)."""
    return api.volumemove_resource(names)


def name_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


@dataclass
class Common:
    """What every claim's pre-flight shares: nodes, LogicalVolumes, StorageClasses."""

    nodes: list[Obj]
    lvs: list[Obj]
    storage_classes: dict[str, Obj]
    # (downtimeSeconds, deltaBytes) of the finished VolumeMoves (the estimate's stop and start)
    downtimes: list[tuple[float, int]] = field(default_factory=list)

    def device_class(self, pvc: Obj | None, lv: Obj | None, names: Names) -> str:
        """The claim's device class ("" is the default): its LogicalVolume's, as the
        controller reads it, else its StorageClass's parameter."""
        if lv is not None:
            return str((lv.get("spec") or {}).get("deviceClass") or "")
        sc = self.storage_classes.get(str(((pvc or {}).get("spec") or {}).get("storageClassName")))
        return str(((sc or {}).get("parameters") or {}).get(names.device_class_param) or "")


async def read_common(client: AsyncClient, names: Names) -> Common:
    async def lvs() -> list[Obj]:
        try:
            return (await api.list_all(client, api.logicalvolume_resource(names)))[0]
        except kube.NotFound:  # no LogicalVolume CRD: no volume, no measured rate
            return []

    async def downtimes() -> list[tuple[float, int]]:
        try:
            return past_downtimes((await list_moves(client, names)).values())
        except kube.KubeError as e:  # one who may not list every namespace's: assumed
            log.info("the finished moves cannot be read; the estimate assumes the pod's stop "
                     "and start", extra={"error": kube.describe(e)})  # fmt: skip
            return []

    nodes, volumes, classes, past = await asyncio.gather(
        api.list_all(client, NODE), lvs(), api.list_all(client, STORAGE_CLASS), downtimes()
    )
    return Common(nodes[0], volumes, {name_of(sc): sc for sc in classes[0]}, past)


async def claim_facts(
    client: AsyncClient, names: Names, common: Common, namespace: str, claim: str,
    *, pvc: Obj | None = None, pods: list[Obj] | None = None,
    existing: VolumeMoveObject | None = None, read_existing: bool = True,
) -> Facts:  # fmt: skip
    """Read what the pre-flight of ``namespace/claim`` needs; what the caller has read
    already (``pvc``, the namespace's ``pods``, with ``read_existing=False`` the ``existing``
    VolumeMove of the claim) is not read again."""
    if pvc is None:
        pvc = await api.get(client, PVC, claim, namespace=namespace)
    volume = str(((pvc or {}).get("spec") or {}).get("volumeName") or "")
    pv = await api.get(client, PV, volume) if volume else None
    if pods is None:
        pods = (await api.list_all(client, POD, namespace=namespace))[0]
    if read_existing:
        raw = await api.get(client, move_resource(names), claim, namespace=namespace)
        existing = None if raw is None else VolumeMoveObject.from_dict(raw)
    users = [p for p in pods if uses_claim(p, claim)]
    local = await reads.local_claims(client, names.plugin, namespace, users, claim)
    lv = find_lv(common.lvs, pv)
    dc = common.device_class(pvc, lv, names)
    return Facts(
        namespace=namespace, claim=claim, pvc=pvc, pv=pv, pods=pods,
        replicaset_owner=await reads.replicaset_owners(client, namespace, users),
        device_class=dc, free=reads.free_bytes(common.nodes, names, dc),
        schedulable=reads.schedulable_nodes(common.nodes),
        lv=lv, rates=copy_rates(common.lvs), downtimes=common.downtimes,
        existing=existing, local_claims=local, unfit=reads.unfit_nodes(common.nodes, users),
    )  # fmt: skip


async def group_facts(
    client: AsyncClient, names: Names, common: Common, namespace: str, claim: str,
    *, pvc: Obj | None = None, pods: list[Obj] | None = None,
    moves: dict[str, VolumeMoveObject] | None = None,
) -> list[Facts]:  # fmt: skip
    """The facts of ``claim`` and of the other node-local claims of its pod (which move with
    it), that claim's first. ``moves``: every VolumeMove by ``namespace/name``, read already."""

    def existing(name: str) -> dict[str, Any]:
        if moves is None:
            return {}
        return {"existing": moves.get(f"{namespace}/{name}"), "read_existing": False}

    first = await claim_facts(
        client, names, common, namespace, claim, pvc=pvc, pods=pods, **existing(claim)
    )
    group = [first]
    for other in sorted(first.local_claims):
        group.append(await claim_facts(
            client, names, common, namespace, other, pods=first.pods, **existing(other)
        ))  # fmt: skip
    return group


async def list_moves(client: AsyncClient, names: Names) -> dict[str, VolumeMoveObject]:
    """Every VolumeMove by ``namespace/name`` (none when its CRD is not installed)."""
    try:
        items, _ = await api.list_all(client, move_resource(names), namespace=ALL_NS)
    except kube.NotFound:
        return {}
    moves = (VolumeMoveObject.from_dict(o) for o in items)
    return {f"{m.namespace}/{m.name}": m for m in moves}


async def get_move(
    client: AsyncClient, names: Names, namespace: str, name: str
) -> VolumeMoveObject | None:
    raw = await api.get(client, move_resource(names), name, namespace=namespace)
    return None if raw is None else VolumeMoveObject.from_dict(raw)


async def start_moves(client: AsyncClient, names: Names, plans: list[Plan]) -> None:
    """Create the VolumeMoves of ``plans`` (a claim, or a pod's claims that move together).
    First the finished VolumeMoves of those claims go (they are named after their claims, and
    an earlier move's would confuse the new ones); if one cannot be created, the others are
    cancelled (they would wait for it). Refused when a move of one is in progress;
    CannotCheck when the VolumeMove CRD is not installed."""
    for plan in plans:
        if plan.replaces:
            await _replace_done(client, names, plan.namespace, plan.claim)
    created: list[Plan] = []
    try:
        for plan in plans:
            await _create_move(client, names, plan)
            created.append(plan)
    except BaseException:
        for plan in created:
            await cancel_move(client, names, plan.namespace, plan.claim)
        raise


async def _replace_done(client: AsyncClient, names: Names, namespace: str, claim: str) -> None:
    res = move_resource(names)
    old = await get_move(client, names, namespace, claim)
    if old is not None and not old.done:
        raise Refused(
            "MoveInProgress", f"a move of claim {claim} is in progress: phase {old.status.phase}"
        )
    if old is None:
        return
    if old.status.phase == MovePhase.SUCCEEDED and old.status.old_volume == OldVolume.KEPT:
        raise Refused(  # deleting it would end the keep, and remove the old volume, at once
            "KeepingSource", f"the last move of claim {claim} keeps its old volume until "
            f"{old.status.keep_source_until or '(unknown)'}; to end that keep (the old volume "
            f"is then removed) and move again: kubectl delete volumemove -n {namespace} {claim}"
        )  # fmt: skip
    try:  # only that finished one: a VolumeMove made meanwhile under the name is another UID
        await api.delete(client, res, claim, namespace=namespace, uid=old.uid)
    except kube.PreconditionFailed:
        raise Refused("MoveInProgress", f"another move of claim {claim} was just asked "
                      "for") from None  # fmt: skip
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DELETE_WAIT
    while await api.get(client, res, claim, namespace=namespace) is not None:
        if loop.time() > deadline:
            raise Refused(
                "MoveInProgress", f"the finished VolumeMove of claim {claim} is still being "
                "deleted: try again once it is gone"
            )  # fmt: skip
        await asyncio.sleep(0.5)


async def _create_move(client: AsyncClient, names: Names, plan: Plan) -> None:
    body = manifest(GROUP, plan.namespace, plan.claim, plan.target_node, plan.together,
                    plan.keep_source_seconds)  # fmt: skip
    try:
        await api.create(client, move_resource(names).from_dict(body))
    except kube.AlreadyExists:
        current = await get_move(client, names, plan.namespace, plan.claim)
        phase = current.status.phase if current is not None else "unknown"
        raise Refused(
            "MoveInProgress", f"a move of claim {plan.claim} is in progress: phase {phase}"
        ) from None
    except kube.NotFound as e:
        raise CannotCheck(
            f"the VolumeMove resource ({PLURAL}.{names.group}) is not served: install or "
            f"upgrade TopoLVM's CRDs ({e})"
        ) from e


async def cancel_move(client: AsyncClient, names: Names, namespace: str, name: str) -> None:
    """Delete a VolumeMove (before its swap, topolvm-controller rolls it back)."""
    await api.delete(client, move_resource(names), name, namespace=namespace)


async def set_cordon(client: AsyncClient, node: str, cordoned: bool) -> None:
    """Cordon (``spec.unschedulable: true``) or uncordon ``node``."""
    await api.patch_merge(
        client, NODE, node, {"spec": {"unschedulable": True if cordoned else None}}
    )

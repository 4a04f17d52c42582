"""What a move's checks read from the cluster, the same for topolvm-controller (before it starts
a VolumeMove) and for ``topolvm move``/``drain`` (before they create one): the pods' owners,
a pod's node-local claims, and the nodes' free bytes and schedulability. Objects are the API's
JSON, read through :mod:`topolvm.k8s.api` (errors are :mod:`topolvm.k8s.errors`)."""

from __future__ import annotations

from collections.abc import Iterable

from lightkube import AsyncClient
from lightkube.generic_resource import create_global_resource, create_namespaced_resource

from topolvm.capacity_annotations import parse_node_value
from topolvm.constants import Names
from topolvm.k8s import api
from topolvm.move import fits
from topolvm.move.rules import Obj, claims_of, uses_claim

PVC = create_namespaced_resource("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims")
PV = create_global_resource("", "v1", "PersistentVolume", "persistentvolumes")
POD = create_namespaced_resource("", "v1", "Pod", "pods")
NODE = create_global_resource("", "v1", "Node", "nodes")
REPLICA_SET = create_namespaced_resource("apps", "v1", "ReplicaSet", "replicasets")
DEPLOYMENT = create_namespaced_resource("apps", "v1", "Deployment", "deployments")


async def replicaset_owners(
    client: AsyncClient, namespace: str, pods: Iterable[Obj]
) -> dict[str, tuple[str, str, int]]:
    """ReplicaSet → (its controller's kind, name, Deployment's ``spec.replicas``) for the
    ReplicaSets that control ``pods`` (see :func:`topolvm.move.rules.workload`)."""
    wanted = {
        str(ref.get("name"))
        for pod in pods
        for ref in (pod.get("metadata") or {}).get("ownerReferences") or []
        if ref.get("controller") and ref.get("kind") == "ReplicaSet"
    }
    out: dict[str, tuple[str, str, int]] = {}
    for rs_name in sorted(wanted):
        rs = await api.get(client, REPLICA_SET, rs_name, namespace=namespace)
        refs = ((rs or {}).get("metadata") or {}).get("ownerReferences") or []
        owner = next((r for r in refs if r.get("controller")), None)
        if owner is None:
            continue  # rules.workload reads it as a bare ReplicaSet
        kind, name = str(owner.get("kind") or ""), str(owner.get("name") or "")
        replicas = 0
        if kind == "Deployment":
            deploy = await api.get(client, DEPLOYMENT, name, namespace=namespace)
            if deploy is None:
                continue  # orphaned: nothing re-creates its pod for a Deployment
            value = (deploy.get("spec") or {}).get("replicas")
            replicas = 1 if value is None else int(value)  # the API's default is 1
        out[rs_name] = (kind, name, replicas)
    return out


async def local_claims(
    client: AsyncClient, plugin: str, namespace: str, pods: Iterable[Obj], claim: str
) -> dict[str, str]:
    """The other claims of the pods that use ``claim`` whose volumes are ``plugin``'s
    (claim → driver): node-local too, so they must move with it."""
    out: dict[str, str] = {}
    users = [p for p in pods if uses_claim(p, claim)]
    for other in sorted({c for p in users for c in claims_of(p)} - {claim}):
        pvc = await api.get(client, PVC, other, namespace=namespace)
        volume = str(((pvc or {}).get("spec") or {}).get("volumeName") or "")
        pv = await api.get(client, PV, volume) if volume else None
        driver = (((pv or {}).get("spec") or {}).get("csi") or {}).get("driver")
        if driver == plugin:
            out[other] = str(driver)
    return out


def free_bytes(nodes: Iterable[Obj], names: Names, device_class: str) -> dict[str, int]:
    """Node → free bytes of ``device_class``, for nodes whose topolvm-node reports it (the
    ``capacity.<plugin>/<class>`` annotation); unreadable values are left out."""
    key = names.capacity_annotation(device_class)
    out: dict[str, int] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        value = (meta.get("annotations") or {}).get(key)
        if value is None:
            continue
        parsed = parse_node_value(str(value))
        if parsed is not None:
            out[str(meta.get("name"))] = parsed
    return out


def is_ready(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def unfit_nodes(nodes: Iterable[Obj], pods: Iterable[Obj]) -> dict[str, str]:
    """The nodes one of ``pods`` may not run on (taints, node selector, required node
    affinity: :mod:`topolvm.move.fits`), and why."""
    out: dict[str, str] = {}
    pods = list(pods)
    for n in nodes:
        why = next((w for p in pods if (w := fits.refusal(p, n))), "")
        if why:
            out[str((n.get("metadata") or {}).get("name"))] = why
    return out


def schedulable_nodes(nodes: Iterable[Obj]) -> frozenset[str]:
    """Nodes that are neither cordoned (``spec.unschedulable``) nor not Ready."""
    return frozenset(
        str((n.get("metadata") or {}).get("name"))
        for n in nodes
        if not (n.get("spec") or {}).get("unschedulable") and is_ready(n)
    )

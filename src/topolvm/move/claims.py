"""The swap of a move (pure): the new PersistentVolume on the target node, and the claim
re-created under its name bound to it (docs/mobility.md, "Move").

A PV's node affinity and a claim's ``volumeName`` cannot change, so the claim's volume is
swapped by a new PV (the target's LV, pre-bound to the claim by ``claimRef``) and the claim
re-created with the same name, labels, annotations and spec, ``volumeName`` set to the new PV.
What pointed at the old volume or node is left out.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

from topolvm.k8s.moveobject import MovePhase

Obj = dict[str, Any]
GATE = "move"  # the scheduling gate is <plugin>/move
# set by the PV controller, the scheduler and the provisioner for the old binding
_DROPPED_ANNOTATIONS = (
    "pv.kubernetes.io/bind-completed",
    "pv.kubernetes.io/bound-by-controller",
    "volume.kubernetes.io/selected-node",
    "kubectl.kubernetes.io/last-applied-configuration",
)


def gate_name(plugin: str) -> str:
    return f"{plugin}/{GATE}"


def claim_template(pvc: Obj) -> str:
    """What re-creates the claim: its labels, annotations (less the old binding's) and spec."""
    meta = pvc.get("metadata") or {}
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k not in _DROPPED_ANNOTATIONS
    }
    spec = copy.deepcopy(pvc.get("spec") or {})
    for key in ("volumeName", "dataSource", "dataSourceRef"):
        spec.pop(key, None)
    template = {"labels": meta.get("labels") or {}, "annotations": annotations, "spec": spec}
    return json.dumps(template, sort_keys=True, separators=(",", ":"))


def new_claim(template: str, namespace: str, name: str, pv_name: str) -> Obj:
    """The claim re-created from ``template``, bound to ``pv_name``."""
    t = json.loads(template)
    spec = dict(t.get("spec") or {})
    spec["volumeName"] = pv_name
    meta: Obj = {"name": name, "namespace": namespace}
    if t.get("labels"):
        meta["labels"] = t["labels"]
    if t.get("annotations"):
        meta["annotations"] = t["annotations"]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}


def new_volume(
    old_pv: Obj, name: str, volume_id: str, node: str, topology_key: str, reclaim_policy: str,
    namespace: str, claim: str, plugin: str,
) -> Obj:  # fmt: skip
    """The PV of the moved volume: the old one's class, size, modes and CSI attributes, on
    ``node``, pre-bound to the claim ``namespace/claim`` (any UID: the re-created claim's)."""
    old = old_pv.get("spec") or {}
    csi = copy.deepcopy(old.get("csi") or {})
    csi["volumeHandle"] = volume_id
    spec: Obj = {
        "capacity": copy.deepcopy(old.get("capacity") or {}),
        "accessModes": list(old.get("accessModes") or ["ReadWriteOnce"]),
        "persistentVolumeReclaimPolicy": reclaim_policy or "Delete",
        "storageClassName": old.get("storageClassName") or "",
        "volumeMode": old.get("volumeMode") or "Filesystem",
        "csi": csi,
        "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                     "namespace": namespace, "name": claim},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": topology_key, "operator": "In", "values": [node]}]}]}},
    }  # fmt: skip
    if old.get("mountOptions"):
        spec["mountOptions"] = list(old["mountOptions"])
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": plugin}},
        "spec": spec,
    }


def gated(pod: Obj, gate: str) -> bool:
    return any(g.get("name") == gate for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def without_gate(pod: Obj, gate: str) -> list[Obj]:
    return [
        g for g in (pod.get("spec") or {}).get("schedulingGates") or [] if g.get("name") != gate
    ]


def stale_gates(pods: Iterable[Obj], moves: Iterable[Obj], gate: str) -> list[Obj]:
    """The pods held by ``gate`` none of whose claims has a move in progress: a VolumeMove
    (``moves``, the API's JSON) of that claim in the pod's namespace, named after it or naming
    it in ``spec.claim``, whose phase is not done nor Verifying (its pod was let go, and no
    pod is held after). Those the gate sweep lets go."""
    active: set[tuple[str, str]] = set()
    for move in moves:
        meta = move.get("metadata") or {}
        phase = (move.get("status") or {}).get("phase") or "Pending"
        if phase in MovePhase.DONE or phase == MovePhase.VERIFYING:
            continue
        ns = str(meta.get("namespace") or "")
        active.add((ns, str(meta.get("name") or "")))
        active.add((ns, str((move.get("spec") or {}).get("claim") or "")))
    out = []
    for pod in pods:
        if not gated(pod, gate):
            continue
        ns = str((pod.get("metadata") or {}).get("namespace") or "")
        if not any((ns, c) in active for c in _claims(pod)):
            out.append(pod)
    return out


def _claims(pod: Obj) -> list[str]:
    return [
        str(v["persistentVolumeClaim"]["claimName"])
        for v in (pod.get("spec") or {}).get("volumes") or []
        if isinstance(v, dict) and (v.get("persistentVolumeClaim") or {}).get("claimName")
    ]

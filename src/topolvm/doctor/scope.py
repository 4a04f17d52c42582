"""What ``topolvm doctor`` looks at: everything, a namespace, a pod or a PVC. A finding stays in
a scope when it concerns an object of the scope or one those objects depend on (a pod's PVCs,
their StorageClasses, PVs, LogicalVolumes and nodes), or is a cluster-wide configuration
problem (CSIDriver, webhook configuration, API-group mixtures)."""

from __future__ import annotations

from dataclasses import dataclass

from topolvm.doctor.model import Finding, Ref
from topolvm.doctor.snapshot import Obj, Snapshot, annotations_of, claims_of, name_of, ns_of


class ScopeError(Exception):
    """The pod or PVC to look at does not exist."""


@dataclass(frozen=True)
class Scope:
    namespace: str = ""
    pod: str = ""
    pvc: str = ""

    def __str__(self) -> str:
        if self.pod:
            return f"pod {self.namespace}/{self.pod}"
        if self.pvc:
            return f"PVC {self.namespace}/{self.pvc}"
        return f"namespace {self.namespace}" if self.namespace else "the whole cluster"

    def related(self, snap: Snapshot) -> set[Ref] | None:
        """The objects in scope and what they depend on; None for the whole cluster."""
        if not (self.namespace or self.pod or self.pvc):
            return None
        refs: set[Ref] = set()
        pods: list[Obj] = []
        pvcs: list[Obj] = []
        if self.pod:
            pod = snap.get("pods", self.pod, self.namespace)
            if pod is None:
                raise ScopeError(f"pod {self.namespace}/{self.pod} not found")
            pods = [pod]
        elif self.pvc:
            pvc = snap.get("pvcs", self.pvc, self.namespace)
            if pvc is None and not _moved(snap, self.namespace, self.pvc):
                raise ScopeError(f"PVC {self.namespace}/{self.pvc} not found")
            # a claim that a move re-creates (Swapping) may be gone for a moment
            refs.add(Ref("PersistentVolumeClaim", self.pvc, self.namespace))
            pvcs = [] if pvc is None else [pvc]
            pods = [p for p in snap["pods"]
                    if ns_of(p) == self.namespace and self.pvc in claims_of(p)]  # fmt: skip
        else:
            pods = [p for p in snap["pods"] if ns_of(p) == self.namespace]
            pvcs = [c for c in snap["pvcs"] if ns_of(c) == self.namespace]
            moves = [m for m in _moves(snap) if ns_of(m) == self.namespace]
            if not pods and not pvcs and not moves and "pods" not in snap.unreadable:
                raise ScopeError(f"namespace {self.namespace} has no pods and no PVCs")
        for pod in pods:
            refs.add(Ref("Pod", name_of(pod), ns_of(pod)))
            if node := (pod.get("spec") or {}).get("nodeName"):
                refs.add(Ref("Node", str(node)))
            for claim in claims_of(pod):
                if (c := snap.get("pvcs", claim, ns_of(pod))) is not None:
                    pvcs.append(c)
        for pvc in pvcs:
            refs.add(Ref("PersistentVolumeClaim", name_of(pvc), ns_of(pvc)))
            spec = pvc.get("spec") or {}
            if sc := spec.get("storageClassName"):
                refs.add(Ref("StorageClass", str(sc)))
            if node := annotations_of(pvc).get("volume.kubernetes.io/selected-node"):
                refs.add(Ref("Node", str(node)))
            pv = (
                snap.get("pvs", str(spec.get("volumeName", ""))) if spec.get("volumeName") else None
            )
            if pv is not None:
                handle = ((pv.get("spec") or {}).get("csi") or {}).get("volumeHandle")
                for kind in ("logicalvolumes", "legacy-logicalvolumes"):
                    for lv in snap[kind]:
                        if (lv.get("status") or {}).get("volumeID") == handle:
                            refs.add(Ref("LogicalVolume", name_of(lv)))
                            refs.add(Ref("Node", str((lv.get("spec") or {}).get("nodeName"))))
        # The VolumeMoves of the claims in scope (of every claim of the namespace).
        for move in _moves(snap):
            moved = Ref("PersistentVolumeClaim", move_claim(move), ns_of(move))
            if moved in refs or (not (self.pod or self.pvc) and ns_of(move) == self.namespace):
                refs.add(Ref("VolumeMove", name_of(move), ns_of(move)))
                refs.add(moved)
        return refs

    def keep(self, finding: Finding, related: set[Ref] | None) -> bool:
        if related is None or finding.cluster_wide:
            return True
        return any(s in related for s in finding.subjects)


def _moves(snap: Snapshot) -> list[Obj]:
    return [*snap["volumemoves"], *snap["legacy-volumemoves"]]


def move_claim(move: Obj) -> str:
    """The claim a VolumeMove moves (``spec.claim``, in the move's namespace)."""
    return str((move.get("spec") or {}).get("claim") or "")


def _moved(snap: Snapshot, namespace: str, claim: str) -> bool:
    return any(ns_of(m) == namespace and move_claim(m) == claim for m in _moves(snap))

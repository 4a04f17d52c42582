"""What ``topolvm doctor`` says of a move's verification (docs/mobility.md, "Verified before
the source goes"), for its volume-move check (:mod:`topolvm.doctor.checks.volume_moves`; kept
here, as a module of the checks package is a check of its own). A move that did not verify
(phase Unverified: the digests differ, or one could not be made) keeps its old volume for good;
the finding names both volumes and digests, and the two ways out: keep the moved data (remove
the old volume) or go back to the old data. A move waiting for a verification says which node
it waits for."""

from __future__ import annotations

from topolvm.constants import Names
from topolvm.doctor.model import Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import Obj, Snapshot
from topolvm.k8s.moveobject import MovePhase, Verified, VolumeMoveObject

ID = "volume-move"
DOC = 'docs/mobility.md, "Getting the old data back"'


def verify_line(snap: Snapshot, lv_kind: str, role: str, name: str, uid: str) -> str:
    """One line of evidence: a volume's ``status.verify`` for the move ``uid``."""
    lv = snap.get(lv_kind, name) if name else None
    if lv is None:
        return f"{role} LogicalVolume {name or '?'}: not found"
    node = (lv.get("spec") or {}).get("nodeName") or "?"
    st = ((lv.get("status") or {}).get("verify")) or {}
    if st.get("id") != uid:
        return f"{role} LogicalVolume {name} on node {node}: no verification of this move yet"
    said = ", ".join(f"{k}={st[k]}" for k in ("phase", "digest", "sizeBytes", "message")
                     if st.get(k))  # fmt: skip
    return f"{role} LogicalVolume {name} on node {node}: status.verify {said}"


def waiting_node(snap: Snapshot, lv_kind: str, move: VolumeMoveObject) -> str:
    """The node whose digest (or, Starting, whose cut) the move waits for ("": none)."""
    st = move.status
    wanted = ("Cut", "Done", "Failed") if st.phase == MovePhase.STARTING else ("Done", "Failed")
    sides = [(st.target_volume, st.target_node)]
    if st.phase == MovePhase.VERIFYING:
        sides.append((st.source_volume, st.source_node))
    for name, node in sides:
        lv = snap.get(lv_kind, name) if name else None
        verify = ((lv or {}).get("status") or {}).get("verify") or {}
        if lv is not None and (verify.get("id") != move.uid or verify.get("phase") not in wanted):
            return node
    return ""


def _scale(move: VolumeMoveObject, replicas: int) -> str:
    kind, _, name = move.status.owner.partition("/")
    return f"kubectl scale -n {move.namespace} {kind.lower() or 'statefulset'}/{name or '?'} " \
        f"--replicas={replicas}"  # fmt: skip


def unverified(snap: Snapshot, obj: Obj, names: Names, lv_kind: str) -> Finding:
    """The finding for a move in phase Unverified."""
    move = VolumeMoveObject.from_dict(obj)
    st = move.status
    claim = f"{move.namespace}/{move.claim}"
    cond = st.condition(Verified.TYPE)
    reason = st.reason or (cond.reason if cond else "") or Verified.FAILED
    old_pv, src, source = st.old_pv or "?", st.source_volume or "?", st.source_node or "?"
    target = st.target_node or "?"
    show = f"kubectl get volumemoves.{names.group} -n {move.namespace} {move.name} -o yaml"
    evidence = (
        f"VolumeMove {claim}: phase=Unverified, reason={reason}, message: {st.message}",
        verify_line(snap, lv_kind, "source", st.source_volume, move.uid),
        verify_line(snap, lv_kind, "target", st.target_volume, move.uid),
        f"old PersistentVolume {old_pv}: "
        + ("present (Retain)" if snap.get("pvs", old_pv) is not None else "not found"),
    )
    if reason == Verified.MISMATCH:
        cause = (f"the digest of the moved volume as of the swap differs from the old volume's "
                 f"(source {st.source_digest or '?'}, target {st.target_digest or '?'}): the "
                 f"copy is not known to be whole")  # fmt: skip
    else:
        cause = f"the copy could not be verified: {cond.message if cond else st.message}"
    keep_new = Fix(
        f"If the application's data on node {target} is right (check it: the pod runs there), "
        f"remove the old volume, kept until you do: the old PV {old_pv} (Retain: deleting it "
        f"keeps the LV) then its LogicalVolume {src} on node {source}; then the VolumeMove.",
        (f"kubectl delete pv {old_pv}", f"kubectl delete logicalvolumes.{names.group} {src}",
         f"kubectl delete volumemoves.{names.group} -n {move.namespace} {move.name}"),
    )  # fmt: skip
    go_back = Fix(
        f"To go back to the old data (node {source}, as of the swap; what the pod wrote on node "
        f"{target} since is lost): stop the pod, keep the new PV, bind the claim to the old PV "
        f"again, start the pod ({DOC}).",
        (_scale(move, 0),
         f"kubectl patch pv {st.new_pv or '?'} -p "
         "'{\"spec\":{\"persistentVolumeReclaimPolicy\":\"Retain\"}}'",
         f"kubectl delete pvc -n {move.namespace} {move.claim}",
         f"kubectl patch pv {old_pv} --type json -p "
         "'[{\"op\":\"remove\",\"path\":\"/spec/claimRef\"}]'",
         f"# re-create claim {claim} with spec.volumeName: {old_pv} (its size, class, modes)",
         _scale(move, 1)),
    )  # fmt: skip
    fixes = (keep_new, go_back) if reason != Verified.MISMATCH else (go_back, keep_new)
    return Finding(
        ID, Severity.ERROR,
        f"move of claim {claim} from node {source} to node {target} is not verified "
        f"({reason}): the old volume {old_pv} is kept",
        cause, (*evidence, f"inspect: {show}"), fixes,
        (Ref("VolumeMove", move.name, move.namespace),
         Ref("PersistentVolumeClaim", move.claim, move.namespace)),
        (*(Ref("Node", n) for n in dict.fromkeys((source, target)) if n != "?"),
         Ref("PersistentVolume", old_pv), Ref("LogicalVolume", src)),
    )  # fmt: skip

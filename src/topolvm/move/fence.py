"""What a move may delete (pure; docs/mobility.md, "Fencing").

A VolumeMove's status is written by whoever may write ``volumemoves/status``, and a pass of
topolvm-controller may run on a stale read (a former leader that wakes after a pause). So the
names a move deletes are never taken from its status alone: each object is checked against
what it must be, and deleted with its UID (and resourceVersion) as preconditions:

- the target LogicalVolume and the new PV are named after the VolumeMove's own UID
  (``move-<uid>``, :func:`topolvm.k8s.moveobject.made_name`);
- the old PV is the one whose ``claimRef`` names the move's claim with the UID the claim had
  before the move (:func:`claim_volume`), and is deleted only once no claim is bound to it
  (:func:`released`);
- the source LogicalVolume is the one whose volume id is the old PV's ``volumeHandle``;
- a rollback deletes the new PV only while no claim is bound to it and no pod uses it
  (:func:`unbound`), and the target LogicalVolume only while no PV but that one refers to it
  (:func:`unreferenced`).

Each function returns "" when the object may be acted on, else why not (for logs, events and
the move's message). Objects are the API's JSON.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Obj = dict[str, Any]


def _spec(obj: Obj | None) -> Obj:
    return (obj or {}).get("spec") or {}


def _meta(obj: Obj | None) -> Obj:
    return (obj or {}).get("metadata") or {}


def handle_of(pv: Obj | None) -> str:
    """The PV's CSI volume id (the LogicalVolume's ``status.volumeID``)."""
    return str((_spec(pv).get("csi") or {}).get("volumeHandle") or "")


def claim_volume(pv: Obj | None, namespace: str, claim: str, claim_uid: str, driver: str) -> str:
    """ "" when ``pv`` is the volume of claim ``namespace/claim`` as it was before the move
    (UID ``claim_uid``) and a volume of ``driver``."""
    if pv is None:
        return "it does not exist"
    name = _meta(pv).get("name", "?")
    ref = _spec(pv).get("claimRef") or {}
    got = f"{ref.get('namespace', '')}/{ref.get('name', '')}"
    if not claim_uid:
        return f"PV {name}: the move recorded no claim UID to check it against"
    if got != f"{namespace}/{claim}" or ref.get("uid") != claim_uid:
        return (f"PV {name} is not claim {namespace}/{claim}'s (UID {claim_uid}): its claimRef "
                f"is {got} (UID {ref.get('uid') or 'none'})")  # fmt: skip
    csi_driver = (_spec(pv).get("csi") or {}).get("driver", "")
    if csi_driver != driver:
        return f"PV {name} is provisioned by {csi_driver or 'no CSI driver'}, not {driver}"
    return ""


def released(pv: Obj, pvc: Obj | None, claim_uid: str) -> str:
    """ "" when no claim is bound to the old PV ``pv`` any more: the claim of its name now
    (``pvc``, None if there is none) is not the one it was bound to, nor bound to it."""
    name = _meta(pv).get("name", "?")
    if pvc is not None:
        if _meta(pvc).get("uid") == claim_uid:
            return f"PV {name} still belongs to claim {_meta(pvc).get('name')}, not re-created"
        if _spec(pvc).get("volumeName") == name:
            return f"claim {_meta(pvc).get('name')} is bound to PV {name}"
    if ((pv.get("status") or {}).get("phase")) == "Bound":
        return f"PV {name} is still Bound"
    return ""


def unbound(pv: Obj, pvc: Obj | None, pods: Iterable[Obj]) -> str:
    """ "" when no claim is bound to ``pv`` (a move's new PV, pre-bound by the claim's name
    only) and no pod uses it: ``pvc`` is the claim of the name it is pre-bound to (None if
    there is none), ``pods`` the pods of its namespace."""
    name = _meta(pv).get("name", "?")
    ref = _spec(pv).get("claimRef") or {}
    if ref.get("uid"):
        return f"PV {name} is bound to claim {ref.get('namespace')}/{ref.get('name')}"
    if ((pv.get("status") or {}).get("phase")) == "Bound":
        return f"PV {name} is Bound"
    if pvc is not None and _spec(pvc).get("volumeName") == name:
        claim = str(_meta(pvc).get("name"))
        users = [str(_meta(p).get("name")) for p in pods if _mounts(p, claim)]
        used = f", used by pod {', '.join(users)}" if users else ""
        return f"claim {claim} is bound to PV {name}{used}"
    return ""


def unreferenced(volume_id: str, pvs: Iterable[Obj], driver: str, deleted: str = "") -> str:
    """ "" when no PV of ``driver`` refers to the LogicalVolume of ``volume_id``, but
    ``deleted`` (a PV this rollback deleted, if it is still going away unbound)."""
    if not volume_id:
        return ""
    for pv in pvs:
        csi = _spec(pv).get("csi") or {}
        if csi.get("driver") != driver or csi.get("volumeHandle") != volume_id:
            continue
        name = _meta(pv).get("name")
        if name == deleted and _meta(pv).get("deletionTimestamp"):
            continue
        return f"PV {name} refers to volume {volume_id}"
    return ""


def _mounts(pod: Obj, claim: str) -> bool:
    for volume in _spec(pod).get("volumes") or []:
        if ((volume or {}).get("persistentVolumeClaim") or {}).get("claimName") == claim:
            return True
    return False

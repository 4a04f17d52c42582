"""The LogicalVolume (spec §5) and VolumeMove CustomResourceDefinitions, for both API groups.

The YAML files under ``deploy/crds/`` are rendered from :func:`logicalvolume_crd`
(``python -m topolvm.k8s.crd deploy/crds``); a test keeps them equal.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from topolvm.constants import LEGACY, NORMAL
from topolvm.iolimits import FIELDS, LEAST, PER_GIB
from topolvm.k8s.moveobject import GROUP, KIND, PLURAL, MovePhase

_QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?"
    r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def _quantity(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": _QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": True,
    }


def _string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _int64(description: str) -> dict[str, Any]:
    return {"type": "integer", "format": "int64", "description": description}


def _copy_status() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Progress of the copy that fills this logical volume (spec.copy).",
        "properties": {
            "phase": {"type": "string", "enum": ["Pending", "Copying", "Done", "Failed"],
                      "description": "Done once the data is complete and verified."},
            "message": _string("What the copy does or waits for."),
            "sourceNode": _string("The node the data comes from."),
            "sourceID": _string("LVM uuid of the source volume (or its cut) the checkpoint "
                                "belongs to."),
            "totalBytes": _int64("Bytes to copy."),
            "doneBytes": _int64("Bytes of the volume copied so far."),
            "transferredBytes": _int64("Data bytes received, over every attempt."),
            "bytesPerSecond": _int64("Recent rate through the volume."),
            "attempts": {"type": "integer", "format": "int32",
                         "description": "Connections made to the source."},
            "resumedFrom": _int64("Offset the last attempt went on from."),
            "checkpoint": {
                "type": "object",
                "description": "The last durable point: everything before offset is written "
                "and synced; digest is the digest chain there.",
                "properties": {"offset": _int64("Byte offset."),
                               "digest": _string("Hex digest chain value.")},
            },
            "streams": {
                "type": "object",
                "description": "A copy in several streams: their count, the unit their parts "
                "end on, and each part's last durable point (checkpoint applies to a copy in one "
                "stream).",
                "properties": {
                    "count": {"type": "integer", "format": "int32"},
                    "unit": _int64("Parts end on multiples of this many bytes."),
                    "checkpoints": {
                        "type": "array",
                        "items": {"type": "object", "properties": {
                            "index": {"type": "integer", "format": "int32"},
                            "begin": _int64("Where the part begins."),
                            "end": _int64("Where the part ends (not included)."),
                            "offset": _int64("Byte offset."),
                            "digest": _string("Hex digest chain value of the part there."),
                            "sourceID": _string("LVM uuid of the source volume read.")}},
                    },
                },
            },
            "digest": _string("Whole-volume digest (BLAKE2b chain over XXH3-128 segments; "
                              "of the parts' chains for a copy in several streams)."),
            "startTime": {"type": "string", "format": "date-time"},
            "completionTime": {"type": "string", "format": "date-time"},
            "round": {"type": "integer", "format": "int32",
                      "description": "The spec.copy.round this status is of."},
            "wireBytes": _int64("Data payload bytes on the wire, over every attempt: below "
                                "transferredBytes by what compression saved."),
            "senderCPUMillisPerGiB": _int64("CPU milliseconds the sender spent per GiB of data "
                                            "in the last attempt (of 64 MiB or more)."),
            "receiverCPUMillisPerGiB": _int64("CPU milliseconds the receiver spent per GiB of "
                                              "data in the last attempt (of 64 MiB or more)."),
        },
    }  # fmt: skip


def _verify_status() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "The digest spec.verify asked for, by its node.",
        "properties": {
            "id": _string("The spec.verify.id this status is of."),
            "phase": {"type": "string", "enum": ["Pending", "Cut", "Done", "Failed"],
                      "description": "Cut: the point-in-time cut exists (the volume may change "
                      "from now on); Done: digest is of the cut's content."},
            "message": _string("What it does or waits for, or why it failed."),
            "digest": _string("Content digest (BLAKE2b chain over XXH3-128 segments, as a "
                              "copy's): equal content, equal digest, thin or thick."),
            "sizeBytes": _int64("The bytes the digest covers."),
            "cutTime": {"type": "string", "format": "date-time"},
            "completionTime": {"type": "string", "format": "date-time"},
        },
    }  # fmt: skip


def _crd(
    group: str, names: dict[str, Any], scope: str, schema: dict[str, Any],
    columns: list[Any],
) -> dict[str, Any]:  # fmt: skip
    """A CustomResourceDefinition of one served and stored version v1 with a status
    subresource."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{names['plural']}.{group}"},
        "spec": {
            "group": group,
            "names": names,
            "scope": scope,
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def _io_limits() -> dict[str, Any]:
    fields = {}
    for name in FIELDS:
        what = name.replace("IOPS", " IO operations").replace("BytesPerSecond", " bytes")
        fields[name] = {"type": "integer", "format": "int64", "minimum": LEAST,
                        "description": f"At most this many {what.lower()} per second."}  # fmt: skip
        fields[name + PER_GIB] = {
            "type": "integer", "format": "int64", "minimum": LEAST,
            "description": f"At most this many {what.lower()} per second and GiB of the volume "
            "(rounded up; it grows with an expansion).",
        }  # fmt: skip
    return {
        "type": "object",
        "description": "IO limits of the pods that mount the volume, on its device (cgroup v2 "
        "io.max), from the claim's VolumeAttributesClass (docs/qos.md). None: no limit.",
        "properties": fields,
    }


def logicalvolume_crd(group: str) -> dict[str, Any]:
    """The CRD manifest for ``logicalvolumes.<group>`` (``topolvm.io`` or legacy)."""
    spec_props = {
        "name": _string("Same as metadata.name: the lower-cased CSI volume or snapshot name."),
        "nodeName": _string("The node that creates the logical volume."),
        "size": _quantity("Requested size in bytes."),
        "deviceClass": _string("Device class of lvmd; empty selects the default class."),
        "lvcreateOptionClass": _string("lvcreate option class of lvmd."),
        "source": _string("Name of the source LogicalVolume of a snapshot or clone."),
        "accessType": _string("Access type of a snapshot or clone: ro or rw."),
        "copy": {
            "type": "object",
            "description": "Fill the new logical volume with a copy of another LogicalVolume "
            "(a snapshot, or a point-in-time cut of a volume), on this node or another one.",
            "properties": {
                "source": _string("Name of the LogicalVolume to copy."),
                "keepCut": {
                    "type": "boolean",
                    "description": "A move's copy: the source's "
                    "node keeps the point-in-time cut of round 1, the base of round 2.",
                },
                "round": {
                    "type": "integer",
                    "format": "int32",
                    "minimum": 1,
                    "maximum": 2,
                    "description": "2: send only what changed in the source since the "
                    "cut of round 1 (a move's final copy).",
                },
            },
            "required": ["source"],
        },
        "verify": {
            "type": "object",
            "description": "Asks this volume's node for a digest of its content at one instant "
            "(a move's verification, after its final copy): it cuts the volume at once, says "
            "so (status.verify.phase Cut), then reads the cut.",
            "properties": {
                "id": _string("What asks (a VolumeMove's UID): a new id, a new digest."),
                "sizeBytes": _int64("Digest the first sizeBytes bytes only (0: all of it)."),
            },
            "required": ["id"],
        },
        "ioLimits": _io_limits(),
    }
    status_props = {
        "volumeID": _string("LVM logical volume name; also the CSI volume id."),
        "code": {
            "type": "integer",
            "format": "int32",
            "description": "gRPC status code of the last failure; 0 is OK.",
        },
        "message": _string("Message of the last failure."),
        "currentSize": _quantity("Actual size of the logical volume."),
        "copy": _copy_status(),
        "verify": _verify_status(),
    }
    schema = {
        "type": "object",
        "description": "LogicalVolume is the Schema for the logicalvolumes API.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "description": "LogicalVolumeSpec defines the desired state of LogicalVolume.",
                "properties": spec_props,
                "required": ["name", "nodeName", "size"],
            },
            "status": {
                "type": "object",
                "description": "LogicalVolumeStatus defines the observed state of LogicalVolume.",
                "properties": status_props,
            },
        },
    }
    columns = [
        {"name": "Node", "type": "string", "jsonPath": ".spec.nodeName"},
        {"name": "DeviceClass", "type": "string", "jsonPath": ".spec.deviceClass"},
        {"name": "Size", "type": "string", "jsonPath": ".spec.size"},
        {"name": "Current", "type": "string", "jsonPath": ".status.currentSize"},
        {"name": "IOLimits", "type": "string", "jsonPath": ".spec.ioLimits"},
        {"name": "VolumeID", "type": "string", "jsonPath": ".status.volumeID", "priority": 1},
        {"name": "Copy", "type": "string", "jsonPath": ".status.copy.phase", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    names = {"kind": "LogicalVolume", "listKind": "LogicalVolumeList",
             "plural": "logicalvolumes", "singular": "logicalvolume"}  # fmt: skip
    return _crd(group, names, "Cluster", schema, columns)


def volumemove_crd(group: str) -> dict[str, Any]:
    """The CRD manifest for ``volumemoves.<group>`` (:mod:`topolvm.k8s.moveobject`)."""
    status_props: dict[str, Any] = {
        "phase": {"type": "string", "enum": [*MovePhase.ORDER, MovePhase.UNVERIFIED,
                                             MovePhase.ROLLING_BACK, MovePhase.ROLLED_BACK,
                                             MovePhase.REFUSED]},
        "message": _string("What the move does or waits for, or why it stopped."),
        "reason": _string("Why it was refused or rolled back."),
        "sourceNode": _string("The node the claim's data was on."),
        "targetNode": _string("The node the data moves to."),
        "sourceVolume": _string("The claim's LogicalVolume before the move."),
        "targetVolume": _string("The LogicalVolume on the target node."),
        "oldVolumeName": _string("The claim's PersistentVolume before the move."),
        "newVolumeName": _string("The claim's PersistentVolume after the move."),
        "pod": _string("The pod that uses the claim."),
        "owner": _string("The pod's controller (Kind/name)."),
        "podUID": _string("The pod's UID before the move."),
        "claimUID": _string("The claim's UID before the move (it is re-created)."),
        "claimTemplate": _string("JSON of the claim's metadata and spec, to re-create it."),
        "reclaimPolicy": _string("The old PersistentVolume's reclaim policy."),
        "deviceClass": _string("The device class of both volumes."),
        "sizeBytes": _int64("The volume's size."),
        "preCopyBytes": _int64("Data bytes the pre-copy moved (the pod running)."),
        "deltaBytes": _int64("Data bytes the final copy moved (the pod stopped)."),
        "doneBytes": _int64("Progress of the copy in hand through the volume."),
        "totalBytes": _int64("Bytes of the volume the copy in hand goes through."),
        "progress": _string("Phase and percentage, for kubectl get."),
        "startTime": {"type": "string", "format": "date-time"},
        "stopTime": {"type": "string", "format": "date-time",
                     "description": "The pod was stopped: the downtime starts."},
        "swapTime": {"type": "string", "format": "date-time"},
        "commitTime": {"type": "string", "format": "date-time",
                       "description": "The swap is about to delete the old claim: from then "
                       "on the move only goes forward."},
        "downtimeSeconds": _int64("From the pod's stop until it ran on the target."),
        "completionTime": {"type": "string", "format": "date-time"},
        "togetherSeen": _string("The claims moved with this one whose VolumeMoves it saw."),
        "verifyBytes": _int64("The bytes both verification digests cover."),
        "sourceDigest": _string("The old volume's digest as of the swap."),
        "targetDigest": _string("The new volume's digest as of the swap."),
        "verifyTime": {"type": "string", "format": "date-time",
                       "description": "When both digests were compared."},
        "keepSourceUntil": {"type": "string", "format": "date-time",
                            "description": "A verified move keeps the old volume until then."},
        "oldVolume": {"type": "string", "enum": ["Kept", "Removed", "Left"],
                      "description": "The old PV and LogicalVolume: Kept (until "
                      "keepSourceUntil, or for good when Unverified), Removed, or Left (someone "
                      "changed the old PV; the move leaves it to them)."},
        "conditions": {
            "type": "array",
            "description": "Verified: True once both volumes' digests as of the swap match; "
            "False (reason DigestMismatch or VerifyFailed) keeps the old volume. ImagesPulled: "
            "the pod's images pulled on the target during the pre-copy (True, Pulled, or "
            "AlreadyPresent when the Node lists them all), or not "
            "(False: PullFailed, PullTimedOut or PullSkipped; the move goes on).",
            "items": {
                "type": "object",
                "required": ["type", "status"],
                "properties": {
                    "type": _string("Verified or ImagesPulled."),
                    "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                    "reason": _string("DigestMatch, DigestMismatch or VerifyFailed; Pulled, "
                                      "AlreadyPresent, PullFailed, PullTimedOut or "
                                      "PullSkipped."),
                    "message": _string("The digests or the images, or why there are none."),
                    "lastTransitionTime": {"type": "string", "format": "date-time"},
                },
            },
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    }  # fmt: skip
    schema = {
        "type": "object",
        "description": "VolumeMove moves a PersistentVolumeClaim with its data to another node.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "properties": {
                    "claim": _string("The PersistentVolumeClaim to move (same namespace)."),
                    "targetNode": _string("Where to; empty: the node with the most room."),
                    "together": {
                        "type": "array",
                        "items": {"type": "string"},
                        "maxItems": 16,
                        "description": "The pod's other node-local claims, which move with "
                        "this one (each has its VolumeMove, with the same targetNode).",
                    },
                    "keepSourceSeconds": {
                        "type": "integer",
                        "format": "int64",
                        "minimum": 0,
                        "description": "Keep the old PV and LogicalVolume this long after the "
                        "move is verified, then remove them (0 or unset: at once).",
                    },
                },
                "required": ["claim"],
                "x-kubernetes-validations": [
                    {"rule": "self == oldSelf", "message": "spec is immutable"}
                ],
            },
            "status": {"type": "object", "properties": status_props},
        },
    }
    columns = [
        {"name": "Claim", "type": "string", "jsonPath": ".spec.claim"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "From", "type": "string", "jsonPath": ".status.sourceNode"},
        {"name": "To", "type": "string", "jsonPath": ".status.targetNode"},
        {"name": "Progress", "type": "string", "jsonPath": ".status.progress"},
        {"name": "Downtime", "type": "integer", "jsonPath": ".status.downtimeSeconds"},
        {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    names = {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL,
             "singular": "volumemove", "shortNames": ["vmove"]}  # fmt: skip
    return _crd(group, names, "Namespaced", schema, columns)


def render(group: str) -> str:
    return "---\n" + yaml.safe_dump(logicalvolume_crd(group), sort_keys=False, width=1000)


def render_move(group: str) -> str:
    return "---\n" + yaml.safe_dump(volumemove_crd(group), sort_keys=False, width=1000)


def crd_files() -> dict[str, str]:
    """File name → rendered manifest, for both groups."""
    files = {f"logicalvolumes.{n.group}.yaml": render(n.group) for n in (NORMAL, LEGACY)}
    files[f"{PLURAL}.{GROUP}.yaml"] = render_move(GROUP)  # no legacy group (moveobject.GROUP)
    return files


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "deploy/crds")
    out.mkdir(parents=True, exist_ok=True)
    for name, text in crd_files().items():
        (out / name).write_text(text)
        print(out / name)

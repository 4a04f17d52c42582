"""The pod mutating webhook's decision (spec §7.1), without I/O.

For a pod being created, sum the bytes its TopoLVM volumes request per device class and write
them to ``capacity.<plugin>/<device-class>`` annotations, which topolvm-scheduler reads. In
marker mode (upstream's behaviour) the first container also gets the extended resource
``<plugin>/capacity: 1`` in its requests and limits, so that a kube-scheduler whose extender
manages that resource calls topolvm-scheduler for the pod.

A pod that mounts a claim being restored or cloned gets a preferred node affinity for the
source's node, so the restore stays local when it can (:mod:`topolvm.controller.restoreplace`).

While a claim of the pod is being moved to another node (a VolumeMove in a step where its pod
must not run: docs/mobility.md, "Move"), the pod also gets the scheduling gate
``<plugin>/move``: the pod its controller re-creates waits, not started on the old node, until
topolvm-controller lets it go onto the new one.

Reads (PersistentVolumeClaims, StorageClasses, VolumeMoves, a restore's source) go through a
:class:`PodReader` that the caller supplies; the webhook's reader reads the API server.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import jsonpatch

from topolvm.capacity_annotations import class_key, encode_pod
from topolvm.constants import DEFAULT_SIZE, Names
from topolvm.controller.restoreplace import Sources, preferring, source_node
from topolvm.k8s.lvobject import InvalidQuantity, parse_quantity
from topolvm.k8s.moveobject import MovePhase
from topolvm.move.claims import gate_name
from topolvm.placement import PlacementValueError, prefers_source

Obj = dict[str, Any]
DecisionKind = Literal["mutated", "allowed", "denied", "errored"]


class PodReader(Sources, Protocol):
    """Reads the webhook needs; each returns None when the object does not exist and raises
    any other failure (its message is sent back to the API server)."""

    async def get_storageclass(self, name: str) -> Obj | None: ...

    async def get_volumemove(self, namespace: str, name: str) -> Obj | None: ...


HOLDING_PHASES = frozenset({MovePhase.STOPPING, MovePhase.FINAL_COPY, MovePhase.SWAPPING})
SOURCE_LOOKUP_SECONDS = 3.0  # restores' source nodes, sought at most this long in all


@dataclass(frozen=True)
class Decision:
    """The webhook's answer: ``patch`` is an RFC 6902 JSON patch (empty unless mutated)."""

    kind: DecisionKind
    message: str
    code: int = 200
    patch: list[Obj] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    requested: dict[str, int] = field(default_factory=dict)
    """Bytes per annotation suffix (``ssd``, ``00default``) when mutated."""

    @property
    def allowed(self) -> bool:
        return self.kind in ("mutated", "allowed")


def allowed(message: str) -> Decision:
    return Decision("allowed", message)


def denied(message: str) -> Decision:
    return Decision("denied", message, code=403)


def errored(code: int, message: str) -> Decision:
    return Decision("errored", message, code=code)


def marker_warnings(names: Names) -> list[str]:
    """What a user creating a pod in marker mode needs to know (AdmissionReview warnings)."""
    res = names.capacity_resource
    return [
        f"{res} added: capacity-aware placement needs topolvm-scheduler as a kube-scheduler "
        "extender",
        f"topolvm-node advertises {res}, so without the extender the pod still schedules, "
        "with no capacity check",
    ]


class _BadPod(Exception):
    """The pod cannot be read as a pod (HTTP 400 in upstream's terms)."""


class _ReadFailed(Exception):
    """A read through the PodReader failed (HTTP 500 in upstream's terms)."""


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _size(spec: Mapping[str, Any], where: str) -> int:
    """Requested bytes of a claim spec, rounded up; 1 GiB when missing or not positive."""
    raw = _map(_map(spec.get("resources")).get("requests")).get("storage")
    if raw is None:
        return DEFAULT_SIZE
    try:
        size = parse_quantity(raw)
    except InvalidQuantity as e:
        raise _BadPod(f"{where}: resources.requests.storage: {e}") from e
    return size if size > 0 else DEFAULT_SIZE


class _Walk:
    """One request's volume walk, with its StorageClass cache."""

    def __init__(self, reader: PodReader, names: Names, namespace: str) -> None:
        self.reader, self.names, self.namespace = reader, names, namespace
        self.classes: dict[str, Obj | None] = {}
        self.sums: dict[str, int] = {}
        self.pending: list[tuple[str, Obj, Obj]] = []  # Pending TopoLVM claims: name, PVC, class

    async def topolvm_class(self, name: str) -> Obj | None:
        """The StorageClass ``name`` if it is TopoLVM's, else None."""
        if name not in self.classes:
            if not name:  # no StorageClass can have an empty name; a GET would list them all
                self.classes[name] = None
            else:
                try:
                    self.classes[name] = await self.reader.get_storageclass(name)
                except Exception as e:
                    raise _ReadFailed(f"cannot get StorageClass {name}: {e}") from e
        sc = self.classes[name]
        if sc is None or sc.get("provisioner") != self.names.plugin:
            return None
        return sc

    def add(self, sc: Obj, size: int) -> None:
        dc = _map(sc.get("parameters")).get(self.names.device_class_param, "")
        key = class_key(dc if isinstance(dc, str) else "")
        self.sums[key] = self.sums.get(key, 0) + size

    async def claim(self, claim_name: str) -> bool:
        """Count a PVC volume; False when the pod must be left alone (a bound TopoLVM PVC)."""
        if not claim_name:  # invalid, validation rejects the pod; a GET would list every PVC
            return True
        try:
            pvc = await self.reader.get_pvc(self.namespace, claim_name)
        except Exception as e:
            raise _ReadFailed(
                f"cannot get PersistentVolumeClaim {self.namespace}/{claim_name}: {e}"
            ) from e
        if pvc is None:  # created after the pod: not handled (upstream's limitation)
            return True
        spec = _map(pvc.get("spec"))
        sc_name = spec.get("storageClassName")
        if not isinstance(sc_name, str) or not sc_name:
            return True
        sc = await self.topolvm_class(sc_name)
        if sc is None:
            return True
        if _map(pvc.get("status")).get("phase") != "Pending":
            return False  # the volume exists: the pod goes where it is, nothing to add
        self.add(sc, _size(spec, f"PersistentVolumeClaim {self.namespace}/{claim_name}"))
        self.pending.append((claim_name, pvc, sc))
        return True

    async def ephemeral(self, volume_name: str, template: Mapping[str, Any]) -> None:
        spec = _map(template.get("spec"))
        sc_name = spec.get("storageClassName")
        if not isinstance(sc_name, str):  # an empty string is looked up (upstream)
            return
        sc = await self.topolvm_class(sc_name)
        if sc is not None:
            self.add(sc, _size(spec, f"ephemeral volume {volume_name}"))


async def _walk(pod: Obj, request_namespace: str, reader: PodReader, names: Names) -> _Walk | None:
    """The pod's TopoLVM volumes walked; None when a TopoLVM PVC of the pod is no longer
    Pending (then the pod is not mutated at all)."""
    namespace = _map(pod.get("metadata")).get("namespace") or request_namespace
    walk = _Walk(reader, names, str(namespace))
    for volume in _volumes(pod):
        name = str(volume.get("name", ""))
        pvc = volume.get("persistentVolumeClaim")
        ephemeral = volume.get("ephemeral")
        if isinstance(pvc, Mapping):
            if not await walk.claim(str(pvc.get("claimName", ""))):
                return None
        elif isinstance(ephemeral, Mapping):
            template = ephemeral.get("volumeClaimTemplate")
            if isinstance(template, Mapping):
                await walk.ephemeral(name, template)
    return walk


async def requested_capacity(
    pod: Obj, request_namespace: str, reader: PodReader, names: Names
) -> dict[str, int] | None:
    """Bytes per annotation suffix the pod's TopoLVM volumes request; None when a TopoLVM PVC
    of the pod is no longer Pending (then the pod is not mutated at all)."""
    walk = await _walk(pod, request_namespace, reader, names)
    return None if walk is None else walk.sums


async def source_nodes(walk: _Walk, reader: PodReader) -> tuple[list[str], list[str]]:
    """The nodes the pod's restored or cloned claims come from (where their restore is
    local), and warnings for the claims whose source could not be sought: a courtesy that is
    skipped, never a refusal. The claims are sought at once, all within
    :data:`SOURCE_LOOKUP_SECONDS`, well inside the webhook's timeout."""
    warnings: list[str] = []
    todo: dict[str, Obj] = {}
    for claim_name, pvc, sc in walk.pending:
        where = f"PersistentVolumeClaim {walk.namespace}/{claim_name}"
        sc_name = _map(sc.get("metadata")).get("name")
        try:
            if claim_name in todo or not prefers_source(
                sc.get("parameters"), walk.names, f"StorageClass {sc_name}"
            ):
                continue
        except PlacementValueError as e:
            warnings.append(f"{where}: {e}; kube-scheduler places it without that preference")
            continue
        todo[claim_name] = {**pvc, "metadata": {**_map(pvc.get("metadata")),
                                                "namespace": walk.namespace}}  # fmt: skip
    tasks = {name: asyncio.ensure_future(source_node(pvc, reader, walk.names))
             for name, pvc in todo.items()}  # fmt: skip
    if not tasks:
        return [], warnings
    _, late = await asyncio.wait(tasks.values(), timeout=SOURCE_LOOKUP_SECONDS)
    for task in late:
        task.cancel()
    nodes: list[str] = []
    for name, task in tasks.items():
        where = f"PersistentVolumeClaim {walk.namespace}/{name}"
        if task in late:
            error = f"not found within {SOURCE_LOOKUP_SECONDS:.0f} s"
        elif (failure := task.exception()) is not None:
            error = f"{type(failure).__name__}: {failure}"
        else:
            if node := task.result():
                nodes.append(node)
            continue
        warnings.append(f"{where}: its source's node is not known ({error}); kube-scheduler "
                        "places it without that preference")  # fmt: skip
    return nodes, warnings


def _volumes(pod: Obj) -> list[Mapping[str, Any]]:
    volumes = _map(pod.get("spec")).get("volumes")
    if volumes is not None and not isinstance(volumes, list):
        raise _BadPod("spec.volumes is not a list")
    return [v for v in volumes or [] if isinstance(v, Mapping)]


async def moving_claim(pod: Obj, request_namespace: str, reader: PodReader) -> str | None:
    """The pod's claim that a move holds (its pod must wait), if any."""
    namespace = str(_map(pod.get("metadata")).get("namespace") or request_namespace)
    for volume in _volumes(pod):
        claim = _map(volume.get("persistentVolumeClaim")).get("claimName")
        if not isinstance(claim, str) or not claim:
            continue
        try:
            move = await reader.get_volumemove(namespace, claim)
        except Exception as e:
            raise _ReadFailed(f"cannot get VolumeMove {namespace}/{claim}: {e}") from e
        if move is not None and _map(move.get("status")).get("phase") in HOLDING_PHASES:
            return claim
    return None


def gated_pod(pod: Obj, gate: str) -> Obj:
    out = copy.deepcopy(pod)
    gates = out["spec"].get("schedulingGates")
    if not isinstance(gates, list):
        gates = out["spec"]["schedulingGates"] = []
    if not any(isinstance(g, dict) and g.get("name") == gate for g in gates):
        gates.append({"name": gate})
    return out


def mutated_pod(pod: Obj, requested: Mapping[str, int], names: Names, *, marker: bool) -> Obj:
    """A copy of ``pod`` with the capacity annotations (and, with ``marker``, the marker
    resource on the first container)."""
    out = copy.deepcopy(pod)
    meta = out.setdefault("metadata", {})
    if not isinstance(meta.get("annotations"), dict):
        meta["annotations"] = {}
    meta["annotations"].update(encode_pod(names, requested))
    if marker:
        container = out["spec"]["containers"][0]
        if not isinstance(container.get("resources"), dict):
            container["resources"] = {}
        for key in ("requests", "limits"):
            if not isinstance(container["resources"].get(key), dict):
                container["resources"][key] = {}
            container["resources"][key][names.capacity_resource] = "1"
    return out


def json_patch(original: Obj, changed: Obj) -> list[Obj]:
    """RFC 6902 operations that turn ``original`` into ``changed``."""
    ops: list[Obj] = jsonpatch.make_patch(original, changed).patch
    return ops


async def decide(
    pod: Any, request_namespace: str, reader: PodReader, names: Names, *, marker: bool = False
) -> Decision:
    """The webhook's answer for creating ``pod`` (the AdmissionRequest's ``object``)."""
    if not isinstance(pod, dict):
        return errored(400, "the request's object is not a Pod")
    try:
        containers = _map(pod.get("spec")).get("containers")
        if not isinstance(containers, list) or not containers:
            return denied("pod has no containers")
        if not isinstance(containers[0], dict):
            return errored(400, "spec.containers[0] is not an object")
        if not _volumes(pod):
            return allowed("no volumes")
        walk = await _walk(pod, request_namespace, reader, names)
        requested = None if walk is None else walk.sums
        nodes, warnings = ([], []) if walk is None else await source_nodes(walk, reader)
        moving = await moving_claim(pod, request_namespace, reader)
    except _BadPod as e:
        return errored(400, str(e))
    except _ReadFailed as e:
        return errored(500, str(e))
    if not requested and moving is None:
        return allowed("no request for TopoLVM")
    changed = pod
    said = []
    if requested:
        changed = mutated_pod(pod, requested, names, marker=marker)
        summary = ", ".join(f"{key}={size}" for key, size in sorted(requested.items()))
        said.append(f"requested capacity: {summary}")
    if nodes and changed != (preferred := preferring(changed, nodes)):
        changed = preferred
        said.append(f"prefers {', '.join(dict.fromkeys(nodes))}, where its restore is local")
    if moving is not None:
        changed = gated_pod(changed, gate_name(names.plugin))
        said.append(f"held by the move of claim {moving}")
    patch = json_patch(pod, changed)
    return Decision(
        "mutated",
        "; ".join(said),
        patch=patch,
        warnings=(marker_warnings(names) if marker and requested else []) + warnings,
        requested=dict(sorted((requested or {}).items())),
    )

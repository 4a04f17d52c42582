"""CSI Controller service of topolvm-controller (spec §6.2).

A volume is a LogicalVolume object: CreateVolume writes one for the chosen node and waits for
the node's answer in its status; its ``status.volumeID`` (the object's UID, also the LV name) is
the CSI volume and snapshot id. Unlike upstream, a node chosen by the scheduler is checked
against its free space minus the volumes in flight there (:mod:`.ledger`), so two volumes are
never promised the same bytes: the answer is RESOURCE_EXHAUSTED, and csi-provisioner asks
kube-scheduler for another node.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from lightkube.resources.core_v1 import PersistentVolumeClaim

from topolvm import capacity_annotations
from topolvm.constants import Names
from topolvm.controller import copies
from topolvm.controller.ledger import CapacityLedger, NodeView
from topolvm.controller.metrics import ControllerMetrics
from topolvm.controller.sizing import (
    MinimumAllocations,
    SizingError,
    largest,
    node_from_topology,
    volume_size,
)
from topolvm.controller.snapshots import Snapshots
from topolvm.controller.volumeparams import (
    changed_spec,
    check_capabilities,
    io_change_of,
    io_limits_of,
)
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import LogicalVolumeObject
from topolvm.k8s.lvstore import (
    AmbiguousVolumeId,
    IncompatibleVolume,
    LogicalVolumeStore,
    VolumeFailed,
    VolumeRequest,
)
from topolvm.placement import placement_error
from topolvm.proto import csi_pb2 as csi
from topolvm.rpc import status
from topolvm.rpc.locks import KeyedLocks
from topolvm.rpc.transport import Context

log = logging.getLogger(__name__)

Ctx = Context
RpcCap = csi.ControllerServiceCapability.RPC
CAPABILITIES = (RpcCap.CREATE_DELETE_VOLUME, RpcCap.CLONE_VOLUME, RpcCap.GET_CAPACITY,
                RpcCap.EXPAND_VOLUME, RpcCap.CREATE_DELETE_SNAPSHOT,
                RpcCap.MODIFY_VOLUME)  # fmt: skip


_LOGGED = {"name": "volume", "volume_id": "volume_id", "source_volume_id": "source",
           "snapshot_id": "snapshot_id"}  # fmt: skip


def _translate(e: Exception) -> status.StatusError | None:
    if isinstance(e, SizingError):
        return status.InvalidArgument(str(e))
    if isinstance(e, IncompatibleVolume):
        return status.AlreadyExists(str(e))
    if isinstance(e, VolumeFailed):
        return status.from_code(e.code, e.message)
    if isinstance(e, AmbiguousVolumeId):
        return status.Internal(str(e))
    if isinstance(e, kube.KubeError):
        return status.Internal(f"Kubernetes API: {e}")
    return None


_NOT_OFFERED = "not implemented by topolvm-controller"
SELECTED_NODE = "volume.kubernetes.io/selected-node"


def rpc(fn: Any) -> Any:
    return status.rpc("csi.v1.Controller", lambda r: status.fields_of(r, _LOGGED), _translate)(fn)


def _capacity_range(request: Any) -> tuple[int, int]:
    if not request.HasField("capacity_range"):
        return 0, 0
    return request.capacity_range.required_bytes, request.capacity_range.limit_bytes


class ControllerService:
    grpc_metrics: status.GrpcMetrics | None = None

    def __init__(
        self,
        names: Names,
        store: LogicalVolumeStore,
        nodes: NodeView,
        metrics: ControllerMetrics,
        minimums: MinimumAllocations | None = None,
    ):
        self.names = names
        self.store = store
        self.nodes = nodes
        self.metrics = metrics
        self.minimums = minimums or MinimumAllocations()
        self.ledger = CapacityLedger(names, nodes, store, metrics)
        self.snapshots = Snapshots(names, store, nodes, self.ledger)
        self.name_locks = KeyedLocks()
        self.id_locks = KeyedLocks()

    @rpc
    async def GetCapacity(self, request: csi.GetCapacityRequest, context: Ctx) -> Any:
        dc = request.parameters.get(self.names.device_class_param, "")
        if not request.HasField("accessible_topology"):
            total = sum(self.ledger.free_bytes(n, dc) for n in self.nodes.names())
            return csi.GetCapacityResponse(available_capacity=total)
        value = request.accessible_topology.segments.get(self.names.topology_key)
        node = self.nodes.by_topology(self.names.topology_key, value) if value else None
        free = self.ledger.free_bytes(node, dc) if node else 0
        return csi.GetCapacityResponse(available_capacity=free)

    # -- volumes ---------------------------------------------------------------------------

    @rpc
    async def CreateVolume(self, request: csi.CreateVolumeRequest, context: Ctx) -> Any:
        if not request.name:
            raise status.InvalidArgument("invalid name: a volume name is required")
        block, fs_type = check_capabilities(request.volume_capabilities)
        if bad := placement_error(request.parameters, self.names, "StorageClass parameters"):
            raise status.InvalidArgument(bad)  # the webhook's to read; told where claims show it
        limits = io_limits_of(request.mutable_parameters)
        required, limit = _capacity_range(request)
        required = max(required, self.minimums.for_volume(block=block, fs_type=fs_type))
        size = volume_size(required, limit)
        name = request.name.lower()
        async with self.name_locks.hold(name):
            return await self._create_volume(request, name, size, limits)

    async def _create_volume(
        self, request: csi.CreateVolumeRequest, name: str, size: int,
        limits: tuple[tuple[str, int], ...],
    ) -> Any:  # fmt: skip
        dc = request.parameters.get(self.names.device_class_param, "")
        option_class = request.parameters.get(self.names.lvcreate_option_class_param, "")
        reqs = request.accessibility_requirements
        has_reqs = request.HasField("accessibility_requirements")
        preferred = [dict(t.segments) for t in reqs.preferred]
        requisite = [dict(t.segments) for t in reqs.requisite]
        source, access = "", ""
        # Read before the capacity check: from that check to the reservation in
        # _create_and_wait nothing may await, or a concurrent call for the same node passes the
        # same check (two calls 5 ms apart both took a node's last GiB in a burst).
        existing = await self.store.get(name)
        copy_source = ""
        waiting = copies.waiting_object(request.parameters, copies.PVC_NAME, copies.PVC_NAMESPACE)
        if request.HasField("volume_content_source"):
            src = await self._content_source(request.volume_content_source)
            if size < (src.current_size or src.size):
                raise status.OutOfRange(
                    f"requested size {size} is smaller than the source ({src.current_size})"
                )
            if dc != src.device_class:
                raise status.InvalidArgument(
                    f"device class {dc!r} differs from the source's {src.device_class!r}: "
                    "snapshots and clones stay in their source's device class"
                )
            if not src.ready:
                raise status.Unavailable(f"the source {src.name} is still being filled by a copy")
            # the node kube-scheduler chose (the source's, with Immediate binding when the
            # topology allows); on another node than the source's, a copy fills it
            # (docs/mobility.md)
            node = src.node_name
            if has_reqs:
                node = copies.restore_node(src.node_name, preferred, requisite,
                                           self.names.topology_key,
                                           await self._scheduled(request.parameters))  # fmt: skip
            if existing is not None and existing.copy_source == src.name:
                node = existing.node_name  # a retry: where the copy already runs
            if node == src.node_name:
                source, access = src.name, "rw"
            else:
                copy_source = src.name
                if existing is None:
                    self._check_room(node, dc, size, f" for a copy of {src.name}")
        elif not has_reqs:
            best = largest({n: self.ledger.free_bytes(n, dc) for n in self.nodes.names()})
            if best is None:
                raise status.Internal("can not find any node")
            node, free = best
            if free < size and existing is None:
                self.metrics.capacity_rejections.labels(capacity_annotations.class_key(dc)).inc()
                raise status.ResourceExhausted(
                    f"no node has {size} bytes free in device class {dc!r} (largest: {free})"
                )
        else:
            found = node_from_topology(preferred, requisite, self.names.topology_key)
            if found is None:
                raise status.InvalidArgument(
                    f"cannot find a node in the accessibility requirements "
                    f"(no segment has {self.names.topology_key})"
                )
            node = found
            if existing is None:
                self._check_room(node, dc, size)
        annotations = ((self.names.claim_annotation, waiting),) if waiting else ()
        req = VolumeRequest(name, node, size, dc, option_class, source, access,
                            copy_source=copy_source, annotations=annotations,
                            io_limits=limits)  # fmt: skip
        lv = await self._create_and_wait(req, existing)
        volume = csi.Volume(
            capacity_bytes=lv.current_size or lv.size,
            volume_id=lv.volume_id,
            accessible_topology=[csi.Topology(segments={self.names.topology_key: node})],
        )
        if request.HasField("volume_content_source"):
            volume.content_source.CopyFrom(request.volume_content_source)
        return csi.CreateVolumeResponse(volume=volume)

    def _check_room(self, node: str, dc: str, size: int, purpose: str = "") -> None:
        free = self.ledger.free_bytes(node, dc)
        if free < size:
            self.metrics.capacity_rejections.labels(capacity_annotations.class_key(dc)).inc()
            raise status.ResourceExhausted(
                f"node {node} has {free} bytes free in device class {dc!r} after volumes in "
                f"flight; {size} requested{purpose}"
            )

    async def _scheduled(self, parameters: Any) -> bool | None:
        """Whether kube-scheduler chose the claim's node (its selected-node annotation); None
        when the request names no claim (csi-provisioner without --extra-create-metadata) or
        the claim cannot be read."""
        name = parameters.get(copies.PVC_NAME, "")
        namespace = parameters.get(copies.PVC_NAMESPACE, "")
        if not name or not namespace:
            return None
        try:
            pvc = await api.get(self.store.client, PersistentVolumeClaim, name,
                                namespace=namespace)  # fmt: skip
        except kube.KubeError as e:
            log.warning("cannot read the claim of a restore", extra={"claim": name,
                                                                     "error": str(e)})  # fmt: skip
            return None
        annotations = ((pvc or {}).get("metadata") or {}).get("annotations") or {}
        return None if pvc is None else SELECTED_NODE in annotations

    async def _content_source(self, source: csi.VolumeContentSource) -> LogicalVolumeObject:
        kind = source.WhichOneof("type")
        source_id = source.snapshot.snapshot_id if kind == "snapshot" else source.volume.volume_id
        what = "snapshot" if kind == "snapshot" else "volume"
        if kind not in ("snapshot", "volume"):
            raise status.InvalidArgument("unknown volume content source")
        if not source_id:
            raise status.NotFound(f"source {what} id is empty")
        lv = await self.store.find_by_volume_id(source_id)
        if lv is None:
            raise status.NotFound(f"failed to find source {what}: {source_id}")
        return lv

    async def _create_and_wait(
        self, req: VolumeRequest, existing: LogicalVolumeObject | None
    ) -> LogicalVolumeObject:
        """Reserve, create, wait. The reservation comes first, before any await: the caller's
        capacity check and it are one step for the event loop."""
        # made: a retry of a volume whose LV exists, this process holding no reservation for it
        # (it restarted). The node's annotation may count it already and then never change again
        # to end the reservation, which would count its bytes twice until the settle timeout
        # (found by the crash campaign); or not yet, so it is still reserved, for settle_delay.
        # A retry after a timed-out call keeps that call's reservation (abandoned, below).
        made = existing is not None and bool(existing.volume_id)
        self.ledger.reserve(req, made=made)
        try:
            await self.store.create(req)
            lv = await self.store.wait_created(req.name)
        except asyncio.CancelledError:
            # the caller's deadline: the node goes on making the LV, its annotation not counting
            # it yet. Released, its bytes could be offered again meanwhile.
            self.ledger.abandon(req.name)
            raise
        except BaseException:
            self.ledger.release(req.name)
            raise
        self.ledger.settle(req.name)
        return lv

    async def _delete(self, volume_id: str) -> None:
        lv = await self.store.find_by_volume_id(volume_id)
        if lv is None:
            return  # already gone: success, as the CSI spec asks
        if reading := copies.readers(lv, self.store.all()):
            raise status.FailedPrecondition(
                f"{lv.name} is the source of a copy in progress ({'; '.join(reading)}): it "
                "can be deleted once that copy is done (the request is retried)"
            )
        await self.store.delete_and_wait(lv.name)
        self.ledger.release(lv.name)

    @rpc
    async def DeleteVolume(self, request: csi.DeleteVolumeRequest, context: Ctx) -> Any:
        if not request.volume_id:
            raise status.InvalidArgument("volume_id is required")
        async with self.id_locks.hold(request.volume_id):
            await self._delete(request.volume_id)
        return csi.DeleteVolumeResponse()

    @rpc
    async def ControllerExpandVolume(
        self, request: csi.ControllerExpandVolumeRequest, context: Ctx
    ) -> Any:
        if not request.volume_id:
            raise status.InvalidArgument("volume_id is required")
        async with self.id_locks.hold(request.volume_id):
            lv = await self.store.find_by_volume_id(request.volume_id)
            if lv is None:
                raise status.NotFound(f"volume {request.volume_id} is not found")
            size = volume_size(*_capacity_range(request))
            node_expansion = request.volume_capability.WhichOneof("access_type") == "mount"
            current = lv.current_size if lv.current_size is not None else lv.size
            if size <= current:
                return csi.ControllerExpandVolumeResponse(
                    capacity_bytes=current, node_expansion_required=node_expansion
                )
            free = self.ledger.free_bytes(lv.node_name, lv.device_class)
            if free < size - current:
                raise status.Internal(
                    f"not enough space on node {lv.node_name}: {free} bytes free in device "
                    f"class {lv.device_class!r}, {size - current} more requested"
                )
            if await self.store.raise_size(lv.name, size) is None:
                raise status.NotFound(f"volume {request.volume_id} is not found")
            lv = await self.store.wait_resized(lv.name, size)
            return csi.ControllerExpandVolumeResponse(
                capacity_bytes=lv.current_size or size, node_expansion_required=node_expansion
            )

    @rpc
    async def ControllerModifyVolume(
        self, request: csi.ControllerModifyVolumeRequest, context: Ctx
    ) -> Any:
        """The claim's new VolumeAttributesClass: the limits its keys name change in the
        volume's ``spec.ioLimits`` (the others stay); the volume's node applies them to the
        pods that mount it."""
        if not request.volume_id:
            raise status.InvalidArgument("volume_id is required")
        change = io_change_of(request.mutable_parameters)
        async with self.id_locks.hold(request.volume_id):
            lv = await self.store.find_by_volume_id(request.volume_id)
            if lv is not None:
                lv = await self.store.update_io_limits(
                    lv.name, lambda stored: changed_spec(change, stored)
                )
            if lv is None:
                raise status.NotFound(f"volume {request.volume_id} is not found")
        log.info("io limits set", extra={"volume_id": request.volume_id,
                                         "limits": lv.io_limits})  # fmt: skip
        return csi.ControllerModifyVolumeResponse()

    @rpc
    async def ValidateVolumeCapabilities(
        self, request: csi.ValidateVolumeCapabilitiesRequest, context: Ctx
    ) -> Any:
        if not request.volume_id:
            raise status.InvalidArgument("volume_id is required")
        if not request.volume_capabilities:
            raise status.InvalidArgument("volume_capabilities are required")
        async with self.id_locks.hold(request.volume_id):
            if await self.store.find_by_volume_id(request.volume_id) is None:
                raise status.NotFound(f"volume {request.volume_id} is not found")
        confirmed = csi.ValidateVolumeCapabilitiesResponse.Confirmed(
            volume_context=request.volume_context,
            volume_capabilities=request.volume_capabilities,
            parameters=request.parameters,
        )
        return csi.ValidateVolumeCapabilitiesResponse(confirmed=confirmed)

    @rpc
    async def ControllerGetCapabilities(
        self, request: csi.ControllerGetCapabilitiesRequest, context: Ctx
    ) -> Any:
        cap = csi.ControllerServiceCapability
        return csi.ControllerGetCapabilitiesResponse(
            capabilities=[cap(rpc=cap.RPC(type=t)) for t in CAPABILITIES]
        )

    # -- snapshots -------------------------------------------------------------------------

    @rpc
    async def CreateSnapshot(self, request: csi.CreateSnapshotRequest, context: Ctx) -> Any:
        if not request.source_volume_id:
            raise status.InvalidArgument("source_volume_id is required")
        if not request.name:
            raise status.InvalidArgument("name is required")
        name = request.name.lower()
        try:
            where = copies.placement(request.parameters, self.names)
        except copies.PlacementError as e:
            raise status.InvalidArgument(str(e)) from e
        async with self.name_locks.hold(name):
            snapshot = await self.snapshots.create(request, name, where)
        return csi.CreateSnapshotResponse(snapshot=snapshot)

    @rpc
    async def DeleteSnapshot(self, request: csi.DeleteSnapshotRequest, context: Ctx) -> Any:
        if not request.snapshot_id:
            raise status.InvalidArgument("snapshot_id is required")
        async with self.id_locks.hold(request.snapshot_id):
            await self._delete(request.snapshot_id)
        return csi.DeleteSnapshotResponse()

    # -- not offered (not in ControllerGetCapabilities) ------------------------------------

    ControllerPublishVolume = status.unimplemented(rpc, "ControllerPublishVolume", _NOT_OFFERED)
    ControllerUnpublishVolume = status.unimplemented(rpc, "ControllerUnpublishVolume", _NOT_OFFERED)
    ListVolumes = status.unimplemented(rpc, "ListVolumes", _NOT_OFFERED)
    ListSnapshots = status.unimplemented(rpc, "ListSnapshots", _NOT_OFFERED)
    ControllerGetVolume = status.unimplemented(rpc, "ControllerGetVolume", _NOT_OFFERED)
    GetSnapshot = status.unimplemented(rpc, "GetSnapshot", _NOT_OFFERED)

"""CSI Node service of topolvm-node (spec §6.3): publish LVs as filesystems or block devices.

There is no staging: NodePublishVolume formats (only a device blkid reports as empty), mounts
and grows in one step. Calls for the same volume are serialised; different volumes proceed
concurrently. Mount state always comes from ``/proc/self/mountinfo``, so mounts left by an
earlier process are recognised and reused rather than stacked.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from topolvm.constants import Names
from topolvm.csi.accessmode import mode_name
from topolvm.csi.mountflags import check_path
from topolvm.node import mounter
from topolvm.node.condition import InvalidLvAttr, condition_from_attr
from topolvm.node.csihooks import PublishHooks, VolumeLookup, run_hooks
from topolvm.node.csirequests import (
    check_capacity_range,
    mount_options,
    require,
)
from topolvm.node.lvmd_client import LvmdCallError, LvmdClient
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import lvmd_pb2 as lvmd_pb
from topolvm.rpc import status
from topolvm.rpc.locks import KeyedLocks
from topolvm.rpc.transport import Context, Status

log = logging.getLogger(__name__)

DEFAULT_FSTYPE = "ext4"
MAX_STACKED_MOUNTS = 64  # unpublish gives up after this many unmounts of one target
DEFAULT_DEVICE_CLASS = ""

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
Code = Status  # gRPC status codes
AccessMode = csi.VolumeCapability.AccessMode


_LOGGED = {"volume_id": "volume_id", "target_path": "target", "volume_path": "target"}


def _lvmd_failed(e: LvmdCallError, what: str) -> status.StatusError:
    """UNAVAILABLE while lvmd cannot be reached (restarting: the caller retries), else INTERNAL.
    Found by the chaos campaign: a NodePublishVolume just after lvmd was killed said INTERNAL."""
    if e.code is Code.UNAVAILABLE:
        return status.Unavailable(f"lvmd is unavailable ({what}): {e.message}")
    return status.Internal(f"{what}: {e.message}")


def _translate(e: Exception) -> status.StatusError | None:
    if isinstance(e, mounter.UnsupportedFilesystem):
        return status.InvalidArgument(str(e))
    if isinstance(e, LvmdCallError):
        return _lvmd_failed(e, "lvmd")
    if isinstance(e, mounter.MountError | OSError):
        return status.Internal(str(e))
    return None


def rpc(fn: F) -> F:
    """Map errors to gRPC status codes; log every call with volume, target, code and timing."""
    return status.rpc("csi.v1.Node", lambda r: status.fields_of(r, _LOGGED), _translate)(fn)


class NodeService:
    grpc_metrics: status.GrpcMetrics | None = None

    def __init__(
        self, node_name: str, names: Names, lvmd: LvmdClient, volumes: VolumeLookup,
        hooks: Sequence[PublishHooks] = (),
    ):  # fmt: skip
        self.node_name = node_name
        self.names = names
        self.lvmd = lvmd
        self.volumes = volumes
        self.hooks = hooks
        self.locks = KeyedLocks()

    # -- helpers ---------------------------------------------------------------------------

    async def _find_lv(
        self, volume_id: str, *, default_class: bool = False
    ) -> lvmd_pb.LogicalVolume:
        """The LV backing ``volume_id``; NOT_FOUND if its LogicalVolume or LV is missing.

        With ``default_class`` an unknown LogicalVolume falls back to the default device class
        (NodeExpandVolume's upstream behaviour).
        """
        device_class = await self.volumes.device_class_of(volume_id)
        fallback = device_class is None
        if device_class is None:
            if not default_class:
                raise status.NotFound(f"LogicalVolume for volume {volume_id} is not found")
            device_class = DEFAULT_DEVICE_CLASS
        try:
            volumes = await self.lvmd.get_lv_list(device_class)
        except LvmdCallError as e:
            if fallback and e.code is Code.NOT_FOUND:
                raise status.NotFound(f"failed to find LV: {volume_id}") from e
            raise _lvmd_failed(e, "failed to list LV") from e
        for lv in volumes:
            if lv.name == volume_id:
                if not lv.path:
                    raise status.Internal(f"lvmd reported no device path for {volume_id}")
                return lv
        raise status.NotFound(f"failed to find LV: {volume_id}")

    # -- publish ---------------------------------------------------------------------------

    @rpc
    async def NodePublishVolume(
        self, request: csi.NodePublishVolumeRequest, context: Context
    ) -> csi.NodePublishVolumeResponse:
        volume_id, target = request.volume_id, request.target_path
        require(volume_id, "volume_id")
        require(target, "target_path")
        if not request.HasField("volume_capability"):
            raise status.InvalidArgument("no volume_capability is provided")
        capability = request.volume_capability
        access_type = capability.WhichOneof("access_type")
        if access_type not in ("block", "mount"):
            raise status.InvalidArgument("no supported volume capability: neither block nor mount")
        mode = capability.access_mode.mode
        if mode != AccessMode.SINGLE_NODE_WRITER:
            raise status.FailedPrecondition(f"unsupported access mode: {mode_name(mode)} ({mode})")
        check_path(target, "target_path")
        fstype, options = "", []
        if access_type == "mount":
            fstype = capability.mount.fs_type or DEFAULT_FSTYPE
            mounter.check_supported(fstype)
            options = mount_options(request.readonly, capability.mount, fstype)
        async with self.locks.hold(volume_id):
            lv = await self._find_lv(volume_id)
            if (why := await self.volumes.unfilled(volume_id)) is not None:
                # never a half-copied volume in a pod (the controller does not hand it out
                # before the copy is verified either); kubelet retries
                raise status.Unavailable(f"volume {volume_id} is not ready: {why}")
            # before anything is mounted (a mount, a grow write to the volume)
            await run_hooks(self.hooks, "publishing", volume_id, target)
            if access_type == "block":
                await self._publish_block(volume_id, target, lv.path, request.readonly)
            else:
                await self._publish_filesystem(
                    volume_id, target, lv.path, fstype, options, request.readonly
                )
            await run_hooks(self.hooks, "published", volume_id, target, request.volume_context)
        return csi.NodePublishVolumeResponse()

    async def _publish_filesystem(
        self,
        volume_id: str,
        target: str,
        device: str,
        fstype: str,
        options: list[str],
        readonly: bool,
    ) -> None:
        try:
            await asyncio.to_thread(os.makedirs, target, 0o755, exist_ok=True)
        except OSError as e:
            raise status.Internal(f"mkdir failed: target={target}, error={e}") from e
        existing = await asyncio.to_thread(mounter.mounts_at, target)
        if existing:
            self._check_existing_mount(volume_id, target, device, existing[-1], readonly)
        current = await mounter.detect_filesystem(device)
        if current is not None and current != fstype:
            raise status.Internal(
                f"target device is already formatted with different filesystem: "
                f"volume={volume_id}, current={current}, new={fstype}",
            )
        if not existing:
            if current is None:
                if readonly:
                    raise status.Internal(
                        f"cannot format unformatted volume {volume_id} for a read-only publish",
                    )
                log.info(
                    "formatting volume",
                    extra={"volume_id": volume_id, "device": device, "fstype": fstype},
                )
                await mounter.wipefs(device)
                await mounter.mkfs(device, fstype)
                await mounter.mount(device, target, fstype, [*options, "defaults"])
            else:
                await mounter.mount(device, target, fstype, options)
            try:
                if not readonly:  # a read-only filesystem keeps the mode it was given rw
                    await asyncio.to_thread(os.chmod, target, 0o2777)
            except OSError as e:
                raise status.Internal(f"chmod 2777 failed: target={target}, error={e}") from e
        if readonly:
            return  # a read-only mount cannot be grown; the next read-write publish will
        if await mounter.needs_resize(device, target, fstype):
            log.info("growing filesystem", extra={"volume_id": volume_id, "target": target})
            try:
                await mounter.grow(device, target, fstype)
            except mounter.MountError as e:
                raise status.Internal(
                    f"failed to resize filesystem {volume_id} (mounted at: {target}): {e}",
                ) from e

    @staticmethod
    def _check_existing_mount(
        volume_id: str, target: str, device: str, top: mounter.MountEntry, readonly: bool
    ) -> None:
        """An already-mounted target is fine only if it shows this volume, as requested."""
        if not mounter.mount_uses_device(top, device):
            raise status.AlreadyExists(
                f"{target} is already mounted from {top.source}, not from volume {volume_id}",
            )
        if top.readonly != readonly:
            now = "read-only" if top.readonly else "read-write"
            raise status.AlreadyExists(f"volume {volume_id} is already published {now} at {target}")

    async def _publish_block(
        self, volume_id: str, target: str, device: str, readonly: bool
    ) -> None:
        rdev = mounter.device_number(device)
        existing = await asyncio.to_thread(mounter.mounts_at, target)
        if existing:
            seen = await asyncio.to_thread(mounter.bind_target_device, target)
            if seen != rdev:
                raise status.AlreadyExists(
                    f"{target} is already mounted from {existing[-1].source}, "
                    f"not from volume {volume_id}",
                )
            if existing[-1].readonly != readonly:
                now = "read-only" if existing[-1].readonly else "read-write"
                raise status.AlreadyExists(
                    f"volume {volume_id} is already published {now} at {target}",
                )
            return
        try:
            await asyncio.to_thread(mounter.create_file, target)
        except OSError as e:
            raise status.Internal(f"create failed: target={target}, error={e}") from e
        try:
            await mounter.bind_mount(device, target, readonly)
        except mounter.MountError as e:
            raise status.Internal(f"(bind)mount failed: volume={volume_id}, error={e}") from e

    # -- unpublish -------------------------------------------------------------------------

    @rpc
    async def NodeUnpublishVolume(
        self, request: csi.NodeUnpublishVolumeRequest, context: Context
    ) -> csi.NodeUnpublishVolumeResponse:
        volume_id, target = request.volume_id, request.target_path
        require(volume_id, "volume_id")
        require(target, "target_path")
        check_path(target, "target_path")
        async with self.locks.hold(volume_id):
            await run_hooks(self.hooks, "unpublishing", volume_id, target)
            await self._unpublish(volume_id, target)
            await run_hooks(self.hooks, "unpublished", volume_id, target)
        return csi.NodeUnpublishVolumeResponse()

    async def _unpublish(self, volume_id: str, target: str) -> None:
        try:
            await asyncio.to_thread(os.stat, target)
        except FileNotFoundError:
            if not await asyncio.to_thread(mounter.is_mount_point, target):
                await asyncio.to_thread(mounter.remove_legacy_device, volume_id)
                return
            # a mount point whose filesystem is gone: unmount it all the same
        except OSError as e:
            if not await asyncio.to_thread(mounter.is_mount_point, target):
                raise status.Internal(f"stat failed for {target}: {e}") from e
        # Unmount until nothing is mounted here (stacked mounts from older bugs included).
        for _ in range(MAX_STACKED_MOUNTS):
            if not await asyncio.to_thread(mounter.is_mount_point, target):
                break
            try:
                await mounter.umount(target)
            except mounter.MountError as e:
                raise status.Internal(f"unmount failed for {target}: error={e}") from e
        else:
            raise status.Internal(f"{target} is still mounted after {MAX_STACKED_MOUNTS} unmounts")
        try:
            await asyncio.to_thread(mounter.remove_target, target)
        except OSError as e:
            raise status.Internal(f"remove failed for {target}: {e}") from e

    # -- stats -----------------------------------------------------------------------------

    @rpc
    async def NodeGetVolumeStats(
        self, request: csi.NodeGetVolumeStatsRequest, context: Context
    ) -> csi.NodeGetVolumeStatsResponse:
        volume_id, path = request.volume_id, request.volume_path
        require(volume_id, "volume_id")
        require(path, "volume_path")
        if not os.path.isabs(path):
            raise status.NotFound(f"Volume is not found at {path}")
        check_path(path, "volume_path")
        async with self.locks.hold(volume_id):
            try:
                st = await asyncio.to_thread(os.stat, path)
            except FileNotFoundError as e:
                raise status.NotFound(f"Volume is not found at {path}") from e
            except OSError as e:
                raise status.Internal(f"stat on {path} was failed: {e}") from e
            if stat.S_ISBLK(st.st_mode):
                size = await asyncio.to_thread(mounter.device_size, path)
                return csi.NodeGetVolumeStatsResponse(
                    usage=[csi.VolumeUsage(unit=csi.VolumeUsage.BYTES, total=size)]
                )
            if not stat.S_ISDIR(st.st_mode):
                raise status.Internal(f"invalid mode bits for {path}: {st.st_mode:o}")
            fs = await asyncio.to_thread(mounter.fs_stats, path)
            usage = []
            if fs.total_bytes > 0:
                usage.append(
                    csi.VolumeUsage(
                        unit=csi.VolumeUsage.BYTES,
                        total=fs.total_bytes,
                        used=fs.used_bytes,
                        available=fs.available_bytes,
                    )
                )
            if fs.total_inodes > 0:
                usage.append(
                    csi.VolumeUsage(
                        unit=csi.VolumeUsage.INODES,
                        total=fs.total_inodes,
                        used=fs.used_inodes,
                        available=fs.free_inodes,
                    )
                )
            lv = await self._find_lv(volume_id)
            try:
                condition = condition_from_attr(lv.attr)
            except InvalidLvAttr as e:
                raise status.Internal(str(e)) from e
        return csi.NodeGetVolumeStatsResponse(
            usage=usage,
            volume_condition=csi.VolumeCondition(
                abnormal=condition.abnormal, message=condition.message
            ),
        )

    # -- expand ----------------------------------------------------------------------------

    @rpc
    async def NodeExpandVolume(
        self, request: csi.NodeExpandVolumeRequest, context: Context
    ) -> csi.NodeExpandVolumeResponse:
        volume_id, path = request.volume_id, request.volume_path
        require(volume_id, "volume_id")
        require(path, "volume_path")
        if os.path.isabs(path):
            check_path(path, "volume_path")
        check_capacity_range(request)
        if request.volume_capability.HasField("block"):
            return csi.NodeExpandVolumeResponse()  # the LV already has its new size
        async with self.locks.hold(volume_id):
            lv = await self._find_lv(volume_id, default_class=True)
            mounts = await asyncio.to_thread(mounter.mounts_at, path) if os.path.isabs(path) else []
            if not mounts:
                raise status.Internal(f"filesystem {volume_id} is not mounted at {path}")
            top = mounts[-1]
            if await asyncio.to_thread(mounter.bind_target_device, path) == (
                mounter.device_number(lv.path)
            ):
                return csi.NodeExpandVolumeResponse()  # a published block volume
            if not mounter.mount_uses_device(top, lv.path):
                raise status.Internal(
                    f"{path} is mounted from {top.source}, not from volume {volume_id}",
                )
            try:
                await mounter.grow(lv.path, path, top.fstype)
            except mounter.MountError as e:
                raise status.Internal(
                    f"failed to resize filesystem {volume_id} (mounted at: {path}): {e}",
                ) from e
        return csi.NodeExpandVolumeResponse()

    # -- no staging ------------------------------------------------------------------------

    @rpc
    async def NodeStageVolume(
        self, request: csi.NodeStageVolumeRequest, context: Context
    ) -> csi.NodeStageVolumeResponse:
        raise status.Unimplemented("NodeStageVolume is not implemented")

    @rpc
    async def NodeUnstageVolume(
        self, request: csi.NodeUnstageVolumeRequest, context: Context
    ) -> csi.NodeUnstageVolumeResponse:
        raise status.Unimplemented("NodeUnstageVolume is not implemented")

    # -- info ------------------------------------------------------------------------------

    @rpc
    async def NodeGetCapabilities(
        self, request: csi.NodeGetCapabilitiesRequest, context: Context
    ) -> csi.NodeGetCapabilitiesResponse:
        rpc_cap = csi.NodeServiceCapability.RPC
        return csi.NodeGetCapabilitiesResponse(
            capabilities=[
                csi.NodeServiceCapability(rpc=rpc_cap(type=t))
                for t in (rpc_cap.GET_VOLUME_STATS, rpc_cap.EXPAND_VOLUME, rpc_cap.VOLUME_CONDITION)
            ]
        )

    @rpc
    async def NodeGetInfo(
        self, request: csi.NodeGetInfoRequest, context: Context
    ) -> csi.NodeGetInfoResponse:
        return csi.NodeGetInfoResponse(
            node_id=self.node_name,
            accessible_topology=csi.Topology(segments={self.names.topology_key: self.node_name}),
        )

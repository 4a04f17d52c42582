"""IO limits in force (docs/qos.md): each LogicalVolume's ``spec.ioLimits``, written as cgroup
v2 ``io.max`` lines for the volume's device in the cgroup of every pod that mounts it.

When: after every NodePublishVolume (a new pod, or the same one again), whenever the informer
shows a volume of this node whose limits or size changed (a new VolumeAttributesClass, an
expansion of a per-GiB limit; live, the pod running), and for every volume when topolvm-node
starts (its informer lists them all). A sync reads the volume's latest object when it runs, and
syncs of one volume run one at a time (a request during one runs once after it), so an older
spec never overwrites a newer one. A sync that fails for a transient reason is tried again
(2 s, doubling to a minute). NodeUnpublishVolume lifts the pod's limit first.

Which pods: those whose kubelet publish target, in this process's mount table, shows the
volume's device (a filesystem mounted from it; a block device node bound to it). Only those
targets are looked at (never another driver's mount, which could hang), and nothing is kept in
memory that a restart would lose.

A node whose cgroups cannot take a limit (cgroup v1, no io controller, a kernel without block
throttling, topolvm-node without the host's cgroups) says so: a warning Event on the
LogicalVolume (and the pod when known) and the log, once per volume and reason, and the Node
condition (:mod:`topolvm.node.iocondition`); the volume works without limits. Paths and the
line's form are :mod:`topolvm.node.podcgroup`'s and :mod:`topolvm.iolimits`'s (pure).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lightkube import AsyncClient

from topolvm import iolimits
from topolvm.constants import Names
from topolvm.k8s import api, events
from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import LogicalVolumeObject
from topolvm.k8s.lvstore import AmbiguousVolumeId, LogicalVolumeStore
from topolvm.k8s.runtime import Informer
from topolvm.node import mounter, podcgroup
from topolvm.node.iocondition import NodeCondition, read_support
from topolvm.node.iometrics import InForce
from topolvm.node.volumes import LvmdVolumes
from topolvm.quantity import InvalidQuantity
from topolvm.rpc.locks import KeyedLocks
from topolvm.transfer.errors import TransferError

log = logging.getLogger(__name__)

CGROUP_ROOT = "/sys/fs/cgroup"
SEARCH_DEPTH = 4  # how deep below the root a pod's folder is looked for (--cgroup-root)
RETRY_FIRST, RETRY_MOST = 2.0, 60.0


class IoLimitError(Exception):
    """A limit cannot be put in force on this node; the message says why and what to do."""


class NodeCannotLimit(IoLimitError):
    """No limit can be put in force on this node (the Node condition says why)."""

    def __init__(self, support: podcgroup.Support) -> None:
        super().__init__(support.message)
        self.support = support


@dataclass(frozen=True)
class PodRef:
    """The pod a publish was for (from the kubelet's podInfoOnMount keys)."""

    namespace: str
    name: str


@dataclass(frozen=True)
class Device:
    path: str
    major: int
    minor: int
    size: int


class IoLimiter:
    def __init__(
        self, client: AsyncClient, names: Names, node: str, store: LogicalVolumeStore,
        volumes: LvmdVolumes, root: str = CGROUP_ROOT, mountinfo: str = mounter.MOUNTINFO,
    ) -> None:  # fmt: skip
        self.client = client
        self.names = names
        self.node = node
        self.store = store
        self.volumes = volumes
        self.root = Path(root) if root else None  # None: limits are off on this node
        self.condition = NodeCondition(client, node, self.root)
        self.mountinfo = mountinfo
        self._applied: dict[str, tuple[tuple[tuple[str, int], ...], int]] = {}  # name -> _key
        self._pods: dict[str, PodRef] = {}  # pod UID -> pod, while it has a volume published
        # (pod UID, volume id) being unpublished: no sync limits them again (kept until the pod
        # publishes the volume again, or a sync of the volume no longer finds it mounted there)
        self._leaving: set[tuple[str, str]] = set()
        self._warned: set[tuple[str, str]] = set()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()  # volumes asked for while their sync runs
        self._retry: dict[str, float] = {}  # volume -> the next retry's delay
        self._locks = KeyedLocks()  # per volume: a sync, or an unpublish's lift
        self._pod_parents: set[Path] = set()  # folders below the root where pods were found
        self.in_force: dict[str, InForce] = {}  # volume -> its limits as written (metrics)

    # -- wiring ---------------------------------------------------------------------------

    def watch(self, informer: Informer) -> None:
        """Sync every volume of this node whose limits or size the informer shows changed
        (all of them once, when it lists them first)."""

        def on_event(event: str, obj: api.Obj) -> None:
            name = str(obj["metadata"]["name"])
            if event == "DELETED":
                self._applied.pop(name, None)
                self.in_force.pop(name, None)
                self._retry.pop(name, None)
                self._warned = {w for w in self._warned if w[0] != name}
                vid = (obj.get("status") or {}).get("volumeID")
                self._leaving = {w for w in self._leaving if w[1] != vid}
                return
            try:
                lv = LogicalVolumeObject.from_dict(obj)
            except (InvalidQuantity, KeyError, TypeError, ValueError):
                return
            if lv.node_name != self.node or not lv.volume_id or lv.deleting:
                return
            if self._applied.get(lv.name) != _key(lv):
                self.schedule(lv.name)

        informer.add_handler(on_event)

    def schedule(self, name: str) -> None:
        """Sync volume ``name`` soon: now, or once more after the sync that runs."""
        task = self._tasks.get(name)
        if task is not None and not task.done():
            self._again.add(name)
            return
        self._tasks[name] = asyncio.create_task(self._run(name), name=f"io-limits-{name}")

    async def _run(self, name: str) -> None:
        while True:
            self._again.discard(name)
            try:
                lv = await self.store.get(name)  # the latest: the cache, else the API
            except (kube.KubeError, InvalidQuantity, KeyError, TypeError, ValueError) as e:
                log.warning("io limits: cannot read the volume",
                            extra={"lv": name, "error": str(e)})  # fmt: skip
                lv = None
            if lv is not None and lv.node_name == self.node and lv.volume_id:
                await self._sync_logged(lv)
            if name not in self._again:
                self._tasks.pop(name, None)
                return

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the CSI calls' side --------------------------------------------------------------

    async def _lv(self, volume_id: str) -> LogicalVolumeObject | None:
        try:
            return await self.store.find_by_volume_id(volume_id)
        except (kube.KubeError, AmbiguousVolumeId) as e:
            log.warning("io limits: cannot read the volume", extra={"volume_id": volume_id,
                                                                    "error": str(e)})  # fmt: skip
            return None

    async def published(self, volume_id: str, target: str, context: Mapping[str, str]) -> None:
        """After NodePublishVolume: the new pod gets the volume's limits."""
        uid = context.get("csi.storage.k8s.io/pod.uid") or podcgroup.pod_of_target(target)
        name = context.get("csi.storage.k8s.io/pod.name", "")
        namespace = context.get("csi.storage.k8s.io/pod.namespace", "")
        self._leaving.discard((uid or "", volume_id))  # published again: before any return
        lv = await self._lv(volume_id)
        if lv is None or (not lv.io_limits and lv.name not in self._applied):
            return  # no limits (and none written by this process: the start-up sync lifts)
        if uid and name and namespace:
            self._pods[uid] = PodRef(namespace, name)
        self.schedule(lv.name)
        task = self._tasks.get(lv.name)
        if task is not None:  # in force before the container starts, as far as it can be
            await asyncio.shield(task)

    async def unpublishing(self, volume_id: str, target: str) -> None:
        """Before NodeUnpublishVolume unmounts: the pod's limit on the device is lifted (the
        unmount's writeback is not throttled), whatever the spec says now."""
        uid = podcgroup.pod_of_target(target)
        if uid is None:
            return
        self._pods.pop(uid, None)
        self._leaving.add((uid, volume_id))  # from now on no sync limits this pod's use of it
        lv = None if self.root is None else await self._lv(volume_id)
        if lv is None:
            return
        async with self._locks.hold(lv.name):  # after a sync that runs: then lifted
            try:
                device = await self._device(lv)
                folder = await asyncio.to_thread(self._pod_dir, uid)
                if folder is not None and await asyncio.to_thread(_has_entry, folder, device):
                    line = iolimits.io_max_line(device.major, device.minor, iolimits.IoLimits(), 0)
                    await asyncio.to_thread(self._write, folder, line)
            except (TransferError, mounter.MountError, IoLimitError, OSError) as e:
                log.warning("io limits: not lifted at unpublish",
                            extra={"lv": lv.name, "pod": uid, "error": str(e)})  # fmt: skip

    async def unpublished(self, volume_id: str, target: str) -> None:
        """Nothing more: the limit was lifted before the unmount."""

    async def publishing(self, volume_id: str, target: str) -> None:
        """Nothing yet: the pod's cgroup gets the limit once the volume is published."""

    # -- one volume -----------------------------------------------------------------------

    async def _sync_logged(self, lv: LogicalVolumeObject) -> None:
        try:
            await self.sync(lv)
            self._retry.pop(lv.name, None)
        except NodeCannotLimit as e:
            await self.condition.report(e.support)
            await self._warn(lv, str(e))
        except IoLimitError as e:
            await self._warn(lv, str(e))
        except (TransferError, mounter.MountError, kube.KubeError, OSError) as e:
            delay = self._retry.get(lv.name, RETRY_FIRST)
            self._retry[lv.name] = min(delay * 2, RETRY_MOST)
            log.warning("io limits: cannot apply; trying again", extra={
                "lv": lv.name, "error": str(e), "retry_in": delay})  # fmt: skip
            asyncio.get_running_loop().call_later(delay, self.schedule, lv.name)

    async def sync(self, lv: LogicalVolumeObject) -> None:
        """Put ``lv``'s limits in force for every pod that has it mounted (or lift them)."""
        try:
            limits = iolimits.IoLimits.from_spec(lv.io_limits)
        except iolimits.InvalidLimits as e:
            raise IoLimitError(f"spec.ioLimits of {lv.name} is not valid: {e}") from e
        if self.root is None:
            if limits.none:
                return
            raise NodeCannotLimit(podcgroup.support(self.node, None))
        async with self._locks.hold(lv.name):
            device = await self._device(lv)
            line = iolimits.io_max_line(device.major, device.minor, limits, device.size)
            pods = await asyncio.to_thread(self._pods_using, device)
            written: dict[str, Path] = {}
            leaving = {uid for uid, vid in self._leaving if vid == lv.volume_id}
            self._leaving -= {(uid, lv.volume_id) for uid in leaving - pods}  # unmounted: done
            for uid in sorted(pods - leaving):
                folder = await asyncio.to_thread(self._pod_dir, uid)
                if folder is None:
                    if limits.none:
                        continue
                    raise IoLimitError(
                        f"the cgroup of pod {uid} (which mounts {lv.name}) is not under "
                        f"{self.root}: a kubelet cgroup layout this node does not know"
                    )
                if limits.none and not await asyncio.to_thread(_has_entry, folder, device):
                    continue  # nothing to lift
                await asyncio.to_thread(self._write, folder, line)
                written[uid] = folder
                log.info("io limits in force", extra={"lv": lv.name, "pod": uid, "line": line})
            self._applied[lv.name] = _key(lv)
            if written and not limits.none and not self.condition.confirmed:
                folder = next(iter(written.values()))
                await self.condition.report(
                    await asyncio.to_thread(read_support, self.node, self.root, folder)
                )
            if limits.none:
                self.in_force.pop(lv.name, None)
            else:
                self.in_force[lv.name] = InForce(device.major, device.minor,
                                                 limits.at(device.size), written)  # fmt: skip

    async def _device(self, lv: LogicalVolumeObject) -> Device:
        info = await self.volumes.describe(lv.volume_id, lv.device_class)
        rdev = await asyncio.to_thread(mounter.device_number, info.path)
        return Device(info.path, os.major(rdev), os.minor(rdev), info.size)

    # -- cgroups (in a worker thread) -----------------------------------------------------

    def _pods_using(self, device: Device) -> set[str]:
        """The UIDs of the pods whose kubelet publish target shows ``device``: a filesystem
        target by the mount's device number (or, for btrfs, its source); a block target (a
        device node bound from /dev) by the node's number. Nothing else is stat'ed."""
        pods: set[str] = set()
        for entry in mounter.read_mountinfo(self.mountinfo):
            uid = podcgroup.pod_of_target(entry.mount_point)
            if uid is None or uid in pods:
                continue
            if podcgroup.is_block_target(entry.mount_point):
                bound = mounter.bind_target_device(entry.mount_point)
                if bound is not None and (os.major(bound), os.minor(bound)) == (
                    device.major, device.minor,
                ):  # fmt: skip
                    pods.add(uid)
            elif (entry.major, entry.minor) == (device.major, device.minor) or (
                entry.source == device.path
            ):
                pods.add(uid)
        return pods

    def _pod_dir(self, uid: str) -> Path | None:
        if self.root is None:
            return None
        for rel in podcgroup.pod_dirs(uid):
            if (self.root / rel).is_dir():
                return self.root / rel
        for parent in self._pod_parents:
            for found in parent.iterdir():
                if podcgroup.is_pod_dir(found.name, uid):
                    return found
        for top, dirs, _ in os.walk(self.root):  # a kubelet with --cgroup-root
            depth = len(Path(top).relative_to(self.root).parts)
            for d in dirs:
                if podcgroup.is_pod_dir(d, uid):
                    self._pod_parents.add(Path(top))
                    return Path(top) / d
            if depth >= SEARCH_DEPTH:
                dirs.clear()
        return None

    def _check_controller(self, folder: Path) -> None:
        """A pod's cgroup without ``io.max``: why (raised), unless it has one by now."""
        support = read_support(self.node, self.root, folder)
        if not support.ok:
            raise NodeCannotLimit(support)

    def _write(self, folder: Path, line: str) -> None:
        if not (folder / "io.max").exists():
            if folder.exists():
                self._check_controller(folder)
            return  # the pod's cgroup went meanwhile: nothing to limit
        try:
            (folder / "io.max").write_text(line + "\n")
        except FileNotFoundError:
            return  # went meanwhile
        except OSError as e:
            raise IoLimitError(f"{folder}/io.max refused {line!r}: {e.strerror}") from e

    # -- telling --------------------------------------------------------------------------

    async def _warn(self, lv: LogicalVolumeObject, message: str) -> None:
        if (lv.name, message) in self._warned:
            return
        self._warned.add((lv.name, message))
        log.warning("io limits: not in force", extra={"lv": lv.name, "error": message})
        about = [events.ObjectRef("LogicalVolume", iolimits.EVENT_NAMESPACE, lv.name,
                                  f"{self.names.group}/v1")]  # fmt: skip
        pods = await asyncio.to_thread(self._pods_of, lv)
        about += [events.ObjectRef("Pod", p.namespace, p.name) for p in pods]
        for ref in about:
            try:
                await events.post(self.client, ref, iolimits.NOT_IN_FORCE_REASON, message,
                                  warning=True, component="topolvm-node")  # fmt: skip
            except kube.KubeError as e:
                log.warning("io limits: cannot post an Event", extra={"lv": lv.name,
                            "about": ref.name, "error": kube.describe(e)})  # fmt: skip

    def _pods_of(self, lv: LogicalVolumeObject) -> list[PodRef]:
        """The pods known by name that have ``lv`` published (for the Event)."""
        targets = {podcgroup.pod_of_target(e.mount_point)
                   for e in mounter.read_mountinfo(self.mountinfo)
                   if lv.name in e.mount_point}  # fmt: skip
        return [self._pods[uid] for uid in sorted(t for t in targets if t) if uid in self._pods]


def _key(lv: LogicalVolumeObject) -> tuple[tuple[tuple[str, int], ...], int]:
    """What decides the lines written: the limits, and the size a per-GiB limit scales by."""
    return tuple(sorted(lv.io_limits.items())), lv.current_size or lv.size


def _has_entry(folder: Path, device: Device) -> bool:
    try:
        text = (folder / "io.max").read_text()
    except OSError:
        return False
    return (device.major, device.minor) in podcgroup.parse_device_lines(text)

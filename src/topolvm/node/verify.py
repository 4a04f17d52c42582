"""Verification digests of this node's volumes (docs/mobility.md, "Verifying a move").

``spec.verify.id`` of a LogicalVolume asks its node for a digest of the volume's content at one
instant. The node cuts the volume at once (a thin snapshot, or a COW snapshot made by lvmd's
CreateCut: as large as the volume where there is room, else smaller), writes
``status.verify: {id, phase: Cut}`` as soon as the cut exists (from then on the volume may
change: a moved pod may start on it), reads the cut whole, one volume at a time per node, and
writes ``{id, phase: Done, digest, sizeBytes, completionTime}``, or ``{phase: Failed, message}``
(the cut overflowed, or was lost), then removes its cut, ``verify.<LogicalVolume UID>``.

A restarted node goes on from the status: no Cut recorded for the id yet, the volume has not
changed since it was asked (whatever cut is there may be older: it is made again); Cut recorded,
the cut is read again from its start, or, gone, the verification fails (a new cut could hold
what was written since). A digest is written only while ``spec.verify.id`` is still the one it
was made for. Errors lvmd or the API server may mend are retried with backoff, and say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from grpclib.const import Status
from lightkube import AsyncClient

from topolvm.constants import Names
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import (
    InvalidQuantity,
    LogicalVolumeObject,
    VerifyPhase,
    VerifyStatus,
)
from topolvm.k8s.stamps import now
from topolvm.node.lvmd_client import LvmdCallError, LvmdClient
from topolvm.node.verifyread import (
    VERIFY_COW_SHARE,
    Stopped,
    content_digest,
    in_background,
    uid_of_verify_cut,
    verify_cut_name,
)
from topolvm.node.volumes import CUT_TAG, LvmdVolumes
from topolvm.proto import lvmd_pb2 as pb
from topolvm.proto import volumedata_pb2 as vd
from topolvm.transfer.errors import TransferError
from topolvm.units import human

log = logging.getLogger(__name__)
# lvmd's answers that waiting may mend; any other fails the verification
TRANSIENT = frozenset({Status.UNAVAILABLE, Status.INTERNAL, Status.UNKNOWN,
                       Status.DEADLINE_EXCEEDED, Status.ABORTED})  # fmt: skip
# A read cut is removed this long after its digest at the soonest, and not while another
# verification of the node waits for its cut (at most CUTS_FIRST more): the claims of one moved
# pod are asked for within a second or so, their pod starts once every cut is made, and lvmd
# runs one LVM change at a time (an lvremove going first held a second cut back 1.5 s).
REMOVE_AFTER = 1.5
CUTS_FIRST = 10.0


class VerifyFailed(Exception):
    """What no retry mends: the verification fails (status.verify.phase Failed)."""


class VerifyJobs:
    def __init__(
        self, client: AsyncClient, names: Names, node: str, lvmd: LvmdClient,
        bandwidth: int = 0, retry_first: float = 2.0, retry_max: float = 60.0,
    ) -> None:  # fmt: skip
        self.client = client
        self.node = node
        self.lvmd = lvmd
        self.volumes = LvmdVolumes(lvmd)
        self.bandwidth = bandwidth
        self.retry = (retry_first, retry_max)
        self._uncut: set[str] = set()  # LogicalVolumes whose job has not made its cut yet
        self._cut_made = asyncio.Condition()
        self.resource = api.logicalvolume_resource(names)
        self._tasks: dict[str, tuple[str, asyncio.Task[None]]] = {}  # name -> (id, job)
        self._reading = asyncio.Semaphore(1)  # one volume read at a time per node
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify")

    # -- the reconciler's side ----------------------------------------------------------

    def ensure(self, lv: LogicalVolumeObject) -> None:
        """A job for ``lv``'s ``spec.verify.id`` (started now unless one runs; one for an
        earlier id is stopped first)."""
        running = self._tasks.get(lv.name)
        if running is not None and not running[1].done():
            if running[0] == lv.verify_id:
                return
            running[1].cancel()
        earlier = running[1] if running is not None else None
        task = asyncio.create_task(self._job(lv.name, lv.verify_id, earlier),
                                   name=f"verify-{lv.name}")  # fmt: skip
        self._tasks[lv.name] = (lv.verify_id, task)

    def running(self) -> list[str]:
        """The LogicalVolumes whose verification runs now."""
        return [name for name, (_, task) in self._tasks.items() if not task.done()]

    async def forget(self, lv: LogicalVolumeObject) -> None:
        """``lv`` is going: its job stopped, its cut removed (a COW cut would keep lvmd from
        removing the LV). Raises :class:`LvmdCallError` if the cut cannot be removed."""
        await self._cancel(lv.name)
        await self._remove_cut(lv.uid, lv.device_class)

    async def stop(self) -> None:
        for name in list(self._tasks):
            await self._cancel(name)
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _cancel(self, name: str) -> None:
        running = self._tasks.pop(name, None)
        if running is not None:
            running[1].cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await running[1]

    # -- one job ----------------------------------------------------------------------------

    async def _job(self, name: str, verify_id: str, earlier: asyncio.Task[None] | None) -> None:
        if earlier is not None:  # its thread no longer reads, its cut is not removed under us
            # (asyncio.wait: this job's own cancel ends it, and is not passed on to the earlier)
            await asyncio.wait({earlier})
        self._uncut.add(name)
        try:
            await self._tries(name, verify_id)
        finally:
            await self._made(name)

    async def _tries(self, name: str, verify_id: str) -> None:
        delay = self.retry[0]
        while True:
            lv = None
            try:
                lv = await self._read(name)
                if lv is None or lv.verify_id != verify_id or not lv.verify_pending:
                    return
                if lv.deleting or not lv.ready:
                    return  # the reconciler starts it again once the volume holds its data
                await self._attempt(lv)
                return
            except VerifyFailed as e:
                assert lv is not None
                log.error("verification failed", extra={"lv": name, "id": verify_id,
                                                        "error": str(e)})  # fmt: skip
                with contextlib.suppress(kube.KubeError):  # else it is found again, and said
                    await self._ended(lv, VerifyPhase.FAILED, message=f"verification failed: {e}")
                    return
            except (LvmdCallError, TransferError, kube.KubeError) as e:
                what = kube.describe(e) if isinstance(e, kube.KubeError) else str(e)
                ctx = {"lv": name, "id": verify_id, "error": what, "retry_in": delay}
                log.warning("verification waits", extra=ctx)
                if lv is not None:
                    await self._waiting(lv, f"waiting: {what}; next try in {delay:.0f}s")
            except Exception:  # a defect: logged with its traceback, and the job goes on
                log.exception("verification: unexpected error", extra={"lv": name})
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry[1])

    async def _attempt(self, lv: LogicalVolumeObject) -> None:
        st = lv.verify
        dc = lv.device_class
        cut = verify_cut_name(lv.uid)
        if st is not None and st.id == lv.verify_id and st.phase == VerifyPhase.CUT:
            try:  # a restarted node: the cut made for this id, read again from its start
                info = await self.lvmd.describe_lv(cut, dc)
            except LvmdCallError as e:
                if e.code is Status.NOT_FOUND:
                    raise VerifyFailed(f"its point-in-time cut {cut} is gone (removed while "
                                       f"its node was down?)") from e  # fmt: skip
                raise
        else:
            if await self._cut_exists(cut, dc):  # an earlier id's, or one not reported
                await self._remove_cut(lv.uid, dc)
            info = await self._cut(lv, cut)
            st = VerifyStatus(lv.verify_id, VerifyPhase.CUT, message="cut made; reading it",
                              cut_time=now())  # fmt: skip
            await self._write(lv.name, st)
            log.info("verification cut made", extra={"lv": lv.name, "cut": cut,
                                                     "id": lv.verify_id})  # fmt: skip
        await self._made(lv.name)
        size = lv.verify_size or int(info.size_bytes)
        if size > info.size_bytes:
            raise VerifyFailed(f"asked for a digest of {size} bytes of a {info.size_bytes}-byte "
                               "volume")  # fmt: skip
        async with self._reading:
            digest = await self._digest(lv, cut, info, size)
        current = await self._read(lv.name)
        if current is None or current.uid != lv.uid or current.verify_id != lv.verify_id:
            await self._remove_cut(lv.uid, dc)
            return  # asked again meanwhile, or gone: this digest answers nothing
        await self._ended(current, VerifyPhase.DONE, digest=digest.hex(), size=size)
        ctx = {"lv": lv.name, "id": lv.verify_id, "bytes": size, "digest": digest.hex()[:16]}
        log.info("verification done", extra=ctx)

    async def _cut(self, lv: LogicalVolumeObject, cut: str) -> vd.DescribeLVResponse:
        size = lv.current_size or lv.size
        req = vd.CreateCutRequest(name=cut, device_class=lv.device_class,
                                  source_volume=lv.volume_id, tags=[CUT_TAG],
                                  min_cow_bytes=max(size // VERIFY_COW_SHARE, 1))  # fmt: skip
        try:
            await self.lvmd.create_cut(req)
        except LvmdCallError as e:
            if e.code in TRANSIENT:
                raise
            raise VerifyFailed(f"cannot cut {lv.volume_id} to verify it: {e.message}") from e
        return await self.lvmd.describe_lv(cut, lv.device_class)

    async def _digest(
        self, lv: LogicalVolumeObject, cut: str, info: vd.DescribeLVResponse, size: int
    ) -> bytes:
        dc = lv.device_class
        mapped = await self.volumes.mapped(cut, dc) if info.thin else None
        stop = threading.Event()

        def work() -> bytes:
            in_background()
            return content_digest(info.path, size, mapped, stop, self.bandwidth)

        future = asyncio.get_running_loop().run_in_executor(self._pool, work)
        try:
            digest: bytes = await asyncio.shield(future)
        except asyncio.CancelledError:
            stop.set()  # the thread stops at its next record: wait for it, it reads the cut
            with contextlib.suppress(Exception):
                await asyncio.wait_for(future, 60)
            raise
        except (TransferError, Stopped) as e:
            await self._overflowed(cut, dc, info)
            raise TransferError(f"cannot read the cut {cut}: {e}") from e
        await self._overflowed(cut, dc, info)  # reads before an overflow were fine; be sure
        return digest

    async def _overflowed(self, cut: str, dc: str, info: vd.DescribeLVResponse) -> None:
        if info.thin:
            return
        state = await self.lvmd.describe_lv(cut, dc, check_snapshot=True)
        if state.invalid:
            raise VerifyFailed(
                f"its point-in-time cut {cut} overflowed: the volume changed by more than the "
                f"cut's {human(state.cow_bytes)} copy-on-write area while it was read (its node "
                "had no room for a larger one)"
            )

    # -- status and cuts --------------------------------------------------------------------

    async def _read(self, name: str) -> LogicalVolumeObject | None:
        obj = await api.get(self.client, self.resource, name)
        try:
            return None if obj is None else LogicalVolumeObject.from_dict(obj)
        except (InvalidQuantity, KeyError, TypeError, ValueError) as e:
            log.error("ignoring malformed LogicalVolume", extra={"lv": name, "error": str(e)})
            return None

    async def _write(self, name: str, st: VerifyStatus) -> None:
        with contextlib.suppress(kube.NotFound):
            await api.patch_merge(self.client, self.resource.Status, name,
                                  {"status": {"verify": st.to_patch()}})  # fmt: skip

    async def _waiting(self, lv: LogicalVolumeObject, message: str) -> None:
        """Say why the job waits, keeping the phase the status has now: a Cut written by this
        job before the error stays Cut (read as Pending, the next try would cut again, after
        the moved pod may have written)."""
        try:
            fresh = await self._read(lv.name)
            if fresh is None or fresh.uid != lv.uid:
                return
            st = fresh.verify
            if st is not None and st.id == lv.verify_id and st.phase in VerifyPhase.ENDED:
                return  # answered already: a wait's message must not reopen it
            if st is None or st.id != lv.verify_id or st.phase != VerifyPhase.CUT:
                st = VerifyStatus(lv.verify_id, VerifyPhase.PENDING)
            await self._write(lv.name, replace(st, message=message))
        except kube.KubeError as e:
            ctx = {"lv": lv.name, "error": kube.describe(e)}
            log.warning("verification: cannot report", extra=ctx)

    async def _ended(self, lv: LogicalVolumeObject, phase: str, *, message: str = "",
                     digest: str = "", size: int = 0) -> None:  # fmt: skip
        cut_time = lv.verify.cut_time if lv.verify is not None else ""
        st = VerifyStatus(lv.verify_id, phase, message or f"digest of {human(size)}", digest,
                          size, cut_time, now())  # fmt: skip
        await self._write(lv.name, st)
        await self._others_cut_first(lv.name)
        with contextlib.suppress(LvmdCallError):  # else the sweep removes it
            await self._remove_cut(lv.uid, lv.device_class)

    async def _others_cut_first(self, name: str) -> None:
        """Wait :data:`REMOVE_AFTER`, then while another verification of this node has not
        made its cut (at most :data:`CUTS_FIRST`): a moved pod waits for those, not for this
        removal."""
        await asyncio.sleep(REMOVE_AFTER)
        async with self._cut_made:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._cut_made.wait_for(lambda: not self._uncut - {name}), CUTS_FIRST
                )

    async def _made(self, name: str) -> None:
        """``name``'s job made its cut, or ended."""
        self._uncut.discard(name)
        async with self._cut_made:
            self._cut_made.notify_all()

    async def _cut_exists(self, cut: str, dc: str) -> bool:
        """From lvmd's model, which has every cut lvmd made (asking lvremove about one that is
        not there cost 0.7 s of a move's start in the test bed's guests)."""
        return any(v.name == cut for v in await self.lvmd.get_lv_list(dc))

    async def _remove_cut(self, uid: str, dc: str) -> None:
        try:
            await self.lvmd.remove_lv(pb.RemoveLVRequest(name=verify_cut_name(uid),
                                                         device_class=dc))  # fmt: skip
        except LvmdCallError as e:
            if e.code is not Status.NOT_FOUND:
                raise
            return
        log.info("removed a verification cut", extra={"cut": verify_cut_name(uid)})

    # -- cuts a node that was down left -----------------------------------------------------

    async def sweep(self, device_classes: Collection[str]) -> None:
        """Remove the verification cuts of this node that no verification asks for any more
        (their LogicalVolume gone, or its digest reported). The cuts are listed first: one made
        after the list of LogicalVolumes belongs to a verification still asked for."""
        cuts: dict[str, list[str]] = {}
        for dc in device_classes:
            try:
                cuts[dc] = [v.name for v in await self.lvmd.get_lv_list(dc) if CUT_TAG in v.tags]
            except LvmdCallError as e:
                log.warning("verification cut sweep: cannot list",
                            extra={"device_class": dc, "error": str(e)})  # fmt: skip
        try:
            items, _ = await api.list_all(self.client, self.resource)
        except kube.KubeError as e:
            log.warning("verification cut sweep skipped", extra={"error": kube.describe(e)})
            return
        asked = set()
        running = set(self.running())  # a job keeps its cut a while after Done, or makes one
        for obj in items:
            with contextlib.suppress(InvalidQuantity, KeyError, TypeError, ValueError):
                lv = LogicalVolumeObject.from_dict(obj)
                if lv.node_name == self.node and (
                    lv.name in running or (lv.verify_pending and not lv.deleting)
                ):
                    asked.add(lv.uid)
        for dc, names in cuts.items():
            for name in names:
                uid = uid_of_verify_cut(name)
                if uid is not None and uid not in asked:
                    with contextlib.suppress(LvmdCallError):
                        await self._remove_cut(uid, dc)

    async def sweeps(self, device_classes: Callable[[], Collection[str]], every: float) -> None:
        """:meth:`sweep` now, and every ``every`` seconds."""
        while True:
            await self.sweep(device_classes())
            await asyncio.sleep(every)

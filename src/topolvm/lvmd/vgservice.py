"""lvmd's ``proto.VGService``: the logical volumes and free bytes of a device class, and the
Watch stream of capacity changes."""

from __future__ import annotations

from collections.abc import AsyncIterator

from topolvm.config.lvmd import LvmdConfig
from topolvm.lvm.report import Report
from topolvm.lvmd.capacity import capacity, find_pool
from topolvm.lvmd.service import resolve, rpc_of, to_pb, translate
from topolvm.lvmd.state import LvmState
from topolvm.proto import lvmd_pb2 as pb
from topolvm.rpc import status
from topolvm.rpc.transport import Context

# A Watch report follows a change once lvmd has been idle for WATCH_QUIET seconds, and at the
# latest WATCH_LIMIT seconds after it, even while changes keep coming.
WATCH_QUIET = 0.25
WATCH_LIMIT = 3.0

rpc = rpc_of("proto.VGService")


class VGService:
    """``proto.VGService`` over the node's :class:`~topolvm.lvmd.state.LvmState`."""

    def __init__(self, config: LvmdConfig, state: LvmState):
        self.config = config
        self.state = state

    @rpc
    async def GetLVList(
        self, request: pb.GetLVListRequest, context: Context
    ) -> pb.GetLVListResponse:
        dc = resolve(self.config, request.device_class)
        report = await self.state.fresh()
        pool = find_pool(report, dc)
        return pb.GetLVListResponse(volumes=[to_pb(lv, full=True) for lv in pool.lvs(report)])

    @rpc
    async def GetFreeBytes(
        self, request: pb.GetFreeBytesRequest, context: Context
    ) -> pb.GetFreeBytesResponse:
        dc = resolve(self.config, request.device_class)
        report = await self.state.fresh()
        return pb.GetFreeBytesResponse(free_bytes=find_pool(report, dc).free_minus_spare(report))

    def watch_message(self, report: Report) -> pb.WatchResponse:
        cap = capacity(report, self.config)
        msg = pb.WatchResponse(free_bytes=cap.free_bytes)
        for item in cap.items:
            entry = msg.items.add(
                device_class=item.device_class,
                free_bytes=item.free_bytes,
                size_bytes=item.size_bytes,
            )
            if item.thin_pool is not None:
                tp = item.thin_pool
                entry.thin_pool.data_percent = tp.data_percent
                entry.thin_pool.metadata_percent = tp.metadata_percent
                entry.thin_pool.overprovision_bytes = tp.overprovision_bytes
                entry.thin_pool.size_bytes = tp.size_bytes
        return msg

    @status.stream_rpc("proto.VGService", translate)
    async def Watch(self, request: pb.Empty, context: Context) -> AsyncIterator[pb.WatchResponse]:
        """Initial message, then one after every change (bursts coalesce) until shutdown;
        an LVM failure ends the stream with INTERNAL."""
        queue = self.state.subscribe()
        try:
            yield self.watch_message(await self.state.capacity_report())
            while not self.state.closing.is_set():
                await queue.get()
                if self.state.closing.is_set():
                    return
                await self.state.settled(WATCH_QUIET, WATCH_LIMIT)
                yield self.watch_message(await self.state.capacity_report())
        finally:
            self.state.unsubscribe(queue)

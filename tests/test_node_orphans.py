"""topolvm-node's LV accounting (node/orphans.py): which LVs no LogicalVolume accounts for
(pure, over lists), the cuts of copies that ended (removed by the node) and the orphans (never
removed: logged, counted, listed on the Node) against real LVM and lvmd in UML with the API
emulator; and the cut a sender makes for a job just as it ends, which goes at once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from grpclib.const import Status
from prometheus_client import CollectorRegistry

from tests.helpers import eventually
from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import kube  # noqa: F401
from tests.lvm_fixtures import THICK, THIN, VolumeGroups, lvm
from topolvm.constants import NORMAL
from topolvm.k8s import api, orphanlvs
from topolvm.k8s.orphanlvs import Kind, OrphanLv
from topolvm.k8s.runtime import Informer
from topolvm.node.exporter import NodeMetrics
from topolvm.node.finalcut import FinalCuts
from topolvm.node.lvmd_client import LvmdCallError, SocketLvmd
from topolvm.node.orphans import Accounting, LvAccounting, NodeLv, account
from topolvm.node.transfer import TransferService
from topolvm.node.volumes import CUT_TAG, Cuts, JobEnded, LvmdVolumes
from topolvm.proto import lvmd_pb2 as pb
from topolvm.proto import volumedata_pb2 as vd

GiB = 1 << 30
NODE = "n1"
A, B, C = ("0a1c2d3e-0000-4000-8000-00000000000a", "0b1c2d3e-0000-4000-8000-00000000000b",
           "0c1c2d3e-0000-4000-8000-00000000000c")  # fmt: skip


def _obj(name: str, uid: str, node: str = NODE, **spec: Any) -> dict[str, Any]:
    status = spec.pop("status", {"volumeID": uid})
    return {"metadata": {"name": name, "uid": uid},
            "spec": {"name": name, "nodeName": node, "size": "1Gi", **spec},
            "status": status}  # fmt: skip


def _lv(name: str, dc: str = "ssd", cut: bool = False) -> NodeLv:
    return NodeLv(name, "vg1", dc, GiB, (CUT_TAG,) if cut else ())


def test_volumes_running_cuts_and_foreign_lvs_are_accounted_for() -> None:
    objects = [
        _obj("src", A),
        _obj(
            "tgt",
            B,
            node="n2",
            copy={"source": "src", "keepCut": True},
            status={"volumeID": B, "copy": {"phase": "Done", "round": 1}},
        ),
        _obj("made", C, status={}),  # its node creates the LV: named by the UID
    ]
    lvs = [_lv(A), _lv(f"cut.{B}", cut=True), _lv(C), _lv("home")]
    assert account(lvs, objects, NODE).orphans == ()
    assert account(lvs, objects, NODE).ended_cuts == ()


def test_ended_cuts_are_the_nodes_and_the_rest_are_orphans() -> None:
    objects = [
        _obj("src", A),
        _obj(
            "tgt",
            B,
            node="n2",
            copy={"source": "src", "round": 2, "keepCut": True},
            status={"volumeID": B, "copy": {"phase": "Done", "round": 2}},
        ),
        _obj("elsewhere", C, node="n2"),
        _obj(
            "checked",
            "0d1c2d3e-0000-4000-8000-00000000000d",
            verify={"id": "v1"},
            status={"verify": {"id": "v1", "phase": "Done"}},
        ),
    ]
    lvs = [
        _lv(f"cut.{B}", cut=True), _lv(f"cut.{B}.r2", "thin", cut=True),  # the move is done
        _lv(f"cut.{A}"),  # a cut's name, not tagged by this node
        _lv(C),  # a volume of another node's LogicalVolume
        _lv("verify.0d1c2d3e-0000-4000-8000-00000000000d"),  # its digest is reported
    ]  # fmt: skip
    found = account(lvs, objects, NODE)
    assert [c.name for c in found.ended_cuts] == [f"cut.{B}", f"cut.{B}.r2"]
    assert found.orphans == (
        OrphanLv(C, "vg1", "ssd", GiB, Kind.VOLUME),
        OrphanLv(f"cut.{A}", "vg1", "ssd", GiB, Kind.CUT),
        OrphanLv("verify.0d1c2d3e-0000-4000-8000-00000000000d", "vg1", "ssd", GiB,
                 Kind.VERIFY_CUT),
    )  # fmt: skip


def test_what_an_unreadable_logical_volume_names_is_neither_removed_nor_reported() -> None:
    """A LogicalVolume this release cannot parse still names its LV and its copy's cuts: none
    is taken for an orphan, and its cut is not removed as an ended copy's."""
    objects = [_obj("odd", A, size="lots", copy={"source": "src"})]
    lvs = [_lv(A), _lv(f"cut.{A}", cut=True), _lv(f"cut.{A}.r2", cut=True)]
    assert account(lvs, objects, NODE) == Accounting()


class BrokenLvmd:
    """lvmd whose Watch stream ends at once (as if lvmd restarted), or fails."""

    def __init__(self) -> None:
        self.watched = 0

    async def watch(self) -> AsyncIterator[pb.WatchResponse]:
        self.watched += 1
        if self.watched % 2:
            raise OSError("connection refused")
        return
        yield pb.WatchResponse()  # an async generator that ends without a message


async def test_a_failing_scan_never_ends_the_accounting() -> None:
    """topolvm-node fails as a whole when one of its parts does: the accounting only reports,
    so whatever a scan meets (lvmd away, its stream ended) is logged and tried again."""
    lvmd = BrokenLvmd()
    informer = SimpleNamespace(synced=asyncio.Event(), values=lambda: [])
    informer.synced.set()
    acc = LvAccounting(None, NORMAL, NODE, lvmd, informer,  # type: ignore[arg-type]
                       NodeMetrics(CollectorRegistry(), NODE), Cuts(lvmd),  # type: ignore[arg-type]
                       interval=0.01)  # fmt: skip
    task = asyncio.create_task(acc.run())
    await eventually("a few scans", lambda: lvmd.watched >= 4, timeout=5, interval=0.01)
    assert not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class SlowLvmd:
    """lvmd whose CreateCut waits for ``release``; RemoveLV removes what was made."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.made: set[str] = set()
        self.calls: list[str] = []

    async def create_cut(self, request: vd.CreateCutRequest) -> vd.CreateCutResponse:
        self.calls.append(f"CreateCut {request.name}")
        await self.release.wait()
        self.made.add(request.name)
        return vd.CreateCutResponse(path=f"/dev/vg1/{request.name}")

    async def remove_lv(self, request: pb.RemoveLVRequest) -> pb.Empty:
        self.calls.append(f"RemoveLV {request.name}")
        if request.name not in self.made:
            raise LvmdCallError(Status.NOT_FOUND, "not found")
        self.made.remove(request.name)
        return pb.Empty()


async def test_a_cut_made_as_its_job_ends_goes_at_once_and_none_is_made_after() -> None:
    lvmd = SlowLvmd()
    cuts = Cuts(lvmd)  # type: ignore[arg-type]
    making = asyncio.create_task(cuts.ensure(A, "vol", "ssd", 8 << 20))
    await asyncio.sleep(0.01)  # the receiver asked; lvmd makes the cut
    assert cuts.end(A) == []  # the target is gone: nothing held yet to remove
    lvmd.release.set()
    with pytest.raises(JobEnded):
        await making
    assert lvmd.made == set() and cuts.held == {}
    with pytest.raises(JobEnded):
        await cuts.ensure(f"{A}.r2", "vol", "ssd", 8 << 20)
    assert lvmd.calls == [f"CreateCut cut.{A}", f"RemoveLV cut.{A}"]


async def test_the_cuts_a_node_holds_are_returned_when_their_job_ends() -> None:
    lvmd = SlowLvmd()
    lvmd.release.set()
    cuts = Cuts(lvmd)  # type: ignore[arg-type]
    await cuts.ensure(A, "vol", "ssd", 8 << 20)
    await cuts.ensure(f"{A}.r2", "vol", "ssd", 8 << 20)
    assert cuts.end(A) == [(A, "ssd"), (f"{A}.r2", "ssd")]


class CutLvmd(SlowLvmd):
    """An lvmd holding ``made`` cuts; the first ``busy`` removals fail as LVM's in-use error."""

    def __init__(self, made: set[str], busy: int = 0) -> None:
        super().__init__()
        self.release.set()
        self.made = set(made)
        self.busy = busy

    async def remove_lv(self, request: pb.RemoveLVRequest) -> pb.Empty:
        if self.busy and request.name in self.made:
            self.busy -= 1
            self.calls.append(f"RemoveLV {request.name} (in use)")
            raise LvmdCallError(Status.UNKNOWN, f"Logical volume vg1/{request.name} in use.")
        return await super().remove_lv(request)

    async def get_lv_list(self, device_class: str) -> list[pb.LogicalVolume]:
        self.calls.append(f"GetLVList {device_class}")
        # made by the node, with its tag (the sweep removes only tagged cuts)
        return [pb.LogicalVolume(name=n, tags=[CUT_TAG]) for n in sorted(self.made)]


def _watching(lvmd: CutLvmd) -> tuple[TransferService, Callable[[str, dict[str, Any]], None]]:
    service = TransferService.__new__(TransferService)
    service.cuts = Cuts(lvmd)  # type: ignore[arg-type]
    service._cleanups = set()
    service.server = SimpleNamespace(sending=0)  # type: ignore[assignment]
    service.final = FinalCuts(service.cuts, LvmdVolumes(lvmd), "n", asyncio.ensure_future)  # type: ignore[arg-type]
    handlers: list[Callable[[str, dict[str, Any]], None]] = []
    service.watch(SimpleNamespace(add_handler=handlers.append))  # type: ignore[arg-type]
    return service, handlers[0]


def _target(round_: int, done: int, deleting: bool = False) -> dict[str, Any]:
    obj = _obj(
        "move-x",
        B,
        node="n2",
        deviceClass="ssd",
        copy={"source": "src", "round": round_, "keepCut": True},
        status={"volumeID": B, "copy": {"phase": "Done", "round": done}} if done else {},
    )
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return obj


async def _settled(service: TransferService) -> None:
    while service._cleanups:
        await asyncio.gather(*list(service._cleanups))


async def test_a_moves_cuts_go_once_its_final_copy_is_done_also_while_still_open(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sending thread may hold the cut open for a moment after the copy's end: the removal
    is tried again, not dropped (it once waited for the 10-minute sweep)."""
    lvmd = CutLvmd(set(), busy=1)
    service, on_event = _watching(lvmd)
    await service.cuts.ensure(B, "vol", "ssd", 8 << 20)
    on_event("MODIFIED", _target(1, 1))  # the pre-copy is done: its cut is kept
    await _settled(service)
    await service.cuts.ensure(f"{B}.r2", "vol", "ssd", 8 << 20)
    on_event("MODIFIED", _target(2, 1))  # the final copy runs
    await _settled(service)
    assert lvmd.made == {f"cut.{B}", f"cut.{B}.r2"}
    on_event("MODIFIED", _target(2, 2))  # the final copy is done
    await _settled(service)
    assert lvmd.made == set()
    assert f"RemoveLV cut.{B} (in use)" in lvmd.calls
    assert "a copy's cut cannot be removed yet" in caplog.text


async def test_a_rolled_back_targets_cut_made_before_a_restart_goes_and_no_other() -> None:
    lvmd = CutLvmd({f"cut.{B}", f"cut.{C}"})  # C: another copy's, still running
    service, on_event = _watching(lvmd)  # this process made neither
    on_event("DELETED", _target(1, 0, deleting=True))
    await _settled(service)
    assert lvmd.made == {f"cut.{C}"}
    assert lvmd.calls[0] == "GetLVList ssd"  # learnt once, before the first removal
    on_event("DELETED", _obj("other", A, node="n2", deviceClass="ssd", copy={"source": "s"}))
    await _settled(service)
    assert [c for c in lvmd.calls if c.startswith("GetLVList")] == ["GetLVList ssd"]


async def test_the_sweep_keeps_the_cuts_of_a_final_copy_that_waits_and_of_what_it_cannot_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A move's final copy may wait minutes (its source still open): the sweep, every 10
    minutes, must keep both its cuts; those of an ended copy go; a LogicalVolume it cannot
    read keeps its cuts (what cannot be judged is not removed)."""
    waiting = _target(2, 0)
    waiting["status"] = {
        "volumeID": B,
        "copy": {"phase": "Pending", "round": 2, "message": "waiting: the source is open"},
    }
    ended = _obj(
        "move-y",
        C,
        node="n2",
        deviceClass="ssd",
        copy={"source": "src", "round": 2, "keepCut": True},
        status={"volumeID": C, "copy": {"phase": "Done", "round": 2}},
    )
    unreadable = _obj("move-z", A, node="n2", size="lots", copy={"source": "src"})
    lvmd = CutLvmd({f"cut.{B}", f"cut.{B}.r2", f"cut.{C}", f"cut.{C}.r2", f"cut.{A}"})
    service, _ = _watching(lvmd)
    service.client, service.resource = None, None  # type: ignore[assignment]

    async def listed(*_: Any, **__: Any) -> tuple[list[dict[str, Any]], str]:
        return [waiting, ended, unreadable], "1"

    monkeypatch.setattr("topolvm.node.transfer.api.list_all", listed)
    await service.sweep(["ssd"])
    assert lvmd.made == {f"cut.{B}", f"cut.{B}.r2", f"cut.{A}"}


# -- against real LVM --------------------------------------------------------------------


@pytest.fixture
async def accounting(
    vgs: VolumeGroups,
    lvmd_factory: Any,
    kube: KubeEmulator,  # noqa: F811
) -> AsyncIterator[tuple[LvAccounting, KubeEmulator]]:
    vgs.create("vg1", size_gib=6)
    vgs.thin_pool("vg1", "pool0", 2)
    server = await lvmd_factory([THICK, THIN])
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    client = api.make_client(server=kube.url)
    lvmd = SocketLvmd(server.server.config.socket_name)
    informer = Informer(client, api.logicalvolume_resource(NORMAL), resync=30)
    task = asyncio.create_task(informer.run())
    await informer.synced.wait()
    metrics = NodeMetrics(CollectorRegistry(), NODE)
    try:
        yield LvAccounting(client, NORMAL, NODE, lvmd, informer, metrics, Cuts(lvmd)), kube
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await lvmd.close()
        await client.close()


def _lv_names() -> set[str]:
    out = lvm("lvs", "vg1", "--reportformat", "json", "-o", "lv_name")
    return {r["lv_name"] for r in json.loads(out)["report"][0]["lv"]}


def _sample(acc: LvAccounting, name: str, dc: str) -> float:
    gauge = acc.metrics.orphan_count if name == "count" else acc.metrics.orphan_bytes
    return float(gauge.labels(NODE, dc)._value.get())


@pytest.mark.uml
async def test_orphans_are_listed_on_the_node_and_never_removed_ended_cuts_are(
    accounting: tuple[LvAccounting, KubeEmulator],
) -> None:
    acc, emu = accounting
    lvm("lvcreate", "-n", A, "-L", "64m", "-W", "y", "-y", "vg1")  # an old volume
    lvm("lvcreate", "-n", B, "-L", "32m", "-W", "y", "-y", "vg1")
    lvm("lvcreate", "-s", "-n", f"cut.{B}", "-L", "32m", "--addtag", CUT_TAG, "vg1/" + B)
    lvm("lvcreate", "-n", "home", "-L", "32m", "-W", "y", "-y", "vg1")  # an administrator's
    res = api.logicalvolume_resource(NORMAL)
    await acc.client.create(res.from_dict({
        "apiVersion": f"{NORMAL.group}/v1", "kind": "LogicalVolume", "metadata": {"name": "b"},
        "spec": {"name": "b", "nodeName": NODE, "size": "32Mi"}}))  # fmt: skip
    uid = str(emu.get("logicalvolumes", "b", group=NORMAL.group)["metadata"]["uid"])  # type: ignore[index]
    lvm("lvrename", "vg1", B, uid)  # volume b's LV; its cut's job (B) is gone

    first = await acc.scan()  # one look is not enough to judge
    assert first is not None and first.orphans == () and first.ended_cuts == ()

    async def judged() -> Accounting | None:  # once lvmd saw the LVs made behind its back
        found = await acc.scan()
        return found if found is not None and found.orphans else None

    second: Accounting = await eventually("the orphan found", judged, timeout=60, interval=0.5)
    assert second.orphans == (OrphanLv(A, "vg1", "ssd", 64 << 20, Kind.VOLUME),)
    assert [c.name for c in second.ended_cuts] == [f"cut.{B}"]
    assert _lv_names() == {"pool0", A, uid, "home"}  # the cut went, the orphan stays
    node = emu.get("nodes", NODE)
    assert node is not None
    listed = orphanlvs.decode(node["metadata"]["annotations"][orphanlvs.annotation(NORMAL)])
    assert listed.lvs == second.orphans and listed.count == 1 and listed.bytes == 64 << 20
    assert _sample(acc, "count", "ssd") == 1 and _sample(acc, "bytes", "ssd") == 64 << 20
    assert _sample(acc, "count", "thin") == 0
    await acc.scan()
    assert A in _lv_names()  # never removed

    lvm("lvremove", "-y", f"vg1/{A}")  # the administrator removes it

    async def cleared() -> bool:
        await acc.scan()
        node = emu.get("nodes", NODE) or {}
        return orphanlvs.annotation(NORMAL) not in (node["metadata"].get("annotations") or {})

    await eventually("the annotation removed", cleared, timeout=60, interval=0.5)
    assert _sample(acc, "count", "ssd") == 0


async def test_an_ended_jobs_cuts_wait_while_the_node_sends_or_cuts_a_final_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """lvmd runs one command at a time: the removal waits for the other claims' final copies
    this node serves (a removal held one up by 0.5 s), then goes."""
    from topolvm.node import transfer

    monkeypatch.setattr(transfer, "QUIET_POLL", 0.01)
    lvmd = CutLvmd(set())
    service, on_event = _watching(lvmd)
    await service.cuts.ensure(B, "vol", "ssd", 8 << 20)
    server = SimpleNamespace(sending=1)  # another claim's final copy streams
    service.server = server  # type: ignore[assignment]
    on_event("MODIFIED", _target(2, 2))  # this one's final copy is done
    await asyncio.sleep(0.1)
    assert lvmd.made == {f"cut.{B}"}
    server.sending = 0
    service.final.working = 1  # and another's final cut is being made
    await asyncio.sleep(0.1)
    assert lvmd.made == {f"cut.{B}"}
    service.final.working = 0
    await _settled(service)
    assert lvmd.made == set()

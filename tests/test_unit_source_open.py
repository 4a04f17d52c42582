"""A move's final cut waits until its source is closed (node/transfer.py, node/sourceopen.py):
a source still open (its pod force-deleted, its container still writing) refuses the final copy
for now, saying what holds it, and the copy waits; one that closes within a few seconds (the
kubelet unstaging it) is cut; an lvmd without OpenState does not stop moves. And what lvmd reads
to tell (lvmd/openers.py): mount points by device number, dmsetup's open count."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from grpclib.const import Status

from topolvm.k8s.lvobject import LogicalVolumeObject, VerifyPhase, VerifyStatus
from topolvm.lvmd.openers import holders_of, mounts_of, open_count_of
from topolvm.node.finalcut import FinalCuts
from topolvm.node.lvmd_client import LvmdCallError
from topolvm.node.sourceopen import holding, still_open
from topolvm.node.transfer import TransferService
from topolvm.node.volumes import LvmdVolumes, cut_name, round_two
from topolvm.proto import volumedata_pb2 as vd
from topolvm.rpc import status
from topolvm.transfer.errors import Refused

MOUNTED = vd.OpenStateResponse(active=True, open_count=2, mounts=["/var/lib/kubelet/a/mount"])
CLOSED = vd.OpenStateResponse(active=True)


class Lvmd:
    """lvmd's OpenState answers, in turn (the last one repeats), or an error code."""

    def __init__(self, *answers: vd.OpenStateResponse, code: Status | None = None) -> None:
        self.answers = list(answers)
        self.code = code
        self.asked = 0

    async def open_state(self, name: str, device_class: str) -> vd.OpenStateResponse:
        self.asked += 1
        if self.code is not None:
            raise LvmdCallError(self.code, "lvmd says no")
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


class Cuts:
    def __init__(self, lvmd: Lvmd, existing: tuple[str, ...] = ("uid-t",)) -> None:
        self.lvmd = lvmd
        self.existing = list(existing)
        self.removed: list[str] = []

    async def ensure(self, job: str, source: str, dc: str, min_cow: int = 0) -> str:
        self.existing.append(job)
        return cut_name(job)

    async def check(self, job: str, dc: str) -> None:
        return None

    async def listed(self, dc: str, strict: bool = False) -> list[str]:
        return list(self.existing)

    async def remove(self, job: str, dc: str) -> bool:
        self.removed.append(job)
        self.existing.remove(job)
        return True


def _service(cuts: Cuts) -> Any:
    service = TransferService.__new__(TransferService)
    service.cuts = cuts  # type: ignore[assignment]
    service.final = FinalCuts(cuts, LvmdVolumes(cuts.lvmd), "node-a", asyncio.ensure_future)  # type: ignore[arg-type]
    service.node = "node-a"
    return service


TARGET = LogicalVolumeObject("t", "uid-t", "1", "b", 1 << 30, volume_id="id-t", copy_source="src",
                             copy_round=2, copy_keep_cut=True)  # fmt: skip
SOURCE = LogicalVolumeObject("pvc-src", "uid-src", "1", "node-a", 1 << 30, volume_id="id-src")


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    from topolvm.node import sourceopen

    monkeypatch.setattr(sourceopen, "PATIENCE", 0.3)
    monkeypatch.setattr(sourceopen, "EVERY", 0.05)


async def test_a_source_still_open_makes_the_final_copy_wait_saying_why() -> None:
    cuts = Cuts(Lvmd(MOUNTED))
    with pytest.raises(Refused) as e:
        await _service(cuts)._cut(TARGET, SOURCE)
    assert e.value.reason == "unavailable" and e.value.transient  # the copy waits, retried
    assert e.value.message == (
        "the volume pvc-src is still open on node node-a (mounted at /var/lib/kubelet/a/mount; "
        "open count 2): the final cut waits until its workload stops"
    )
    assert round_two("uid-t") not in cuts.existing  # no second cut made
    assert cuts.lvmd.asked > 1  # asked again for a while before giving up for now


async def test_a_source_that_closes_soon_is_cut() -> None:
    cuts = Cuts(Lvmd(MOUNTED, CLOSED))
    volume, base = await _service(cuts)._cut(TARGET, SOURCE)
    assert (volume, base) == (cut_name(round_two("uid-t")), cut_name("uid-t"))


async def test_a_second_cut_made_before_a_restart_is_made_again_once_the_source_closed() -> None:
    """This process cannot tell what wrote the source since (node/finalcut.py)."""
    cuts = Cuts(Lvmd(MOUNTED, CLOSED), existing=("uid-t", round_two("uid-t")))
    assert (await _service(cuts)._cut(TARGET, SOURCE))[0] == cut_name(round_two("uid-t"))
    assert cuts.removed == [round_two("uid-t")] and cuts.lvmd.asked == 2


async def test_an_lvmd_without_open_state_does_not_stop_moves_other_errors_wait() -> None:
    old = Cuts(Lvmd(code=Status.UNIMPLEMENTED))
    assert (await _service(old)._cut(TARGET, SOURCE))[0] == cut_name(round_two("uid-t"))
    with pytest.raises(Refused) as e:
        await _service(Cuts(Lvmd(code=Status.UNAVAILABLE)))._cut(TARGET, SOURCE)
    assert e.value.reason == "unavailable" and "cannot tell whether id-src is open" in str(e.value)


async def test_what_holds_a_volume() -> None:
    stacked = vd.OpenStateResponse(active=True, open_count=1, holders=["vg1-crypt"])
    assert holding(stacked) == "under vg1-crypt; open count 1"
    assert holding(vd.OpenStateResponse(active=False, open_count=3)) == ""
    assert holding(CLOSED) == ""
    assert await still_open(Lvmd(CLOSED), "v", "ssd") == ""  # type: ignore[arg-type]


MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
301 22 253:4 / /var/lib/kubelet/plugins/kubernetes.io/csi/topolvm.io/abc/globalmount rw - xfs \
/dev/topolvm/x rw
302 22 253:4 / /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pvc-1/mount rw - xfs /dev/x rw
303 22 253:40 / /mnt/other rw - xfs /dev/y rw
304 22 253:4 /sub /mnt/with\\040space rw - xfs /dev/x rw
broken line
"""


def test_mounts_are_found_by_device_number() -> None:
    assert mounts_of(MOUNTINFO, 253, 4) == [
        "/var/lib/kubelet/plugins/kubernetes.io/csi/topolvm.io/abc/globalmount",
        "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pvc-1/mount",
        "/mnt/with space",
    ]
    assert mounts_of(MOUNTINFO, 253, 5) == []


def test_dmsetups_open_count_is_read_or_an_internal_error() -> None:
    assert open_count_of("  2\n") == 2
    with pytest.raises(status.StatusError) as e:
        open_count_of("Device does not exist.")
    assert e.value.code is Status.INTERNAL


def test_holders_are_named_by_their_device_mapper_names(tmp_path: Path) -> None:
    holders = tmp_path / "253:4" / "holders"
    (holders / "dm-7" / "dm").mkdir(parents=True)
    (holders / "dm-7" / "dm" / "name").write_text("vg1-crypt\n")
    (holders / "loop3").mkdir()
    assert holders_of(253, 4, tmp_path) == ["vg1-crypt", "loop3"]
    assert holders_of(253, 9, tmp_path) == []


def test_a_verification_is_pending_until_its_node_reports_for_its_id() -> None:
    lv = LogicalVolumeObject("v", "uid-v", "1", "a", 1 << 30, verify_id="m1")
    assert lv.verify_pending
    lv.verify = VerifyStatus("m1", VerifyPhase.CUT)
    assert lv.verify_pending
    lv.verify = VerifyStatus("m1", VerifyPhase.DONE, digest="ab", size_bytes=1 << 30)
    assert not lv.verify_pending
    lv.verify_id = "m2"  # asked again
    assert lv.verify_pending
    raw = {"metadata": {"name": "v"}, "spec": {"nodeName": "a", "size": "1Gi",
                                               "verify": {"id": "m2", "sizeBytes": 4096}},
           "status": {"verify": {"id": "m2", "phase": "Failed", "message": "overflowed",
                                 "sizeBytes": "junk"}}}  # fmt: skip
    parsed = LogicalVolumeObject.from_dict(raw)
    assert (parsed.verify_id, parsed.verify_size) == ("m2", 4096)
    assert parsed.verify == VerifyStatus("m2", VerifyPhase.FAILED, "overflowed")
    assert not parsed.verify_pending
    assert VerifyStatus("m2", VerifyPhase.CUT, cut_time="t").to_patch() == {
        "id": "m2", "phase": "Cut", "message": None, "digest": None, "sizeBytes": None,
        "cutTime": "t", "completionTime": None,
    }  # fmt: skip

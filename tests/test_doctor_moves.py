"""``topolvm doctor``'s volume-move check: a claim mid-move (its step and progress), a move stuck
at a step with the evidence of why (the target's copy, topolvm-node, the pod and its scheduling
gate, topolvm-controller), a recent roll-back, scopes, and clusters without the VolumeMove CRD."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest
from lightkube.generic_resource import GenericGlobalResource

from tests import doctor_scenarios as s
from topolvm.doctor import collect as collect_mod
from topolvm.doctor.model import Finding, Severity
from topolvm.doctor.run import diagnose
from topolvm.doctor.scope import Scope, ScopeError
from topolvm.doctor.snapshot import Obj, Snapshot
from topolvm.k8s import api
from topolvm.k8s import errors as kube
from topolvm.k8s.lvobject import CopyStatus
from topolvm.node.copyreport import connecting

GiB = 1 << 30
ID = "volume-move"


def ago(minutes: float) -> str:
    t = s.NOW - datetime.timedelta(minutes=minutes)
    return t.isoformat().replace("+00:00", "Z")


def target(claim: str, phase: str, message: str = "", rate: int = 80 << 20,
           kind: str = "logicalvolumes") -> tuple[str, Obj]:  # fmt: skip
    """The LogicalVolume a move fills on w2, with its ``status.copy``."""
    _, lv = s.lv(f"pvc-{claim}-new", "w2", kind=kind)
    lv["spec"]["copy"] = {"source": f"pvc-{claim}-old"}
    lv["status"] = {"volumeID": "x", "copy": {
        "phase": phase, "message": message, "sourceNode": "w1", "doneBytes": 3 * GiB,
        "totalBytes": 10 * GiB, "bytesPerSecond": rate, "attempts": 1}}  # fmt: skip
    return kind, lv


def moved_pod(claim: str, phase: str, gate: str = "", node: str | None = None,
              message: str = "") -> tuple[str, Obj]:  # fmt: skip
    kind, pod = s.pod(f"{claim}-pod", claims=(claim,), phase=phase, node_name=node,
                      message=message)  # fmt: skip
    if gate:
        pod["spec"]["schedulingGates"] = [{"name": gate}]
    return kind, pod


def findings(*objs: tuple[str, Obj]) -> list[Finding]:
    snap = s.snapshot(*s.node("w1"), *s.node("w2"), *objs)
    return [f for f in diagnose(snap, Scope()).findings if f.check == ID]


def one(*objs: tuple[str, Obj]) -> Finding:
    [f] = findings(*objs)
    return f


def test_a_claim_mid_move_shows_its_step_and_progress() -> None:
    f = one(
        s.volume_move("data", "PreCopy", "copying pvc-data-old from node w1", startTime=ago(2),
                      doneBytes=3 * GiB, totalBytes=10 * GiB),
        target("data", "Copying", "copying pvc-data-old on node w1"),
    )  # fmt: skip
    assert f.severity is Severity.WARNING
    assert f.title == (
        "claim app/data is being moved from node w1 to node w2: step PreCopy (the data is "
        "copied to the target while the pod runs), 30% (3.0 GiB of 10.0 GiB), 80.0 MiB/s"
    )
    assert f.cause == "copying pvc-data-old from node w1"
    assert f.fixes[0].summary.startswith("Nothing to fix")
    assert f.fixes[0].commands == ("kubectl get volumemoves.topolvm.io -n app data -o yaml",)
    assert {str(r) for r in f.subjects} == {"VolumeMove app/data", "PersistentVolumeClaim app/data"}


def test_a_long_copy_that_progresses_is_not_stuck() -> None:
    f = one(s.volume_move("data", "PreCopy", startTime=ago(90)), target("data", "Copying"))
    assert f.severity is Severity.WARNING and "is being moved" in f.title


def test_the_downtime_steps_show_the_gated_pod_and_how_long_it_is_down() -> None:
    f = one(
        s.volume_move("data", "Stopping", "waiting for pod app/data-pod to stop",
                      stopTime=ago(1)),
        moved_pod("data", "Pending", gate="topolvm.io/move"),
    )  # fmt: skip
    assert f.severity is Severity.WARNING
    assert f.title.endswith("step Stopping (the pod is stopped; its re-created pod is held by a "
                            "scheduling gate), the pod down for 1m0s")  # fmt: skip
    assert "pod app/data-pod: Pending, held by the scheduling gate topolvm.io/move" in f.evidence


def test_stuck_waiting_for_the_source_node() -> None:
    f = one(
        s.volume_move("data", "PreCopy", "pre-copy: waiting for the copy", startTime=ago(60)),
        target("data", "Pending", "waiting: node w1's transfer port 10.0.0.1:9850: [Errno 111] "
               "Connection refused; next try in 60s", rate=0),
    )  # fmt: skip
    assert f.severity is Severity.ERROR
    assert f.title == "move of claim app/data is stuck at step PreCopy for 60 min (from node w1 " \
        "to node w2)"  # fmt: skip
    assert f.cause.startswith("the copy onto node w2 waits for node w1: waiting: node w1's")
    assert f.cause.endswith("; the move says: pre-copy: waiting for the copy")
    assert any("status.copy.phase=Pending, 30% (3.0 GiB of 10.0 GiB)" in e for e in f.evidence)
    assert f.fixes[0].summary.startswith("The move resumes when topolvm-node on w1")
    assert "delete it only after it rolled back" in f.fixes[-1].summary


def test_stuck_because_the_copy_failed() -> None:
    f = one(
        s.volume_move("data", "FinalCopy", stopTime=ago(20)),
        target("data", "Failed", "copy failed: the digest differs", rate=0),
    )
    assert f.title.startswith("move of claim app/data is stuck at step FinalCopy for 20 min")
    assert f.cause == "the copy onto node w2 failed: copy failed: the digest differs"
    assert "Delete the VolumeMove only after it rolled back" in f.fixes[0].summary


def test_stuck_queued_behind_other_copies() -> None:
    f = one(
        s.volume_move("data", "FinalCopy", stopTime=ago(10)),
        target("data", "Pending", "queued: node w2 runs 2 copies already", rate=0),
    )
    assert f.severity is Severity.ERROR
    assert f.cause == "the copy is queued on node w2: queued: node w2 runs 2 copies already"


def test_stuck_because_topolvm_node_does_not_run_on_the_target() -> None:
    f = one(
        s.volume_move("data", "PreCopy", startTime=ago(30)),
        target("data", "Copying", rate=0),
        s.pod("node-w1", ns="topolvm-system", node_name="w1", phase="Running",
              container="topolvm-node"),
        s.pod("node-w2", ns="topolvm-system", node_name="w2", phase="Pending",
              container="topolvm-node"),
    )  # fmt: skip
    assert f.cause == "topolvm-node does not run on node w2"
    assert f.fixes[0].summary == "The move resumes when topolvm-node on w2 runs again."
    assert f.fixes[0].commands == ("kubectl logs -n topolvm-system node-w2 -c topolvm-node",)
    assert "topolvm-node pod on w2: not running" in f.evidence


def test_stuck_stopping_while_the_pod_still_runs() -> None:
    f = one(s.volume_move("data", "Stopping", stopTime=ago(15)),
            moved_pod("data", "Running", node="w1"))  # fmt: skip
    assert f.cause == "pod app/data-pod has not stopped yet (still Running on node w1)"


def test_stuck_starting_with_the_gate_still_on_the_pod() -> None:
    f = one(s.volume_move("data", "Starting", stopTime=ago(20), swapTime=ago(12)),
            moved_pod("data", "Pending", gate="topolvm.io/move"))  # fmt: skip
    assert f.title.startswith("move of claim app/data is stuck at step Starting for 12 min")
    assert f.cause == (
        "pod app/data-pod still carries the scheduling gate topolvm.io/move, which the "
        "Starting step removes"
    )
    assert "can only go forward" in f.fixes[-1].summary


def test_stuck_starting_names_the_scheduling_problem() -> None:
    f = one(
        s.volume_move("data", "Starting", "waiting for pod app/data-pod to run on w2",
                      stopTime=ago(20), swapTime=ago(10)),
        moved_pod("data", "Pending", message="0/3 nodes are available: 1 Insufficient cpu."),
    )  # fmt: skip
    assert f.cause == (
        "pod app/data-pod cannot be scheduled: 0/3 nodes are available: 1 Insufficient cpu. "
        "(its gate is gone; its data is on node w2 now); the move says: waiting for pod "
        "app/data-pod to run on w2"
    )
    assert f.fixes[0].summary.startswith("A scheduling problem: the pod must fit on node w2")


def test_stuck_because_topolvm_controller_does_not_run() -> None:
    f = one(
        s.volume_move("data", "Swapping", stopTime=ago(8)),
        s.pod("topolvm-controller-0", ns="topolvm-system", phase="Pending",
              container="topolvm-controller"),
    )  # fmt: skip
    assert f.title.startswith("move of claim app/data is stuck at step Swapping for 8 min")
    assert f.cause == "no topolvm-controller pod runs"
    assert f.fixes[0].summary.startswith("topolvm-controller must run: it drives moves")
    assert "topolvm-controller pods: topolvm-system/topolvm-controller-0 Pending" in f.evidence


def test_stuck_without_evidence_points_at_the_controller_log() -> None:
    f = one(s.volume_move("data", "RollingBack", "deleting pvc-data-new"))
    assert f.severity is Severity.ERROR  # its last write is the creation, an hour ago
    assert f.cause == "the move says: deleting pvc-data-new"
    assert f.fixes[0].summary == "topolvm-controller's log says what the move waits for."


def test_without_timestamps_the_target_copy_decides() -> None:
    def untimed(phase: str, rate: int) -> list[Finding]:
        kind, move = s.volume_move("data", "PreCopy")
        del move["metadata"]["creationTimestamp"]
        return findings((kind, move), target("data", phase, "copy failed: gone", rate=rate))

    [failed] = untimed("Failed", 0)
    assert failed.severity is Severity.ERROR
    assert failed.title == "move of claim app/data is stuck at step PreCopy (from node w1 to " \
        "node w2)"  # fmt: skip
    [running] = untimed("Copying", 80 << 20)
    assert running.severity is Severity.WARNING


def test_a_recent_roll_back_explains_a_pod_restart_and_old_ones_are_quiet() -> None:
    f = one(
        s.volume_move("data", "RolledBack", "the copy failed: the digest differs",
                      reason="CopyFailed", completionTime=ago(3)),
        s.volume_move("old", "RolledBack", reason="CopyFailed", completionTime=ago(60)),
        s.volume_move("done", "Succeeded", completionTime=ago(1)),
        s.volume_move("no", "Refused", reason="SharedAccess"),
    )  # fmt: skip
    assert f.severity is Severity.WARNING
    assert f.title == "move of claim app/data from node w1 to node w2 rolled back 3 min ago: " \
        "CopyFailed"  # fmt: skip
    assert "its pod was restarted there" in f.cause
    assert "the digest differs" in f.cause


def test_legacy_moves_use_the_legacy_gate_and_logical_volumes() -> None:
    f = one(
        s.volume_move("data", "FinalCopy", stopTime=ago(1), kind="legacy-volumemoves"),
        target("data", "Copying", kind="legacy-logicalvolumes"),
        moved_pod("data", "Pending", gate="topolvm.cybozu.com/move"),
    )  # fmt: skip
    assert "held by the scheduling gate topolvm.cybozu.com/move" in " ".join(f.evidence)
    assert "kubectl get volumemoves.topolvm.cybozu.com" in f.fixes[0].commands[0]
    assert any("status.copy.phase=Copying" in e for e in f.evidence)


def scoped() -> Snapshot:
    return s.snapshot(
        *s.node("w1"), *s.node("w2"),
        s.pvc("a", phase="Bound"), s.pvc("b", phase="Bound"), s.pvc("c", ns="shop", phase="Bound"),
        s.pod("web", claims=("a",), node_name="w1", phase="Running"),
        s.volume_move("a", "PreCopy", startTime=ago(1)),
        s.volume_move("b", "PreCopy", startTime=ago(1)),
        s.volume_move("c", "PreCopy", ns="shop", startTime=ago(1)),
        s.volume_move("gone", "Swapping", stopTime=ago(1)),  # its claim is being re-created
    )  # fmt: skip


def moved_claims(snap: Snapshot, scope: Scope) -> set[str]:
    return {f.title.split()[1] for f in diagnose(snap, scope).findings if f.check == ID}


def test_scopes_keep_the_moves_of_their_claims() -> None:
    snap = scoped()
    assert moved_claims(snap, Scope()) == {"app/a", "app/b", "shop/c", "app/gone"}
    assert moved_claims(snap, Scope("shop")) == {"shop/c"}
    assert moved_claims(snap, Scope("app")) == {"app/a", "app/b", "app/gone"}
    assert moved_claims(snap, Scope("app", pvc="b")) == {"app/b"}
    assert moved_claims(snap, Scope("app", pod="web")) == {"app/a"}
    assert moved_claims(snap, Scope("app", pvc="gone")) == {"app/gone"}
    with pytest.raises(ScopeError, match="PVC app/nope not found"):
        diagnose(snap, Scope("app", pvc="nope"))
    only_moves = s.snapshot(s.volume_move("c", "PreCopy", ns="shop", startTime=ago(1)))
    assert moved_claims(only_moves, Scope("shop")) == {"shop/c"}


def test_unreadable_moves_leave_the_check_undecided() -> None:
    snap = s.snapshot(s.volume_move("data", "PreCopy", startTime=ago(1)))
    snap.unreadable["volumemoves"] = "403 Forbidden: volumemoves.topolvm.io is forbidden"
    [f] = [f for f in diagnose(snap, Scope()).findings if f.check == ID]
    assert f.severity is Severity.UNDECIDED and "cannot read volumemoves: 403" in f.cause


class _Proxy:
    async def __aenter__(self) -> _Proxy:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None


def test_collect_reads_a_missing_volumemove_crd_as_no_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listed: list[str] = []

    async def fake_list(_client: Any, res: Any, **_kw: Any) -> list[Obj]:
        plural = res._api_info.plural
        listed.append(f"{plural}.{res._api_info.resource.group}")
        if plural == "volumemoves":
            raise kube.NotFound(404, "NotFound", "the server could not find the requested resource")
        return []

    monkeypatch.setattr(collect_mod, "_list", fake_list)
    monkeypatch.setattr(api, "proxy_client", lambda _client: _Proxy())
    snap = asyncio.run(collect_mod.collect(object()))  # type: ignore[arg-type]
    assert {"volumemoves.topolvm.io", "volumemoves.topolvm.cybozu.com"} <= set(listed)
    assert snap["volumemoves"] == [] and snap["legacy-volumemoves"] == []
    assert "volumemoves" not in snap.unreadable and "legacy-volumemoves" not in snap.unreadable
    assert [f for f in diagnose(snap, Scope()).findings if f.check == ID] == []


def test_a_registered_typed_model_of_a_core_kind_does_not_stop_collect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another command's import of lightkube.resources registers typed core models; the
    generic classes doctor lists with cannot be registered then, and are made unregistered."""

    def taken(*_: object) -> Any:
        raise ValueError("Another class for resource 'Node' is already registered")

    monkeypatch.setattr(collect_mod, "create_global_resource", taken)
    res = collect_mod._resource("nodes")
    assert issubclass(res, GenericGlobalResource)
    assert res._api_info.plural == "nodes"


def test_stuck_in_the_final_copy_because_the_source_is_still_open() -> None:
    """A pod force-deleted on a node cut off may still write: the final cut waits, and doctor
    names the node where the volume is still open."""
    f = one(
        s.volume_move("data", "FinalCopy", stopTime=ago(12)),
        target("data", "Pending", "waiting: refused (unavailable): the volume pvc-data-old is "
               "still open on node w1 (mounted at /var/lib/kubelet/pods/u/volumes/kubernetes.io~"
               "csi/pv-1/mount; open count 2): the final cut waits until its workload stops; next "
               "try in 60s", rate=0),
        moved_pod("data", "Pending", gate="topolvm.io/move"),
    )  # fmt: skip
    assert f.severity is Severity.ERROR
    assert f.title.startswith("move of claim app/data is stuck at step FinalCopy for 12 min")
    assert f.cause == (
        "the volume is still open on node w1: pvc-data-old (mounted at /var/lib/kubelet/pods/u/"
        "volumes/kubernetes.io~csi/pv-1/mount; open count 2); the final copy waits until "
        "nothing uses it"
    )
    assert f.fixes[0].summary.startswith("A pod whose object was deleted may still run on node w1")
    assert "Start node w1's kubelet again" in f.fixes[0].summary
    assert f.fixes[0].commands[0] == "kubectl get node w1"


def test_a_source_still_open_is_named_at_once_not_only_when_stuck() -> None:
    f = one(
        s.volume_move("data", "FinalCopy", "pod app/data-pod stopped; copying what changed",
                      stopTime=ago(1)),
        target("data", "Pending", "waiting: refused (unavailable): the volume pvc-data-old is "
               "still open on node w1 (open count 1): the final cut waits until its workload "
               "stops; next try in 8s", rate=0),
    )  # fmt: skip
    assert f.severity is Severity.WARNING and "is being moved" in f.title
    assert f.cause.startswith("the volume is still open on node w1: pvc-data-old (open count 1)")
    assert f.fixes[0].summary.startswith("A pod whose object was deleted may still run on node w1")


def test_a_source_still_open_is_named_while_the_copy_tries_again() -> None:
    """Between two attempts the target's copy is Copying again, its message keeping what it
    waits for (node.copyreport.connecting): doctor still names the node holding the volume."""
    waited = (
        "waiting: refused (unavailable): the volume pvc-data-old is still open on node "
        "w1 (open count 1): the final cut waits until its workload stops; next try in 8s"
    )
    again = connecting(CopyStatus(message=waited), "w1")
    f = one(
        s.volume_move("data", "FinalCopy", "pod app/data-pod stopped; copying what changed",
                      stopTime=ago(1)),
        target("data", "Copying", again, rate=0),
    )  # fmt: skip
    assert again.endswith("its workload stops; trying again now"), again
    assert f.cause.startswith("the volume is still open on node w1: pvc-data-old (open count 1)")


def test_a_first_attempt_says_it_connects() -> None:
    assert connecting(CopyStatus(), "w1") == "connecting to node w1"
    assert connecting(CopyStatus(message="copying pvc-x from w1"), "w1") == "connecting to node w1"


# -- verification (docs/mobility.md, "Verified before the source goes") --------------------


def verifying(name: str, node: str, **verify: Any) -> tuple[str, Obj]:
    """A LogicalVolume on ``node`` whose ``status.verify`` answers move ``move-data``."""
    _, lv = s.lv(name, node)
    lv["status"] = {"volumeID": "x", "verify": {"id": "move-data", **verify}}
    return "logicalvolumes", lv


def unverified(reason: str, message: str) -> tuple[str, Obj]:
    return s.volume_move(
        "data", "Unverified", f"moved to node w2 (the pod runs there) but not verified: "
        f"{message}; the old volume PV pv-old (...) is kept: see topolvm doctor",
        reason=reason, oldVolumeName="pv-old", newVolumeName="move-data", oldVolume="Kept",
        sourceDigest="ab12", targetDigest="ff00" if reason == "DigestMismatch" else "",
        completionTime=ago(30),
        conditions=[{"type": "Verified", "status": "False", "reason": reason,
                     "message": message}],
    )  # fmt: skip


def test_a_move_that_did_not_verify_names_the_kept_volume_and_the_ways_out() -> None:
    f = one(
        unverified("DigestMismatch", "differs"),
        verifying("pvc-data-old", "w1", phase="Done", digest="ab12", sizeBytes=GiB),
        verifying("pvc-data-new", "w2", phase="Done", digest="ff00", sizeBytes=GiB),
        ("pvs", {"metadata": {"name": "pv-old"}, "spec": {}}),
    )  # fmt: skip
    assert f.severity is Severity.ERROR
    assert f.title == ("move of claim app/data from node w1 to node w2 is not verified "
                       "(DigestMismatch): the old volume pv-old is kept")  # fmt: skip
    assert f.cause.startswith("the digest of the moved volume as of the swap differs from the "
                              "old volume's (source ab12, target ff00)")  # fmt: skip
    assert (f"source LogicalVolume pvc-data-old on node w1: status.verify phase=Done, "
            f"digest=ab12, sizeBytes={GiB}") in f.evidence  # fmt: skip
    assert "old PersistentVolume pv-old: present (Retain)" in f.evidence
    back, keep = f.fixes  # a mismatch: the old data first
    assert back.summary.startswith("To go back to the old data (node w1, as of the swap")
    assert back.commands[0] == "kubectl scale -n app statefulset/vault --replicas=0"
    assert "kubectl patch pv pv-old --type json -p " \
        "'[{\"op\":\"remove\",\"path\":\"/spec/claimRef\"}]'" in back.commands  # fmt: skip
    assert keep.commands[:2] == (
        "kubectl delete pv pv-old",
        "kubectl delete logicalvolumes.topolvm.io pvc-data-old",
    )


def test_a_verification_that_failed_suggests_keeping_the_moved_data_first() -> None:
    f = one(unverified("VerifyFailed", "the source volume could not be digested: overflowed"))
    assert "(VerifyFailed)" in f.title
    assert f.cause == ("the copy could not be verified: the source volume could not be "
                       "digested: overflowed")  # fmt: skip
    assert f.fixes[0].summary.startswith("If the application's data on node w2 is right")


def test_a_move_verifying_with_its_pod_running_is_not_stuck() -> None:
    f = one(
        s.volume_move("data", "Verifying", "pod data-pod runs on node w2; verifying the copy"),
        verifying("pvc-data-old", "w1", phase="Cut"),
        verifying("pvc-data-new", "w2", phase="Done", digest="ab12", sizeBytes=GiB),
    )  # fmt: skip
    assert f.severity is Severity.WARNING
    assert "step Verifying (the pod runs on the target; both volumes' digests" in f.title
    assert "source LogicalVolume pvc-data-old on node w1: status.verify phase=Cut" in f.evidence


def test_a_verification_waiting_for_a_node_that_does_not_run_is_stuck() -> None:
    f = one(
        s.volume_move("data", "Verifying", "pod data-pod runs on node w2; verifying the copy"),
        verifying("pvc-data-old", "w1", phase="Cut"),
        verifying("pvc-data-new", "w2", phase="Done", digest="ab12", sizeBytes=GiB),
        s.pod("node-w1", ns="topolvm-system", node_name="w1", phase="Pending",
              container="topolvm-node"),
        s.pod("node-w2", ns="topolvm-system", node_name="w2", phase="Running",
              container="topolvm-node"),
    )  # fmt: skip
    assert f.severity is Severity.ERROR and "stuck at step Verifying" in f.title
    assert f.cause.startswith("the move waits for node w1 to digest its volume for the "
                              "verification and topolvm-node does not run there")  # fmt: skip
    assert f.fixes[0].commands == ("kubectl logs -n topolvm-system node-w1 -c topolvm-node",)


def test_a_move_starting_names_the_node_that_has_not_cut_its_target() -> None:
    f = one(s.volume_move("data", "Starting", "waiting for node w2 to cut the target volume",
                          stopTime=ago(20), swapTime=ago(10)),
            verifying("pvc-data-new", "w2", phase="Pending", message="waiting: lvmd"))  # fmt: skip
    assert f.severity is Severity.ERROR
    assert f.cause.startswith("the move waits for node w2 to cut the target volume for the "
                              "verification")  # fmt: skip

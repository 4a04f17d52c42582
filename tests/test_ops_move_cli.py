"""``topolvm move`` (src/topolvm/ops): argument parsing, the pre-flight over the cluster's
JSON, what it prints, and the command end to end against the Kubernetes API emulator (the
controller's part is played by the test, writing the VolumeMove's status)."""

from __future__ import annotations

import argparse
import asyncio
import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.kube_emulator import CRD_DIR, DEFAULT_CRDS, KubeEmulator
from tests.kube_fixtures import pulled_at_once, write_kubeconfig
from topolvm import cli
from topolvm.constants import NORMAL
from topolvm.k8s.moveobject import MoveStatus, VolumeMoveObject
from topolvm.move.reads import free_bytes, schedulable_nodes
from topolvm.move.rules import Refused
from topolvm.ops import move_cli
from topolvm.ops.cluster import Common
from topolvm.ops.follow import BarDisplay, LineDisplay
from topolvm.ops.preflight import Facts, copy_rates, find_lv, past_downtimes, preflight, volume_size
from topolvm.ops.render import dry_run_text, outcome, progress_line, refusal_line

Obj = dict[str, Any]
GIB = 1 << 30
NS = "shop"


# -- a small cluster, as the API's JSON (also used by tests/test_ops_drain.py) -------------


def node(name: str, free: int | None, ready: bool = True, cordoned: bool = False) -> Obj:
    meta: Obj = {"name": name}
    if free is not None:
        meta["annotations"] = {"capacity.topolvm.io/00default": str(free)}
    return {
        "apiVersion": "v1", "kind": "Node", "metadata": meta,
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }  # fmt: skip


def claim(name: str, volume: str = "", phase: str = "Bound") -> Obj:
    return {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "topolvm",
                 "volumeName": volume},
        "status": {"phase": phase},
    }  # fmt: skip


def volume(name: str, claim_name: str, on: str, handle: str) -> Obj:
    return {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {
            "csi": {"driver": "topolvm.io", "volumeHandle": handle},
            "claimRef": {"namespace": NS, "name": claim_name, "uid": f"uid-{claim_name}"},
            "capacity": {"storage": "1Gi"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.topolvm.io/node", "operator": "In", "values": [on]}]}]}},
        },
        "status": {"phase": "Bound"},
    }  # fmt: skip


def logical_volume(name: str, handle: str, size: str, rate: int = 0) -> Obj:
    status: Obj = {"volumeID": handle}
    if rate:
        status["copy"] = {"phase": "Done", "bytesPerSecond": rate}
    return {
        "apiVersion": "topolvm.io/v1", "kind": "LogicalVolume", "metadata": {"name": name},
        "spec": {"name": name, "nodeName": "n1", "size": size}, "status": status,
    }  # fmt: skip


def pod(name: str, claims: list[str], owner: tuple[str, str] | None, labels: Obj) -> Obj:
    meta: Obj = {"name": name, "namespace": NS, "labels": labels}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1],
                                    "uid": f"uid-{owner[1]}", "controller": True}]  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}],
                 "volumes": [{"name": c, "persistentVolumeClaim": {"claimName": c}}
                             for c in claims]},
        "status": {"phase": "Running"},
    }  # fmt: skip


def seed(emu: KubeEmulator) -> None:
    """n1 holds claim data-web-0 (10 GiB, pod web-0 of StatefulSet web); n2 has 50 GiB free,
    n3 90 GiB but is cordoned, n4 30 GiB. One earlier copy ran at 200 MiB/s."""
    for obj in (
        node("n1", 5 * GIB), node("n2", 50 * GIB), node("n3", 90 * GIB, cordoned=True),
        node("n4", 30 * GIB), node("plain", None),
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
         "metadata": {"name": "topolvm"}, "provisioner": "topolvm.io"},
        claim("data-web-0", "pv-1"), volume("pv-1", "data-web-0", "n1", "vol-1"),
        logical_volume("pv-1", "vol-1", "10Gi"),
        logical_volume("old", "vol-0", "1Gi", rate=200 << 20),
        pod("web-0", ["data-web-0"], ("StatefulSet", "web"), {"app": "web"}),
    ):  # fmt: skip
        emu.create(obj)


@pytest.fixture
async def emu() -> AsyncIterator[KubeEmulator]:
    """The emulator serving the kinds a move reads, and the VolumeMove CRD."""
    crds = [CRD_DIR / n for n in (*DEFAULT_CRDS, "volumemoves.topolvm.io.yaml")]
    e = KubeEmulator(crds=crds)
    e.register("", "v1", "persistentvolumes", "PersistentVolume", False, True)
    e.register("apps", "v1", "replicasets", "ReplicaSet", True, True)
    e.register("apps", "v1", "deployments", "Deployment", True, True)
    e.register("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, True)
    e.on_create.append(pulled_at_once)  # the target's kubelet has the images a move pre-pulls
    await e.start()
    try:
        yield e
    finally:
        await e.stop()


@pytest.fixture
def kubeconfig(emu: KubeEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("USE_LEGACY", raising=False)
    return str(write_kubeconfig(tmp_path / "kubeconfig", emu.url))


async def run_cli(*argv: str) -> int:
    """The command as ``topolvm ARGV`` runs it (in a thread: it runs its own event loop)."""
    args = cli.build_parser().parse_args(list(argv))
    code: int = await asyncio.to_thread(args.run, args)
    return code


# -- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given", ["pvc/data-0", "data-0", "PVC/data-0", "persistentvolumeclaim/data-0"]
)
def test_the_claim_is_named_with_or_without_its_kind(given: str) -> None:
    args = cli.build_parser().parse_args(["move", "-n", "x", given, "--to", "n2", "--dry-run"])
    assert (args.claim, args.namespace, args.to, args.dry_run) == ("data-0", "x", "n2", True)
    assert args.timeout is None and not args.no_wait and args.run is move_cli.run


def test_timeout_takes_a_duration() -> None:
    args = cli.build_parser().parse_args(["move", "pvc/a", "--timeout", "1m30s", "--no-wait"])
    assert args.timeout == 90.0 and args.no_wait and args.namespace == ""


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["pod/web-0"], "only PersistentVolumeClaims move"),
        (["pvc/Data_1"], "not a claim name: 'Data_1'"),
        (["pvc/"], "not a claim name: ''"),
        (["a", "--to", "N 2"], "not a node name"),
        (["a", "--timeout", "soon"], "not a duration"),
        ([], "the following arguments are required: pvc/NAME"),
    ],
)
def test_bad_arguments_are_clear_errors(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args(["move", *argv])
    assert info.value.code == 2
    assert words in capsys.readouterr().err


# -- pre-flight over JSON -------------------------------------------------------------------


def facts(**changes: Any) -> Facts:
    pvc, pv = claim("data-web-0", "pv-1"), volume("pv-1", "data-web-0", "n1", "vol-1")
    nodes = [node("n1", 5 * GIB), node("n2", 50 * GIB), node("n4", 30 * GIB)]
    lvs = [logical_volume("pv-1", "vol-1", "10Gi")]
    base: Obj = dict(
        namespace=NS, claim="data-web-0", pvc=pvc, pv=pv,
        pods=[pod("web-0", ["data-web-0"], ("StatefulSet", "web"), {"app": "web"})],
        replicaset_owner={}, device_class="", free=free_bytes(nodes, NORMAL, ""),
        schedulable=schedulable_nodes(nodes), lv=find_lv(lvs, pv), rates=[],
    )  # fmt: skip
    base.update(changes)
    return Facts(**base)


def test_preflight_plans_the_move_to_the_node_with_most_room() -> None:
    plan = preflight(facts(), NORMAL)
    assert (plan.source, plan.target, plan.requested) == ("n1", "n2", False)
    assert (plan.pod, plan.owner, plan.size) == ("web-0", "StatefulSet/web", 10 * GIB)
    assert plan.pod_labels == {"app": "web"} and plan.target_free == 50 * GIB
    assert not plan.estimate.measured and plan.replaces == ""


def test_preflight_honours_the_requested_node() -> None:
    plan = preflight(facts(), NORMAL, requested="n4")
    assert plan.target == "n4" and plan.requested


def move_object(phase: str, **status: Any) -> VolumeMoveObject:
    return VolumeMoveObject("data-web-0", NS, "u1", "data-web-0",
                            status=MoveStatus(phase=phase, **status))  # fmt: skip


def test_a_move_in_progress_refuses_another() -> None:
    with pytest.raises(Refused) as info:
        preflight(facts(existing=move_object("PreCopy", message="copying")), NORMAL)
    assert info.value.reason == "MoveInProgress"
    assert info.value.message == (
        "a move of claim data-web-0 is in progress: phase PreCopy (copying)"
    )


def test_a_finished_move_is_replaced() -> None:
    plan = preflight(facts(existing=move_object("RolledBack")), NORMAL)
    assert plan.replaces == "RolledBack"


def test_a_volume_without_node_affinity_is_refused() -> None:
    pv = volume("pv-1", "data-web-0", "n1", "vol-1")
    del pv["spec"]["nodeAffinity"]
    with pytest.raises(Refused) as info:
        preflight(facts(pv=pv), NORMAL)
    assert info.value.reason == "NoSourceNode"


def test_the_logical_volume_must_be_there_and_ready() -> None:
    with pytest.raises(Refused) as info:
        preflight(facts(lv=None), NORMAL)
    assert (info.value.reason, info.value.message) == (
        "NoLogicalVolume",
        "no LogicalVolume has volume id vol-1",
    )
    lv = logical_volume("pv-1", "vol-1", "10Gi")
    lv["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    with pytest.raises(Refused) as info:
        preflight(facts(lv=lv), NORMAL)
    assert info.value.message == "LogicalVolume pv-1 is not ready"


def test_the_device_class_is_the_logical_volumes_else_the_storage_classes() -> None:
    sc = {"metadata": {"name": "topolvm"}, "parameters": {"topolvm.io/device-class": "hdd"}}
    common = Common([], [], {"topolvm": sc})
    pvc = claim("c")
    lv = logical_volume("pv-1", "vol-1", "1Gi")
    lv["spec"]["deviceClass"] = "ssd"
    assert common.device_class(pvc, lv, NORMAL) == "ssd"
    assert common.device_class(pvc, None, NORMAL) == "hdd"
    assert common.device_class(claim("c") | {"spec": {}}, None, NORMAL) == ""


def test_free_bytes_and_schedulable_nodes() -> None:
    nodes = [node("a", 5), node("b", None), node("c", 7, ready=False), node("d", 9, cordoned=True)]
    nodes.append({"metadata": {"name": "e", "annotations": {
        "capacity.topolvm.io/00default": "lots"}}})  # fmt: skip
    assert free_bytes(nodes, NORMAL, "") == {"a": 5, "c": 7, "d": 9}
    assert free_bytes(nodes, NORMAL, "ssd") == {}
    assert schedulable_nodes(nodes) == {"a", "b"}


def test_volume_size_and_measured_rates() -> None:
    lv = logical_volume("x", "h", "2Gi")
    lv["status"]["currentSize"] = "3Gi"
    assert volume_size(lv, None) == 3 * GIB
    assert volume_size(None, volume("p", "c", "n1", "h")) == GIB
    assert volume_size({"metadata": {}}, None) == 0
    lvs = [logical_volume("a", "h", "1Gi", rate=5), logical_volume("b", "h", "1Gi"), lv]
    assert copy_rates(lvs) == [5]
    assert find_lv(lvs, volume("p", "c", "n1", "none")) is None


# -- what it prints -------------------------------------------------------------------------


def test_refusal_line() -> None:
    e = Refused("NoRoom", "no other node has room")
    assert refusal_line("move", e) == "topolvm move: refused (NoRoom): no other node has room"


def test_dry_run_text_says_where_why_how_much_and_how_long() -> None:
    text = dry_run_text([preflight(facts(rates=[200 << 20]), NORMAL)])
    assert "would move claim shop/data-web-0 (used by pod web-0 of StatefulSet/web)" in text
    assert "from node n1 to node n2 (most free bytes in the default device class: 50.0 GiB)" in text
    assert "data of data-web-0: at most 10.0 GiB (10737418240 bytes" in text
    assert "downtime: about 15 s (final copy of ~1.0 GiB at 200.0 MiB/s, measured" in text
    assert text.endswith("dry run: nothing was changed\n")
    assumed = dry_run_text([preflight(facts(), NORMAL, requested="n4")])
    assert "(requested with --to; 30.0 GiB free)" in assumed and "assumed" in assumed


def test_progress_lines() -> None:
    s = MoveStatus(phase="PreCopy", message="copying", done_bytes=1, total_bytes=4)
    assert progress_line(s) == "PreCopy 25%: copying"
    assert progress_line(MoveStatus(phase="Stopping"), "[a/b]") == "[a/b] Stopping"
    assert progress_line(MoveStatus(phase="Succeeded", done_bytes=4, total_bytes=4)) == "Succeeded"


def test_outcomes_and_exit_codes() -> None:
    ok = move_object("Succeeded", source_node="n1", target_node="n2", downtime_seconds=12,
                     precopy_bytes=10 * GIB, delta_bytes=GIB // 2)  # fmt: skip
    assert outcome(ok) == (
        "moved claim shop/data-web-0 from node n1 to node n2: downtime 12 s; 10.0 GiB "
        "pre-copied, 512.0 MiB in the final copy", 0,
    )  # fmt: skip
    back = move_object("RolledBack", reason="CopyFailed", message="n2 went away",
                       source_node="n1")  # fmt: skip
    assert outcome(back) == (
        "move of claim shop/data-web-0 rolled back (CopyFailed): n2 went away; the claim stays "
        "on node n1", 1,
    )  # fmt: skip
    assert outcome(move_object("Refused", reason="NoRoom", message="full"))[1] == 1


def test_line_display_prints_each_phase_once() -> None:
    out = io.StringIO()
    display = LineDisplay(out)
    for phase, done, total in (("Pending", 0, 0), ("PreCopy", 1, 4), ("PreCopy", 3, 4),
                               ("Stopping", 0, 0)):  # fmt: skip
        display.update(move_object(phase, done_bytes=done, total_bytes=total))
    assert out.getvalue().splitlines() == ["Pending", "PreCopy 25%", "Stopping"]


def test_bar_display_draws_the_phase_and_share() -> None:
    out = io.StringIO()
    display = BarDisplay(out)
    display.update(move_object("PreCopy", message="copying", done_bytes=1, total_bytes=2))
    display.close()
    assert "PreCopy 50%: copying" in out.getvalue() and " 50%|" in out.getvalue()


# -- end to end against the emulator --------------------------------------------------------


async def test_dry_run_checks_the_live_cluster_and_creates_nothing(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(emu)
    code = await run_cli("move", "-n", NS, "pvc/data-web-0", "--dry-run", "--kubeconfig",
                         kubeconfig)  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "from node n1 to node n2 (most free bytes" in out and "measured" in out
    assert "~10 s assumed)" in out  # no move finished here yet
    assert emu.list("volumemoves") == []
    # moves finished in any namespace: the pod's stop and start as they took (the final
    # copy's share off); one rolled back says nothing of a downtime
    for ns, name, phase, down in (("other", "a", "Succeeded", 31), ("other", "b", "Unverified", 25),
                                  ("other", "c", "RolledBack", 99)):  # fmt: skip
        emu.create({"apiVersion": "topolvm.io/v1", "kind": "VolumeMove",
                    "metadata": {"name": name, "namespace": ns}, "spec": {"claim": name},
                    "status": {"phase": phase, "downtimeSeconds": down,
                               "deltaBytes": 0}})  # fmt: skip
    code = await run_cli("move", "-n", NS, "pvc/data-web-0", "--dry-run", "--kubeconfig",
                         kubeconfig)  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "plus the pod's stop and start, ~31 s, as this cluster's 2 finished moves took " \
        "(median))" in out, out  # fmt: skip
    assert [m["metadata"]["name"] for m in emu.list("volumemoves")] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["pvc/nothing"], "refused (ClaimNotFound): claim nothing does not exist"),
        (["data-web-0", "--to", "n3"], "refused (Unschedulable): node n3 is cordoned"),
        (["data-web-0", "--to", "plain"], "refused (UnknownNode): node plain runs no TopoLVM"),
    ],
)
async def test_refusals_exit_1_and_create_nothing(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str], argv: list[str],
    reason: str,
) -> None:  # fmt: skip
    seed(emu)
    assert await run_cli("move", "-n", NS, *argv, "--kubeconfig", kubeconfig) == 1
    assert f"topolvm move: {reason}" in capsys.readouterr().err
    assert emu.list("volumemoves") == []


async def test_a_deployment_with_two_replicas_is_refused(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(emu)
    emu.create(pod("web-0", ["data-web-0"], ("ReplicaSet", "app-1"), {}))
    emu.create(
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": "app-1",
                "namespace": NS,
                "ownerReferences": [{"kind": "Deployment", "name": "app", "controller": True}],
            },
        }
    )
    emu.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "app", "namespace": NS},
            "spec": {"replicas": 2},
        }
    )
    assert await run_cli("move", "-n", NS, "data-web-0", "--kubeconfig", kubeconfig) == 1
    assert "refused (ManyReplicas): pod web-0 belongs to Deployment app with 2" in (
        capsys.readouterr().err
    )


async def test_a_move_in_progress_is_refused(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(emu)
    emu.create({"apiVersion": "topolvm.io/v1", "kind": "VolumeMove",
                "metadata": {"name": "data-web-0", "namespace": NS},
                "spec": {"claim": "data-web-0"}, "status": {"phase": "FinalCopy"}})  # fmt: skip
    assert await run_cli("move", "-n", NS, "data-web-0", "--kubeconfig", kubeconfig) == 1
    assert "a move of claim data-web-0 is in progress: phase FinalCopy" in capsys.readouterr().err


async def test_the_move_is_created_and_followed_to_its_end(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(emu)
    emu.create({"apiVersion": "topolvm.io/v1", "kind": "VolumeMove",  # an earlier, finished
                "metadata": {"name": "data-web-0", "namespace": NS},
                "spec": {"claim": "data-web-0"}, "status": {"phase": "RolledBack"}})  # fmt: skip

    async def controller() -> None:
        steps = [
            {"phase": "PreCopy", "doneBytes": 5, "totalBytes": 10, "message": "copying"},
            {"phase": "Succeeded", "sourceNode": "n1", "targetNode": "n2",
             "downtimeSeconds": 7, "preCopyBytes": GIB, "deltaBytes": 1 << 20},
        ]  # fmt: skip
        while steps:  # each step outlasts a poll of the CLI (every second)
            await asyncio.sleep(1.2)
            move = emu.get("volumemoves", "data-web-0", NS)
            if move is None or move.get("status", {}).get("phase") == "RolledBack":
                continue
            move["status"] = steps.pop(0)
            emu.create(move)

    task = asyncio.create_task(controller())
    code = await run_cli("move", "-n", NS, "pvc/data-web-0", "--timeout", "20s",
                         "--kubeconfig", kubeconfig)  # fmt: skip
    await task
    out = capsys.readouterr().out
    assert code == 0, out
    assert "VolumeMove shop/data-web-0 created" in out
    assert "PreCopy 50%: copying" in out
    assert "moved claim shop/data-web-0 from node n1 to node n2: downtime 7 s; 1.0 GiB " in out
    stored = emu.get("volumemoves", "data-web-0", NS)
    assert stored is not None and stored["spec"] == {"claim": "data-web-0"}


async def test_no_wait_creates_the_move_with_its_target(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(emu)
    argv = ["move", "-n", NS, "data-web-0", "--to", "n4", "--no-wait", "--kubeconfig", kubeconfig]
    assert await run_cli(*argv) == 0
    assert "follow it with kubectl get volumemoves -n shop" in capsys.readouterr().out
    stored = emu.get("volumemoves", "data-web-0", NS)
    assert stored is not None and stored["spec"] == {"claim": "data-web-0", "targetNode": "n4"}


async def test_a_timeout_leaves_the_move_going(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(emu)
    argv = ["move", "-n", NS, "data-web-0", "--timeout", "1.5s", "--kubeconfig", kubeconfig]
    assert await run_cli(*argv) == 1
    err = capsys.readouterr().err
    assert "not done after 1.5 s (phase Pending); the move goes on" in err


def test_an_unreachable_api_server_cannot_be_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:9")
    args = cli.build_parser().parse_args(["move", "a", "--kubeconfig", str(config)])
    assert args.run(args) == 2
    assert "topolvm move: could not check: cannot reach the Kubernetes API" in (
        capsys.readouterr().err
    )


def test_a_bad_kubeconfig_cannot_be_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "kc").write_text("not: [a kubeconfig")
    args = argparse.Namespace(kubeconfig=str(tmp_path / "kc"), context=None, namespace="")
    assert move_cli.run(args) == 2
    assert "could not check: cannot load Kubernetes client configuration" in (
        capsys.readouterr().err
    )


def test_a_pods_claims_moved_together_count_as_one_stop() -> None:
    """Two claims of one pod moved together carry the pod's downtime each: one stop, with both
    final copies; another pod's stop counts apart; moves that did not stop a pod, none."""

    def done(name: str, pod_uid: str, stop: str, down: int, delta: int) -> VolumeMoveObject:
        return VolumeMoveObject(name, NS, f"u-{name}", name, status=MoveStatus(
            phase="Succeeded", pod_uid=pod_uid, stop_time=stop, downtime_seconds=down,
            delta_bytes=delta))  # fmt: skip

    back = VolumeMoveObject("c", NS, "u-c", "c", status=MoveStatus(phase="RolledBack"))
    moves = [done("data-a", "p1", "t1", 12, 1 << 20), done("logs-a", "p1", "t1", 11, 2 << 20),
             done("data-b", "p2", "t2", 9, 0), back]  # fmt: skip
    assert sorted(past_downtimes(moves)) == [(9.0, 0), (12.0, 3 << 20)]

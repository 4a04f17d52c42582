"""``topolvm drain`` (src/topolvm/ops): the PodDisruptionBudget arithmetic, finding a node's
claims, what it prints, and the command end to end against the Kubernetes API emulator."""

# ruff: noqa: F811  (the fixtures imported from tests.test_ops_move_cli are parameters here)

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.kube_emulator import KubeEmulator
from tests.test_ops_move_cli import (
    NS,
    claim,
    emu,  # noqa: F401 (fixture)
    facts,
    kubeconfig,  # noqa: F401 (fixture)
    logical_volume,
    pod,
    run_cli,
    seed,
    volume,
)
from topolvm import cli
from topolvm.constants import NORMAL
from topolvm.move.rules import Refused
from topolvm.ops import drain_cli
from topolvm.ops.drain_cli import dry_run_text, summary
from topolvm.ops.drain_run import Result, Survey, claims_on
from topolvm.ops.pdb import Budget, blocking, budgets, selector_matches
from topolvm.ops.preflight import preflight

Obj = dict[str, Any]


def budget(name: str, allowed: int | None, selector: Obj | None) -> Obj:
    out: Obj = {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": NS}, "spec": {"selector": selector},
    }  # fmt: skip
    if allowed is not None:
        out["status"] = {"disruptionsAllowed": allowed}
    return out


# -- PodDisruptionBudget arithmetic ---------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({}, {}, True),  # policy/v1: empty selects every pod of the namespace
        (None, {"app": "web"}, False),
        ({"matchLabels": {"app": "web"}}, {"app": "web", "x": "1"}, True),
        ({"matchLabels": {"app": "web"}}, {"app": "db"}, False),
        ({"matchExpressions": [{"key": "t", "operator": "In", "values": ["a", "b"]}]},
         {"t": "b"}, True),
        ({"matchExpressions": [{"key": "t", "operator": "In", "values": ["a"]}]}, {}, False),
        ({"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        ({"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["a"]}]},
         {"t": "a"}, False),
        ({"matchExpressions": [{"key": "t", "operator": "Exists"}]}, {"t": ""}, True),
        ({"matchExpressions": [{"key": "t", "operator": "DoesNotExist"}]}, {"t": ""}, False),
        ({"matchExpressions": [{"key": "t", "operator": "Gt", "values": ["1"]}]},
         {"t": "2"}, False),
    ],
)  # fmt: skip
def test_selector_matches(selector: Obj | None, labels: dict[str, str], matches: bool) -> None:
    assert selector_matches(selector, labels) is matches


WEB = {"app": "web"}
PDBS = [
    budget("web", 1, {"matchLabels": WEB}),
    budget("all", 2, {}),
    budget("db", 0, {"matchLabels": {"app": "db"}}),
]


def test_budgets_count_the_moves_of_their_pods() -> None:
    got = budgets(WEB, PDBS, [WEB, {"app": "db"}])
    assert got == [Budget("all", 2, 2), Budget("web", 1, 1)]
    assert [b.left for b in got] == [0, 0]


def test_a_move_starts_only_with_a_disruption_left_in_every_budget() -> None:
    assert blocking(WEB, PDBS, []) == []
    assert [b.name for b in blocking(WEB, PDBS, [WEB])] == ["web"]  # "all" has 2 - 1 left
    assert [b.name for b in blocking({"app": "db"}, PDBS, [])] == ["db"]
    assert [b.name for b in blocking({}, [budget("x", None, {})], [])] == ["x"]  # no status: 0
    assert str(Budget("web", 1, 1)) == (
        "PodDisruptionBudget web: 1 disruption(s) allowed, 1 move(s) of its pods running"
    )


# -- arguments and pure parts ---------------------------------------------------------------


def test_drain_arguments() -> None:
    args = cli.build_parser().parse_args(["drain", "n1"])
    assert (args.node, args.max_parallel, args.dry_run, args.skip_refused) == (
        "n1",
        1,
        False,
        False,
    )
    assert args.run is drain_cli.run and args.timeout is None
    args = cli.build_parser().parse_args(
        ["drain", "n1", "--max-parallel", "3", "--skip-refused", "--timeout", "1h", "--dry-run"]
    )
    assert (args.max_parallel, args.skip_refused, args.timeout, args.dry_run) == (
        3,
        True,
        3600,
        True,
    )


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["n1", "--max-parallel", "0"], "must be at least 1, got '0'"),
        (["n1", "--max-parallel", "two"], "not a whole number: 'two'"),
        (["Node_1"], "not a node name"),
        ([], "the following arguments are required: NODE"),
    ],
)
def test_bad_drain_arguments(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args(["drain", *argv])
    assert info.value.code == 2
    assert words in capsys.readouterr().err


def test_claims_on_a_node_are_its_bound_topolvm_volumes() -> None:
    other = volume("pv-x", "x", "n1", "h")
    other["spec"]["csi"]["driver"] = "ebs.csi.aws.com"
    released = volume("pv-r", "r", "n1", "h")
    released["status"]["phase"] = "Released"
    pvs = [volume("pv-2", "b", "n1", "h"), volume("pv-1", "a", "n1", "h"),
           volume("pv-3", "c", "n2", "h"), other, released]  # fmt: skip
    assert claims_on(pvs, "n1", NORMAL) == [(NS, "a"), (NS, "b")]


def test_dry_run_text_lists_claims_pods_budgets_targets_bytes_and_downtime() -> None:
    plan = preflight(facts(), NORMAL)
    found = Survey([plan], [("shop/x", Refused("NoRunningPod", "no pod"))],
                   {NS: [budget("web", 0, {"matchLabels": WEB})]})  # fmt: skip
    text = dry_run_text("n1", found)
    assert text.splitlines() == [
        "node n1: 2 TopoLVM claim(s); 1 would move, 1 refused",
        "  shop/data-web-0: pod web-0 (StatefulSet/web)",
        "    to node n2 (expected; most free bytes in the default device class: 50.0 GiB)",
        "    data: at most 10.0 GiB; downtime about 20 s (final copy of ~1.0 GiB at 100.0 "
        "MiB/s, assumed, plus the pod's stop and start, ~10 s assumed)",
        "    web: PodDisruptionBudget allows 0 disruption(s)",
        "    the move would wait until its budgets allow a disruption",
        "  shop/x: refused (NoRunningPod): no pod",
        "dry run: nothing was changed (the node was not cordoned)",
    ]


def test_summary() -> None:
    text = summary("n1", [Result("a/b", True, "moved"), Result("a/c", False, "rolled back")],
                   ["a/d"])  # fmt: skip
    assert text.splitlines() == [
        "drain of node n1: 1 of 3 claim(s) moved",
        "  ok a/b: moved",
        "  FAILED a/c: rolled back",
        "  SKIPPED a/d: refused",
        "node n1 stays cordoned",
    ]


# -- end to end against the emulator --------------------------------------------------------


def seed_two(emu: KubeEmulator, allowed: int = 1) -> None:
    """:func:`seed` plus a second claim of StatefulSet web on n1 and a budget over web."""
    seed(emu)
    for obj in (
        claim("data-web-1", "pv-2"), volume("pv-2", "data-web-1", "n1", "vol-2"),
        logical_volume("pv-2", "vol-2", "10Gi"),
        pod("web-1", ["data-web-1"], ("StatefulSet", "web"), {"app": "web"}),
        budget("web", allowed, {"matchLabels": WEB}),
    ):  # fmt: skip
        emu.create(obj)


def cordoned(emu: KubeEmulator, name: str) -> bool:
    node = emu.get("nodes", name)
    assert node is not None
    return bool(node.get("spec", {}).get("unschedulable"))


async def test_dry_run_changes_nothing(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_two(emu)
    assert await run_cli("drain", "n1", "--dry-run", "--kubeconfig", kubeconfig) == 0
    out = capsys.readouterr().out
    assert "node n1: 2 TopoLVM claim(s); 2 would move, 0 refused" in out
    assert "  shop/data-web-1: pod web-1 (StatefulSet/web)" in out
    assert "web: PodDisruptionBudget allows 1 disruption(s)" in out
    assert "measured" in out  # the earlier copy's rate
    assert not cordoned(emu, "n1") and emu.list("volumemoves") == []


async def test_a_refused_claim_starts_nothing_and_undoes_the_cordon(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_two(emu)
    await emu.remove("pods", "web-1", NS)
    assert await run_cli("drain", "n1", "--kubeconfig", kubeconfig) == 1
    captured = capsys.readouterr()
    assert "topolvm drain: refused (NoRunningPod): shop/data-web-1: no running pod" in captured.err
    assert "nothing started: 1 claim(s) refused (--skip-refused moves the others)" in captured.err
    assert "node n1 cordoned" in captured.out and "node n1 uncordoned" in captured.out
    assert not cordoned(emu, "n1") and emu.list("volumemoves") == []


async def test_a_node_cordoned_before_stays_cordoned(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_two(emu)
    await emu.remove("pods", "web-1", NS)
    n1 = emu.get("nodes", "n1")
    assert n1 is not None
    n1["spec"] = {"unschedulable": True}
    emu.create(n1)
    assert await run_cli("drain", "n1", "--kubeconfig", kubeconfig) == 1
    assert "uncordoned" not in capsys.readouterr().out
    assert cordoned(emu, "n1")


async def test_an_unknown_node_cannot_be_checked(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await run_cli("drain", "n9", "--kubeconfig", kubeconfig) == 2
    assert "topolvm drain: could not check: node n9 does not exist" in capsys.readouterr().err


async def test_moves_run_within_the_budget_and_the_node_stays_cordoned(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The budget allows one disruption: with --max-parallel 2 the moves still run one at a
    time (a move counts against the budget while it runs)."""
    seed_two(emu)
    most_at_once = 0

    async def controller() -> None:
        nonlocal most_at_once
        finished = 0
        while finished < 2:  # each step outlasts a poll of the CLI (every second)
            await asyncio.sleep(1.2)
            live = [m for m in emu.list("volumemoves", namespace=NS)
                    if m.get("status", {}).get("phase") != "Succeeded"]  # fmt: skip
            most_at_once = max(most_at_once, len(live))
            for move in live:
                phase = move.get("status", {}).get("phase")
                move["status"] = {"phase": "PreCopy" if not phase else "Succeeded",
                                  "sourceNode": "n1", "targetNode": "n2"}  # fmt: skip
                finished += move["status"]["phase"] == "Succeeded"
                emu.create(move)

    task = asyncio.create_task(controller())
    argv = ["drain", "n1", "--max-parallel", "2", "--timeout", "30s", "--kubeconfig", kubeconfig]
    code = await run_cli(*argv)
    await task
    out = capsys.readouterr().out
    assert code == 0, out
    assert most_at_once == 1
    assert (
        "[shop/data-web-1] waits: PodDisruptionBudget web: 1 disruption(s) allowed, 1 move" in out
    )
    assert "[shop/data-web-0] PreCopy" in out and "[shop/data-web-1] Succeeded" in out
    assert "drain of node n1: 2 of 2 claim(s) moved" in out and "n1 stays cordoned" in out
    assert cordoned(emu, "n1")
    assert {m["spec"]["claim"] for m in emu.list("volumemoves")} == {"data-web-0", "data-web-1"}


async def test_a_pods_claims_are_drained_together(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """web-0 mounts two claims on n1: both go, at once, to one node with room for both, even
    with --max-parallel 1."""
    seed(emu)
    for obj in (
        claim("logs-web-0", "pv-2"), volume("pv-2", "logs-web-0", "n1", "vol-2"),
        logical_volume("pv-2", "vol-2", "25Gi"),  # with data-web-0's 10: only n2 has room
        pod("web-0", ["data-web-0", "logs-web-0"], ("StatefulSet", "web"), {"app": "web"}),
    ):  # fmt: skip
        emu.create(obj)
    assert await run_cli("drain", "n1", "--dry-run", "--kubeconfig", kubeconfig) == 0
    out = capsys.readouterr().out
    assert "node n1: 2 TopoLVM claim(s); 2 would move, 0 refused" in out
    assert out.count("to node n2 (expected") == 2, out
    argv = ["drain", "n1", "--max-parallel", "1", "--timeout", "3s", "--kubeconfig", kubeconfig]
    assert await run_cli(*argv) == 1  # nothing moves them here: not done in time
    out = capsys.readouterr().out
    assert "[shop/data-web-0] VolumeMove created" in out
    assert "[shop/logs-web-0] VolumeMove created" in out
    specs = {m["spec"]["claim"]: m["spec"] for m in emu.list("volumemoves")}
    assert specs == {
        "data-web-0": {"claim": "data-web-0", "targetNode": "n2", "together": ["logs-web-0"]},
        "logs-web-0": {"claim": "logs-web-0", "targetNode": "n2", "together": ["data-web-0"]},
    }


async def test_keep_source_is_asked_of_every_move_of_the_drain(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(emu)
    argv = ["drain", "n1", "--keep-source", "10m", "--timeout", "2s", "--kubeconfig", kubeconfig]
    assert await run_cli(*argv) == 1  # nothing moves it here: not done in time
    [move] = emu.list("volumemoves")
    assert move["spec"]["keepSourceSeconds"] == 600, capsys.readouterr().out

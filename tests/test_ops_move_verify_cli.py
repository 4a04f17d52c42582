"""``topolvm move`` and a move's verification: ``--keep-source``, the outcome of a verified
and of an unverified move, and a move again while the last one keeps its old volume (the CLI
against the API emulator; the controller's side: tests/test_controller_move_verify.py)."""

from __future__ import annotations

import asyncio

import pytest

from tests import test_ops_move_cli as base
from tests.kube_emulator import KubeEmulator
from tests.test_ops_move_cli import NS, move_object, run_cli, seed
from topolvm import cli
from topolvm.ops import move_cli
from topolvm.ops.render import outcome

emu = base.emu  # the API emulator and the kubeconfig that reaches it (fixtures)
kubeconfig = base.kubeconfig


def test_outcomes_of_a_verified_and_an_unverified_move() -> None:
    kept = move_object("Succeeded", source_node="n1", target_node="n2", downtime_seconds=3,
                       target_digest="0123456789abcdef0123", old_volume="Kept", old_pv="pv-1",
                       keep_source_until="2026-11-28T11:00:00Z")  # fmt: skip
    text, code = outcome(kept)
    assert code == 0 and text.endswith(
        ", verified (digest 0123456789abcdef); the old volume pv-1 is kept until "
        "2026-11-28T11:00:00Z"
    ), text
    bad = move_object("Unverified", reason="DigestMismatch", message="moved but not verified")
    assert outcome(bad) == (
        "move of claim shop/data-web-0 not verified (DigestMismatch): moved but not verified; "
        "topolvm doctor -n shop says what to do", 1,
    )  # fmt: skip


def test_keep_source_is_a_duration_in_whole_seconds() -> None:
    args = cli.build_parser().parse_args(["move", "pvc/a", "--keep-source", "1h30m"])
    assert move_cli.keep_seconds(args) == 5400
    args = cli.build_parser().parse_args(["move", "pvc/a", "--keep-source", "0.5"])
    assert move_cli.keep_seconds(args) == 1
    assert move_cli.keep_seconds(cli.build_parser().parse_args(["move", "pvc/a"])) == 0


async def test_keep_source_asks_the_move_to_keep_the_old_volume(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(emu)
    dry = ["move", "-n", NS, "data-web-0", "--keep-source", "2h", "--kubeconfig", kubeconfig]
    assert await run_cli(*dry, "--dry-run") == 0
    assert ("the old volume stays until both nodes' digests of the data as of the swap match "
            "(the pod already runs on the target), kept 7200 s longer, then removed") in (
            capsys.readouterr().out)  # fmt: skip
    assert await run_cli(*dry, "--no-wait") == 0
    stored = emu.get("volumemoves", "data-web-0", NS)
    assert stored is not None and stored["spec"] == {"claim": "data-web-0",
                                                     "keepSourceSeconds": 7200}  # fmt: skip


async def test_a_move_again_while_the_last_one_keeps_its_old_volume_is_refused(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Replacing the finished VolumeMove would end its keep (the old volume removed at once):
    refused, with the command that ends the keep on purpose."""
    seed(emu)
    argv = ["move", "-n", NS, "data-web-0", "--keep-source", "2h", "--kubeconfig", kubeconfig]
    assert await run_cli(*argv, "--no-wait") == 0
    move = emu.get("volumemoves", "data-web-0", NS)
    assert move is not None
    move["status"] = {"phase": "Succeeded", "oldVolume": "Kept",
                      "keepSourceUntil": "2026-11-29T02:00:00Z"}  # fmt: skip
    emu.create(move)
    capsys.readouterr()
    assert await run_cli(*argv, "--no-wait") == 1
    err = capsys.readouterr().err
    assert "refused (KeepingSource)" in err and "until 2026-11-29T02:00:00Z" in err, err
    assert f"kubectl delete volumemove -n {NS} data-web-0" in err
    kept = emu.get("volumemoves", "data-web-0", NS)
    assert kept is not None and kept["metadata"]["uid"] == move["metadata"]["uid"]


async def test_a_move_that_did_not_verify_exits_1_and_names_doctor(
    emu: KubeEmulator, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Followed to Unverified (the pod runs on the target, the old volume kept): exit 1."""
    seed(emu)

    async def controller() -> None:
        for _ in range(100):  # once the CLI made it, and polled it once
            await asyncio.sleep(0.2)
            if (move := emu.get("volumemoves", "data-web-0", NS)) is not None:
                break
        await asyncio.sleep(1.2)
        assert move is not None
        move["status"] = {"phase": "Unverified", "reason": "DigestMismatch", "oldVolume": "Kept",
                          "message": "moved to node n2 but not verified"}  # fmt: skip
        emu.create(move)

    task = asyncio.create_task(controller())
    argv = ["move", "-n", NS, "pvc/data-web-0", "--keep-source", "1h", "--timeout", "20s"]
    code = await run_cli(*argv, "--kubeconfig", kubeconfig)
    await task
    said = capsys.readouterr()
    assert code == 1, said
    assert ("move of claim shop/data-web-0 not verified (DigestMismatch): moved to node n2 but "
            "not verified; topolvm doctor -n shop says what to do") in said.err  # fmt: skip
    stored = emu.get("volumemoves", "data-web-0", NS)
    assert stored is not None and stored["spec"]["keepSourceSeconds"] == 3600

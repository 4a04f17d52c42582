"""No pod stays held by a move's scheduling gate (docs/mobility.md, "Fencing"), against the
Kubernetes API emulator: a pod admitted with the gate in the instant its move rolls back,
stored after the rollback let the claim's pods go, is let go by the periodic sweep within its
interval; a move's end sweeps its namespace at once; a pod whose claim is still moving keeps
its gate."""

# ruff: noqa: F811  (the emulator fixtures, imported, are the tests' parameters)
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from tests.helpers import eventually
from tests.kube_emulator import KubeEmulator
from tests.move_fencing_helpers import seed_unrelated
from tests.test_controller_moves import MOVES, _move, reconciler  # noqa: F401 (fixtures)
from tests.test_ops_move_cli import NS, emu, pod, seed  # noqa: F401 (the emulator fixture)
from topolvm.constants import NORMAL
from topolvm.controller.moves import MoveReconciler
from topolvm.k8s import api
from topolvm.k8s.moveobject import MovePhase, manifest

KEY = f"{NS}/data-web-0"
GATE = "topolvm.io/move"


def _gated(emu: KubeEmulator, name: str, claim: str, owner: str) -> None:
    """A pod as the webhook admits it while its claim moves: held by the gate, not scheduled."""
    obj = pod(name, [claim], ("StatefulSet", owner), {"app": owner})
    obj["spec"].pop("nodeName")
    obj["spec"]["schedulingGates"] = [{"name": "example.com/other"}, {"name": GATE}]
    obj["status"] = {"phase": "Pending"}
    emu.create(obj)


def _gates(emu: KubeEmulator, name: str) -> list[str]:
    obj = emu.get("pods", name, NS)
    assert obj is not None
    return [g["name"] for g in obj["spec"].get("schedulingGates") or []]


@contextlib.asynccontextmanager
async def _sweeping(r: MoveReconciler, interval: float) -> AsyncIterator[MoveReconciler]:
    """A reconciler like ``r`` whose gate sweep runs every ``interval`` seconds."""
    swept = MoveReconciler(r.client, NORMAL, r.store, gate_sweep=interval)
    task = asyncio.create_task(swept.sweep.run())
    try:
        yield swept
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _rolled_back_move(emu: KubeEmulator, r: MoveReconciler) -> None:
    """The move of data-web-0 planned, its pod stopped, then failing (RollingBack)."""
    await api.create(r.client, MOVES.from_dict(manifest("topolvm.io", NS, "data-web-0", "n2")))
    await r.reconcile(KEY)
    await emu.remove("pods", "web-0", NS)
    obj = emu.get("volumemoves", "data-web-0", NS)
    assert obj is not None
    obj["status"] |= {"phase": MovePhase.ROLLING_BACK, "reason": "CopyFailed"}
    emu.create(obj)


async def test_a_pod_admitted_as_its_move_rolls_back_is_let_go_by_the_sweep(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    seed(emu)
    seed_unrelated(emu)
    # another claim's move is in its downtime: its pod keeps the gate
    emu.create({**manifest("topolvm.io", NS, "data-db-0", "n2"),
                "status": {"phase": MovePhase.STOPPING}})  # fmt: skip
    await emu.remove("pods", "db-0", NS)
    _gated(emu, "db-0", "data-db-0", "db")
    async with _sweeping(reconciler, interval=0.5) as r:
        await _rolled_back_move(emu, r)
        await r.reconcile(KEY)  # the rollback lets go the pods it sees: none yet
        assert (await _move(r, "data-web-0")).status.phase == MovePhase.ROLLED_BACK
        _gated(emu, "web-0", "data-web-0", "web")  # admitted in that instant, stored now
        start = time.monotonic()

        async def let_go() -> bool:
            return _gates(emu, "web-0") == ["example.com/other"]

        await eventually("the late pod let go", let_go, timeout=5, interval=0.05)
        took = time.monotonic() - start
        assert took < 1.5, took  # within the sweep's interval (and a margin)
        assert r.sweep.lifted == 1
    assert _gates(emu, "db-0") == ["example.com/other", GATE]  # its claim still moves


async def test_a_move_that_ends_sweeps_its_namespace_at_once(
    emu: KubeEmulator, reconciler: MoveReconciler
) -> None:
    seed(emu)
    seed_unrelated(emu)
    await emu.remove("pods", "db-0", NS)
    async with _sweeping(reconciler, interval=3600) as r:
        await asyncio.sleep(0.2)  # the first sweep (every namespace) is done
        _gated(emu, "db-0", "data-db-0", "db")  # no move of data-db-0 at all
        await _rolled_back_move(emu, r)
        await asyncio.sleep(0.2)
        assert GATE in _gates(emu, "db-0")  # no sweep until a move ends
        await r.reconcile(KEY)
        assert (await _move(r, "data-web-0")).status.phase == MovePhase.ROLLED_BACK

        async def let_go() -> bool:
            return GATE not in _gates(emu, "db-0")

        await eventually("the gated pod let go", let_go, timeout=2, interval=0.05)


@pytest.mark.parametrize("phase", [MovePhase.PENDING, MovePhase.SWAPPING, MovePhase.STARTING])
async def test_a_pod_of_a_claim_in_a_move_keeps_its_gate(
    emu: KubeEmulator, reconciler: MoveReconciler, phase: str
) -> None:
    seed(emu)
    emu.create({**manifest("topolvm.io", NS, "data-web-0", "n2"), "status": {"phase": phase}})
    await emu.remove("pods", "web-0", NS)
    _gated(emu, "web-0", "data-web-0", "web")
    assert await reconciler.sweep.sweep() == 0
    assert GATE in _gates(emu, "web-0")

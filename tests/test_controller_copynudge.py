"""A restored or cloned claim binds as soon as its copy is done (docs/mobility.md, "A claim stays
Pending until its copy is complete and verified"), against the Kubernetes API emulator: when a
copy target's ``status.copy`` turns Done, the claim waiting for it is annotated, which is the
update that makes csi-provisioner retry CreateVolume at once instead of after its backoff (up to
5 minutes with its defaults). A claim bound already, a copy still running or a copy of an
earlier round is left alone; the claim's other annotations stay."""

# ruff: noqa: F811  (the emulator fixture, imported, is the tests' parameter)
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import eventually
from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import write_kubeconfig
from tests.test_ops_move_cli import NS, claim, emu  # noqa: F401 (the emulator fixture)
from topolvm.constants import NORMAL
from topolvm.controller.copynudge import CopyDoneNudge, copy_done_annotation
from topolvm.k8s import api

KEY = copy_done_annotation(NORMAL)


def _target(name: str, waiting: str, phase: str, *, spec_round: int = 0) -> dict[str, Any]:
    """A LogicalVolume a copy fills, for the claim ``waiting`` (namespace/name)."""
    copy: dict[str, Any] = {"source": "lv-src", "sourceNode": "n1"}
    if spec_round:
        copy["round"] = spec_round
    return {
        "apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
        "metadata": {"name": name, "annotations": {NORMAL.claim_annotation: waiting}},
        "spec": {"name": name, "nodeName": "n2", "size": "1Gi", "copy": copy},
        "status": {"volumeID": name, "copy": {"phase": phase, "round": 1,
                                               "completionTime": "2026-11-29T08:00:00Z"}},
    }  # fmt: skip


@pytest.fixture
async def nudge(emu: KubeEmulator, tmp_path: Path) -> AsyncIterator[CopyDoneNudge]:
    client = api.make_client(str(write_kubeconfig(tmp_path / "kubeconfig", emu.url)))
    n = CopyDoneNudge(client, NORMAL)
    task = asyncio.create_task(n.run())
    try:
        yield n
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


def _annotations(emu: KubeEmulator, name: str) -> dict[str, str]:
    obj = emu.get("persistentvolumeclaims", name, NS)
    assert obj is not None
    return dict(obj["metadata"].get("annotations") or {})


async def test_a_waiting_claim_is_annotated_when_its_copy_is_done(
    emu: KubeEmulator, nudge: CopyDoneNudge
) -> None:
    pending = claim("restored", phase="Pending")
    pending["metadata"]["annotations"] = {"volume.kubernetes.io/selected-node": "n2"}
    emu.create(pending)
    emu.create(claim("bound-already", phase="Bound"))
    emu.create(claim("still-copying", phase="Pending"))
    emu.create(claim("earlier-round", phase="Pending"))
    emu.create(_target("lv-restored", f"{NS}/restored", "Done"))
    emu.create(_target("lv-bound", f"{NS}/bound-already", "Done"))
    emu.create(_target("lv-running", f"{NS}/still-copying", "Running"))
    # spec asks for round 2; the Done status is of round 1: this copy is not done
    emu.create(_target("lv-earlier", f"{NS}/earlier-round", "Done", spec_round=2))

    async def nudged() -> dict[str, str] | None:
        got = _annotations(emu, "restored")
        return got if KEY in got else None

    got = await eventually("the restored claim nudged", nudged, timeout=10)
    assert got[KEY] == "lv-restored@2026-11-29T08:00:00Z"
    assert got["volume.kubernetes.io/selected-node"] == "n2"  # the rest stays
    for other in ("bound-already", "still-copying", "earlier-round"):
        assert KEY not in _annotations(emu, other), other


async def test_a_copy_that_turns_done_later_nudges_its_claim_then(
    emu: KubeEmulator, nudge: CopyDoneNudge
) -> None:
    emu.create(claim("restored", phase="Pending"))
    lv = _target("lv-restored", f"{NS}/restored", "Running")
    emu.create(lv)
    await asyncio.sleep(0.5)
    assert KEY not in _annotations(emu, "restored")
    stored = emu.get("logicalvolumes", "lv-restored", group="topolvm.io")
    assert stored is not None
    stored["status"]["copy"]["phase"] = "Done"
    emu.create(stored)  # replaces it: the watch sees the copy end
    await eventually("the claim nudged", lambda: KEY in _annotations(emu, "restored"), timeout=10)

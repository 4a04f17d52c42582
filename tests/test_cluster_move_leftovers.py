"""Issue 42's probe, 5 times as the issue ran it, on two nodes (one bed;
``TOPOLVM_LEFTOVER_ROUNDS`` changes the count): a StatefulSet pod writing without pause
to a thin and a thick claim (128 MiB each: what is checked is which LVs are left, not their
size); a bound 64 MiB claim no pod uses (on the pod's node in some rounds, on the other node in
the others); a move of the pod's claims deleted during its pre-copy (it rolls back); a move of
them to the other node; a drain of that node back. After each of these, each node holds exactly
its LogicalVolumes' LVs, its thin pool and the cuts of copies still running
(tests/invariants.py): no cut of an ended copy, no old volume, no rolled-back target. And an LV
no LogicalVolume claims, made by hand: topolvm-node lists it on its Node and counts it,
``topolvm doctor`` names it with its size and the command that removes it, and it stays."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Iterator

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import node_annotations, unique
from tests.doctor_helpers import about, doctor
from tests.helpers import eventually
from tests.lvm_fixtures import THICK, THIN
from tests.move_helpers import (
    delete_move,
    lvs_accounted,
    move_webhook,
    moves_now,
    phase_of,
    start_move,
    writer_set,
)
from tests.provisioning import NS, Scenario, claim, shared_nodes
from tests.transfer_helpers import metric, on_node
from topolvm.k8s import api, orphanlvs
from topolvm.k8s.moveobject import MovePhase

pytestmark = pytest.mark.cluster
# the unused claim on the pod's node in even rounds, on the other in odd ones
ROUNDS = int(os.environ.get("TOPOLVM_LEFTOVER_ROUNDS", "5"))
SIZE = "128Mi"  # the pod's two claims (the issue's were 1 GiB; the LVs' count is what matters)


def _pool(node: UmlNode) -> None:
    node.lvm("lvcreate", "-T", "vg1/pool0", "-L", "3g")


@pytest.fixture(scope="module")
def ab_nodes(
    control_plane: ControlPlane, driver: DriverStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[UmlNode]]:
    # the LV accounting looks every 10 s instead of every minute: the doctor test waits for it
    with shared_nodes(control_plane, tmp_path_factory.mktemp("left"), "left", [8, 8],
                      [THICK, THIN], prepare=_pool,
                      extra=["--lv-accounting-interval=10"]) as nodes:  # fmt: skip
        yield nodes


async def _cli(s: Scenario, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "topolvm", *args, f"--kubeconfig={s.cp.kubeconfig}",
        "--timeout=10m", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out = (await proc.communicate())[0].decode()
    print(out)  # the numbers, for the record
    assert proc.returncode is not None
    return proc.returncode, out


CUT_NEWS = ("cut cannot be removed", "removed at last", "ended while its cut",
            "cut stays", "cannot remove", "removed a copy's cut")  # fmt: skip


def _cut_news(s: Scenario, after: str) -> None:
    """What topolvm-node said of cuts, for the record."""
    for n in s.nodes:
        said = [ln for ln in n.node_log(lines=300).splitlines() if any(w in ln for w in CUT_NEWS)]
        print(f"--- {after}: {n.name} on cuts:\n" + "\n".join(said[-12:]))


def _said(s: Scenario) -> str:
    """What each topolvm-node said last of cuts and copies: why a move failed."""
    words = ("cut", "refused", "open", "sweep", "copy", "Refused", "ERROR", "WARNING")
    out = []
    for n in s.nodes:
        said = [ln for ln in n.node_log(lines=2000).splitlines() if any(w in ln for w in words)]
        out.append(f"--- {n.name}:\n" + "\n".join(said[-80:]))
    return "\n".join(out)


async def _node_of(s: Scenario, pod: str) -> str:
    await s.running(pod, timeout=300)
    obj = await api.get(s.client, Pod, pod, namespace=NS)
    assert obj is not None
    return str(obj["spec"]["nodeName"])


async def _moves_gone(s: Scenario, claims: list[str]) -> None:
    for c in claims:
        await delete_move(s.client, c)

    async def gone() -> bool:
        return not any(m.claim in claims for m in await moves_now(s.client))

    await eventually("the VolumeMoves gone", gone, timeout=120)


async def _unused(s: Scenario, sc: str, node: str) -> str:
    """A 64 MiB claim bound on ``node`` by a pod that is gone again."""
    name, user = unique("unused"), unique("binder")
    # in a thread: the pod webhook this test serves answers on this loop
    await asyncio.to_thread(s.apply, claim(name, sc, "64Mi"), on_node(user, s.group, node, [name]))
    await s.running(user)
    await s.delete_pod(user)
    return name


async def _rolled_back(s: Scenario, claims: list[str], target: str, wait: float) -> None:
    """The pod's claims move together to ``target``; ``wait`` seconds into the pre-copy their
    VolumeMoves are deleted: each rolls back."""
    for c in claims:
        await start_move(s.client, c, target, tuple(o for o in claims if o != c))

    async def precopy() -> bool:
        return await phase_of(s.client, claims[0]) == MovePhase.PRE_COPY

    await eventually("the pre-copy", precopy, timeout=120, interval=0.1)
    await asyncio.sleep(wait)
    for c in claims:
        await delete_move(s.client, c)

    async def ended() -> bool:
        return all(m.done for m in await moves_now(s.client) if m.claim in claims)

    def state() -> str:
        moves = s.cp.kubectl("get", "volumemoves", "-n", NS, "-o", "yaml", check=False)
        lvs = s.cp.kubectl("get", "logicalvolumes", "-o", "wide", check=False)
        return f"{moves[-4000:]}\n{lvs[-2000:]}"

    await eventually("the rollbacks", ended, timeout=300, interval=0.5, details=state)
    phases = {m.claim: m.status.phase for m in await moves_now(s.client) if m.claim in claims}
    assert set(phases.values()) <= {MovePhase.ROLLED_BACK}, phases  # gone ones are done
    await _moves_gone(s, claims)


async def test_moves_rollbacks_and_drains_leave_no_lv_behind(
    ab_nodes: list[UmlNode], control_plane: ControlPlane, cluster_client: AsyncClient
) -> None:
    s = Scenario(control_plane, cluster_client, ab_nodes)
    await s.record()
    try:
        await _probe(s)
    finally:
        await s.clean()


async def _probe(s: Scenario) -> None:
    # small ext4 volumes (xfs needs 300 MiB): what is checked does not grow with their size
    thin, thick = s.sc(device_class="thin", fs_type="ext4"), s.sc(fs_type="ext4")
    name = unique("lo")
    pod, claims = f"{name}-0", [f"data-{name}-0", f"logs-{name}-0"]
    s.claims.extend(claims)
    async with move_webhook(s.cp, s.client):
        s.cp.apply(writer_set(name, thin, s.group, size=SIZE, logs_sc=thick, logs_size=SIZE))
        try:
            for r in range(ROUNDS):
                source = await _node_of(s, pod)
                target = next(n.name for n in s.nodes if n.name != source)
                # the unused claim on the pod's node, or on the other one
                s.claims.append(await _unused(s, thick, source if r % 2 == 0 else target))
                await lvs_accounted(s, f"round {r}'s start")
                await _rolled_back(s, claims, target, wait=0.7 * r)
                await lvs_accounted(s, f"round {r}'s rollback")
                _cut_news(s, f"round {r}'s rollback")
                assert await _node_of(s, pod) == source

                rc, out = await _cli(s, "move", "-n", NS, f"pvc/{claims[0]}", f"--to={target}")
                assert rc == 0, out + _said(s)
                await lvs_accounted(s, f"round {r}'s move")
                _cut_news(s, f"round {r}'s move")
                assert await _node_of(s, pod) == target
                await _moves_gone(s, claims)

                rc, out = await _cli(s, "drain", target, "--skip-refused", "--max-parallel=2")
                s.cp.kubectl("uncordon", target)
                assert rc in (0, 1), out  # 1: the unused claim on it is refused (no pod)
                assert all(f"SKIPPED {NS}/{c}" not in out for c in claims), out + _said(s)
                await lvs_accounted(s, f"round {r}'s drain")
                _cut_news(s, f"round {r}'s drain")
                assert await _node_of(s, pod) == source
                await _moves_gone(s, claims)
        finally:
            for n in s.nodes:
                s.cp.kubectl("uncordon", n.name, check=False)
            s.cp.kubectl("delete", "statefulset", name, "-n", NS, "--wait=true", check=False)
            await _moves_gone(s, claims)


async def test_doctor_names_an_lv_no_logical_volume_claims_and_its_node_keeps_it(
    ab_nodes: list[UmlNode], control_plane: ControlPlane, cluster_client: AsyncClient
) -> None:
    s = Scenario(control_plane, cluster_client, ab_nodes)
    await s.record()
    a = s.nodes[0]
    name = str(uuid.uuid4())  # named like a volume whose LogicalVolume went first
    a.lvm("lvcreate", "-n", name, "-L", "64m", "-W", "y", "-y", "vg1")
    try:

        async def named() -> dict[str, object] | None:
            _, doc = await doctor(s.cp)
            found = about(doc, "orphan-lvs", a.name)
            return found[0] if found else None

        # topolvm-node looks every 10 s here (ab_nodes) and judges on two looks in a row
        finding = await eventually("doctor naming the LV", named, timeout=120, interval=2)
        print(finding)
        assert f"LV vg1/{name} (device class ssd): 64.0 MiB" in str(finding["evidence"])
        assert f"lvremove -y vg1/{name}" in str(finding["fixes"])
        assert metric(a, "topolvm_orphan_logical_volumes", device_class="ssd") == 1
        assert metric(a, "topolvm_orphan_logical_volume_bytes", device_class="ssd") == 64 << 20
        assert name in a.lvs("vg1")  # never removed by topolvm-node
    finally:
        a.lvm("lvremove", "-y", f"vg1/{name}")

    async def cleared() -> bool:
        return orphanlvs.annotation(s.names) not in await node_annotations(s.client, a.name)

    await eventually("the Node's list cleared", cleared, timeout=120, interval=2)
    await s.clean()

"""A move's writer for the cluster tests: a StatefulSet pod on a thin claim (and a thick
one) writing numbered lines and blobs, the move webhook on; what a moved pod must still have;
an image no node has yet (a registry); and the small waits the move tests share (a transfer
port refused, a node Ready again)."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, Pod

from devtools import nodeimages
from devtools.testbed.controlplane import ADVERTISE
from devtools.testbed.process import HarnessError
from devtools.testbed.registry import Registry, trust
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import unique
from tests.helpers import eventually
from tests.move_helpers import check_log, delete_move, lvs_accounted, move_webhook, writer_set
from tests.provisioning import NS, Scenario, events_for
from topolvm.k8s import api
from topolvm.k8s.moveobject import VolumeMoveObject
from topolvm.move.prepull import ImagesPulled


@contextlib.contextmanager
def refused(client_node: UmlNode, server: UmlNode) -> Iterator[None]:
    """``client_node``'s connections to ``server``'s transfer port are refused (a TCP reset),
    in the test's network namespace; the API server stays reachable."""
    rules = (
        "table inet topolvm_test_refuse {\n chain forwarded {\n"
        "  type filter hook forward priority 0;\n"
        f"  ip saddr {client_node.address} ip daddr {server.address} tcp dport 9850 "
        "reject with tcp reset\n }\n}\n"
    )
    subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)
    try:
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "inet", "topolvm_test_refuse"], check=False)


class Writer:
    def __init__(self, s: Scenario, name: str, logs: bool = False) -> None:
        self.s = s
        self.name = name
        self.pod, self.claim = f"{name}-0", f"data-{name}-0"
        self.logs = f"logs-{name}-0" if logs else ""  # a second claim of the pod (thick)
        self.source = self.target = self.blob = self.logs_blob = ""
        self.written = 0

    async def start(self) -> None:
        s = self.s
        await s.running(self.pod)
        first = await api.get(s.client, Pod, self.pod, namespace=NS)
        assert first is not None
        self.source = first["spec"]["nodeName"]
        self.target = next(n.name for n in s.nodes if n.name != self.source)
        self.blob = s.exec(self.pod, "head -c 48m /dev/urandom > /data/blob; sync; "
                           "sha256sum /data/blob")  # fmt: skip
        if self.logs:
            self.logs_blob = s.exec(self.pod, "head -c 16m /dev/urandom > /logs/blob; sync; "
                                    "sha256sum /logs/blob")  # fmt: skip
        self.written = int(s.exec(self.pod, "wc -l < /data/log"))

    async def check(self, vm: VolumeMoveObject, logs: VolumeMoveObject | None = None) -> None:
        """Moved: the pod runs on the target with every write and the blobs; the old LVs
        gone."""
        s = self.s
        assert vm.status.source_node == self.source and vm.status.target_node == self.target
        await s.running(self.pod)
        moved = await api.get(s.client, Pod, self.pod, namespace=NS)
        assert moved is not None and moved["spec"]["nodeName"] == self.target
        check_log(s.exec(self.pod, "cat /data/log").split("\n"), self.written)
        assert s.exec(self.pod, "sha256sum /data/blob") == self.blob
        if logs is not None:
            assert s.exec(self.pod, "sha256sum /logs/blob") == self.logs_blob
        res = api.logicalvolume_resource(s.names)
        for done in (vm, logs) if logs is not None else (vm,):
            old = done.status.source_volume
            await eventually(f"the old LogicalVolume {old} gone", partial(gone, s, res, old))
        await lvs_accounted(s, "the move")


@contextlib.asynccontextmanager
async def writer(s: Scenario, logs: bool = False, image: str = "") -> AsyncIterator[Writer]:
    """A writing StatefulSet on a thin claim (and a thick one, with ``logs``), with the move
    webhook, its pod's image ``image`` (else the nodes' busybox); all removed after."""
    thin = s.sc(device_class="thin", fs_type="xfs")
    w = Writer(s, unique("mv"), logs)
    s.claims.extend(c for c in (w.claim, w.logs) if c)
    async with move_webhook(s.cp, s.client):
        s.cp.apply(writer_set(w.name, thin, s.group, logs_sc=s.sc() if logs else "", image=image))
        try:
            await w.start()
            yield w
        finally:
            s.cp.kubectl("delete", "statefulset", w.name, "-n", NS, "--wait=true", check=False)
            for c in (w.claim, w.logs):
                if c:
                    await delete_move(s.client, c)


async def gone(s: Scenario, res: Any, name: str) -> bool:
    return await api.get(s.client, res, name) is None


async def lines_on(node: UmlNode, pv: str) -> int:
    """Lines of the writer's log, read on ``node`` through its pod's mount of ``pv``."""
    script = (f"f=$(grep -m1 '/{pv}/mount ' /proc/mounts | cut -d' ' -f2); "
              'test -n "$f" && wc -l < "$f/log"')  # fmt: skip
    return int((await node.aexec("sh", "-c", script)).stdout)


async def move_of(client: AsyncClient, claim_name: str) -> VolumeMoveObject:
    obj = await api.get(client, api.volumemove_resource(), claim_name, namespace=NS)
    assert obj is not None
    return VolumeMoveObject.from_dict(obj)


async def answers(s: Scenario, pod: str) -> bool:
    """The pod's container runs a command (its node's kubelet serves ``exec`` again)."""
    try:
        s.exec(pod, "true")
    except HarnessError:
        return False
    return True


async def node_ready(s: Scenario, name: str) -> bool:
    node = await api.get(s.client, Node, name)
    conditions = ((node or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@contextlib.asynccontextmanager
async def fresh_image(s: Scenario) -> AsyncIterator[tuple[Registry, str]]:
    """A registry in the test's network namespace that the nodes trust, and a fresh tag of
    busybox there: an image no node has yet."""
    registry = await Registry(nodeimages.busybox().archive).start(ADVERTISE)
    try:
        for n in s.nodes:
            trust(n, registry.address)
        yield registry, registry.reference("moved/busybox", unique("t"))
    finally:
        await registry.stop()


async def pulled_before_the_stop(
    s: Scenario, registry: Registry, image: str, vm: VolumeMoveObject
) -> None:
    """The move's target node asked the registry for ``image`` only before the pod stopped
    (the pod's start there found it), and the move says it pulled it (condition, Event)."""
    target = next(n for n in s.nodes if n.name == vm.status.target_node)
    asked = [p.at for p in registry.pulls if p.peer == target.address]
    stopped = datetime.strptime(vm.status.stop_time, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert asked and max(asked) < stopped.timestamp() + 1, (asked, vm.status.stop_time)
    pulled = vm.status.condition(ImagesPulled.TYPE)
    assert pulled is not None and pulled.status == "True" and image in pulled.message, pulled
    told = [e.split(":")[0] for e in await events_for(s.client, "VolumeMove", vm.name)]
    assert "ImagesPulled" in told, told


async def restart_seconds(s: Scenario, pod: str) -> float:
    """A plain restart of a StatefulSet's pod on its node, what a move's downtime compares
    with: seconds from its delete until the new pod's containers are ready."""
    old = await api.get(s.client, Pod, pod, namespace=NS)
    assert old is not None
    uid = old["metadata"]["uid"]
    began = time.monotonic()
    await api.delete(s.client, Pod, pod, namespace=NS)

    async def back() -> bool:
        obj = await api.get(s.client, Pod, pod, namespace=NS)
        if obj is None or obj["metadata"]["uid"] == uid:
            return False
        statuses = (obj.get("status") or {}).get("containerStatuses") or []
        return bool(statuses) and all(st.get("ready") for st in statuses)

    await eventually(f"pod {pod} restarted", back, timeout=180, interval=0.2)
    return time.monotonic() - began


_STEP = re.compile(r"^(\S+ \S+) INFO\s+\S+: move step .*?move='([^']*)' .*?to='([^']*)'")


def _steps(controller_log: Path, moves: list[str]) -> list[tuple[str, str, datetime]]:
    """(move, phase entered, when) from topolvm-controller's "move step" log lines (the test
    bed's text format)."""
    steps: list[tuple[str, str, datetime]] = []
    for line in controller_log.read_text(errors="replace").splitlines():
        found = _STEP.match(line)
        if found and found.group(2) in moves:
            at = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f")
            steps.append((found.group(2), found.group(3), at))
    return steps


def move_timeline(controller_log: Path, moves: list[str]) -> tuple[str, float]:
    """When each of ``moves`` (namespace/name) entered each phase from its pod's stop on, in
    seconds after the first of them stopped (``claim: FinalCopy +1.2 Swapping +3.4 ...``), and
    the pod's downtime to a tenth of a second: from that first stop until the last of them saw
    the pod run on the target (status.downtimeSeconds is whole seconds, counted from a stamp of
    whole seconds)."""
    steps = _steps(controller_log, moves)
    stops = [at for _, phase, at in steps if phase == "Stopping"]
    runs = [at for _, phase, at in steps if phase == "Verifying"]
    if not stops or not runs:
        return f"no move steps in {controller_log}", 0.0
    zero = min(stops)
    text = "; ".join(
        f"{move.partition('/')[2]}: " + " ".join(
            f"{phase} +{(at - zero).total_seconds():.1f}"
            for m, phase, at in steps if m == move and at >= zero
        )
        for move in moves
    )  # fmt: skip
    return text, (max(runs) - zero).total_seconds()

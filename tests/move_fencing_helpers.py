"""Helpers of the move fencing tests (docs/mobility.md, "Fencing"): an HTTP proxy that holds
one kind of request until released (a controller paused between its read and its write, as a
SIGSTOP of a former leader does), the emulator's move seed with an unrelated volume, and, on
the real cluster, a watch for a bound PV or its LogicalVolume being deleted."""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume

from devtools.testbed.process import Child
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import pod_node, unique
from tests.helpers import eventually
from tests.kube_emulator import KubeEmulator
from tests.leader_helpers import paused
from tests.move_helpers import at_phases, delete_move, holding_set, move_done, start_move
from tests.provisioning import NS as CLUSTER_NS
from tests.provisioning import Scenario
from tests.provisioning import claim as cluster_claim
from tests.test_ops_move_cli import NS, claim, logical_volume, pod, volume
from topolvm.constants import NORMAL
from topolvm.k8s import api
from topolvm.k8s.moveobject import MovePhase

_HOP = {"host", "connection", "keep-alive", "transfer-encoding", "content-length",
        "content-encoding", "accept-encoding"}  # fmt: skip


@dataclass
class Hold:
    method: str
    path_suffix: str
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


class HoldingProxy:
    """A reverse proxy to ``upstream`` (no watches: plain requests only). :meth:`hold` makes
    the next request of a method whose path ends with a suffix wait before it is forwarded,
    until :meth:`Hold.release` is set: the client sent it, the server has not seen it."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.holds: list[Hold] = []
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    def hold(self, method: str, path_suffix: str) -> Hold:
        h = Hold(method, path_suffix)
        self.holds.append(h)
        return h

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._session = aiohttp.ClientSession(auto_decompress=False)
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        for h in self.holds:
            h.release.set()
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        for h in list(self.holds):
            if request.method == h.method and request.path.endswith(h.path_suffix):
                self.holds.remove(h)
                h.arrived.set()
                await h.release.wait()
                break
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers,
            data=await request.read(),
        ) as resp:  # fmt: skip
            body = await resp.read()
            out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
            return web.Response(status=resp.status, body=body, headers=out)


@contextlib.asynccontextmanager
async def holding_proxy(emu: KubeEmulator) -> AsyncIterator[HoldingProxy]:
    proxy = HoldingProxy(emu.url)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


def seed_unrelated(emu: KubeEmulator) -> None:
    """Another claim, its PV and LogicalVolume (``pv-9``, volume id ``vol-9``), bound and used
    by pod ``db-0``: what a tampered status might point a move's deletes at."""
    for obj in (
        claim("data-db-0", "pv-9"), volume("pv-9", "data-db-0", "n1", "vol-9"),
        logical_volume("pv-9", "vol-9", "1Gi"),
        pod("db-0", ["data-db-0"], ("StatefulSet", "db"), {"app": "db"}),
    ):  # fmt: skip
        emu.create(obj)


def node_verifies(emu: KubeEmulator, name: str, uid: str, phase: str = "Cut",
                  digest: str = "") -> None:  # fmt: skip
    """The node of LogicalVolume ``name`` answers the verification ``uid`` (its
    ``status.verify``): cut, or done with ``digest`` of the bytes asked for."""
    lv = emu.get("logicalvolumes", name, group="topolvm.io")
    assert lv is not None
    asked = (lv.get("spec") or {}).get("verify") or {}
    assert asked.get("id") == uid, f"LogicalVolume {name} was not asked to verify {uid}: {asked}"
    st: dict[str, object] = {"id": uid, "phase": phase}
    if digest:
        st.update(digest=digest, sizeBytes=asked.get("sizeBytes") or 0)
    if phase in ("Done", "Failed"):  # as the node writes it (node/verify.py)
        st["completionTime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lv.setdefault("status", {})["verify"] = st
    emu.create(lv)


def keep_passes(emu: KubeEmulator, name: str, seconds: int) -> None:
    """As if ``seconds`` had passed since the node of LogicalVolume ``name`` finished its
    digest: its ``status.verify.completionTime`` moved that far back (no test sleeps out a
    keep, and none races one on a slow machine)."""
    lv = emu.get("logicalvolumes", name, group="topolvm.io")
    assert lv is not None
    st = (lv.get("status") or {}).get("verify") or {}
    then = time.strptime(st["completionTime"], "%Y-%m-%dT%H:%M:%SZ")
    st["completionTime"] = time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(calendar.timegm(then) - seconds)
    )
    emu.create(lv)


class BoundDeletes:
    """Polls PVs and LogicalVolumes every ``interval`` seconds while it runs and records each
    delete of a bound volume: a PV given a deletionTimestamp while ``Bound``, a LogicalVolume
    given one (or gone) while a ``Bound`` PV has its volume id as volumeHandle."""

    def __init__(self, client: AsyncClient, interval: float = 0.2) -> None:
        self.client = client
        self.interval = interval
        self.violations: list[str] = []
        self.polls = 0
        self._task: asyncio.Task[None] | None = None

    async def _poll(self) -> None:
        last: dict[str, str] = {}  # LogicalVolume name -> volume id, at the previous poll
        while True:
            pvs, _ = await api.list_all(self.client, PersistentVolume)
            lvs, _ = await api.list_all(self.client, api.logicalvolume_resource(NORMAL))
            bound = {(p["spec"].get("csi") or {}).get("volumeHandle"): p["metadata"]["name"]
                     for p in pvs if (p.get("status") or {}).get("phase") == "Bound"}  # fmt: skip
            for p in pvs:
                if p["metadata"].get("deletionTimestamp") and p["metadata"]["name"] in (
                    bound.values()
                ):
                    self._record(f"PV {p['metadata']['name']} deleted while Bound")
            now = {o["metadata"]["name"]: str((o.get("status") or {}).get("volumeID") or "")
                   for o in lvs}  # fmt: skip
            for o in lvs:
                vid = now[o["metadata"]["name"]]
                if o["metadata"].get("deletionTimestamp") and vid in bound:
                    self._record(f"LogicalVolume {o['metadata']['name']} deleted while PV "
                                 f"{bound[vid]} is Bound to it")  # fmt: skip
            for name, vid in last.items():
                if name not in now and vid in bound:
                    self._record(f"LogicalVolume {name} gone while PV {bound[vid]} is Bound to it")
            last = now
            self.polls += 1
            await asyncio.sleep(self.interval)

    def _record(self, what: str) -> None:
        if what not in self.violations:
            self.violations.append(what)

    def __enter__(self) -> BoundDeletes:
        self._task = asyncio.get_running_loop().create_task(self._poll())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            if self._task.done() and not self._task.cancelled() and self._task.exception():
                raise AssertionError(f"the watch failed: {self._task.exception()}")


async def fenced_move(
    s: Scenario, source: UmlNode, target: UmlNode, sc: str, controllers: dict[str, Child],
    at: str, rng: random.Random,
) -> str:  # fmt: skip
    """One seeded interleaving: a claim (``sc``, on ``source``) whose StatefulSet pod wrote
    8 MiB moves to ``target`` while every controller of ``controllers`` drives it; one drawn
    controller is paused (SIGSTOP) a drawn moment into step ``at`` (or the first step seen
    after it) for a drawn time, then goes on. The move ends Succeeded or RolledBack, the pod
    runs where that says and reads its data back, and no bound PV or LogicalVolume was
    deleted (watched until 3 s after the paused one went on). What happened, in a line."""
    steps = MovePhase.ORDER[1:-1]
    which = rng.choice(sorted(controllers))
    after, hold = round(rng.uniform(0, 0.5), 2), round(rng.uniform(2, 6), 1)
    plan = f"{which} paused {after}s into {at} for {hold}s"
    name, claim_name = unique("fence"), unique("fenced")
    pod_name = f"{name}-0"
    s.apply(cluster_claim(claim_name, sc, "256Mi"))
    s.cp.apply(holding_set(name, claim_name, s.group))
    pause: list[asyncio.Task[None]] = []

    def act() -> None:
        if not pause:
            pause.append(asyncio.get_running_loop().create_task(
                paused(controllers[which], after, hold)))  # fmt: skip

    async def state() -> str:
        vm = await api.get(s.client, api.volumemove_resource(NORMAL), claim_name,
                           namespace=CLUSTER_NS)  # fmt: skip
        made = f"move-{(vm or {}).get('metadata', {}).get('uid')}"
        lv = await api.get(s.client, api.logicalvolume_resource(NORMAL), made)
        return (
            f"{plan}\nVolumeMove status: {(vm or {}).get('status')}\n{made} status: "
            f"{(lv or {}).get('status')}\ntarget's topolvm-node:\n{target.node_log(lines=15)}"
        )

    try:
        await s.running(pod_name)
        blob = s.exec(pod_name, "head -c 8m /dev/urandom > /data/blob; sync; "
                      "sha256sum /data/blob")  # fmt: skip
        with BoundDeletes(s.client) as watch:
            await start_move(s.client, claim_name, target.name)
            acts = dict.fromkeys(steps[steps.index(at) :], act)
            try:
                seen = await at_phases(s.client, claim_name, acts, timeout=240)
            except AssertionError as e:
                raise AssertionError(f"{e}\n{await state()}") from e
            vm = await move_done(s.client, claim_name, timeout=60)
            if pause:
                await pause[0]
                await asyncio.sleep(3)  # the paused one's passes on its old reads
        outcome = vm.status.phase + (f" ({vm.status.reason})" if vm.status.reason else "")
        line = f"{plan}: {outcome}, steps seen {seen}"
        assert vm.status.phase in (MovePhase.SUCCEEDED, MovePhase.ROLLED_BACK), (line, vm.status)
        assert watch.violations == [] and watch.polls > 10, (line, watch.violations)
        await s.running(pod_name)
        moved = vm.status.phase == MovePhase.SUCCEEDED
        landed = await pod_node(s.client, pod_name, CLUSTER_NS)
        assert landed == (target if moved else source).name, (line, landed)
        assert s.exec(pod_name, "sha256sum /data/blob") == blob, line
        # what the move no longer needs is gone: the old volume, or the target of a rollback
        left = vm.status.source_volume if moved else vm.made_name
        res = api.logicalvolume_resource(NORMAL)

        async def gone() -> bool:
            return await api.get(s.client, res, left) is None

        await eventually(f"LogicalVolume {left} removed ({line})", gone, timeout=30)
        return line
    finally:
        for task in pause:
            task.cancel()  # goes on (SIGCONT) if still paused
        await asyncio.gather(*pause, return_exceptions=True)
        await asyncio.to_thread(s.cp.kubectl, "delete", "statefulset", name, "-n", CLUSTER_NS,
                                "--cascade=foreground", "--timeout=120s", timeout=150,
                                check=False)  # fmt: skip
        await delete_move(s.client, claim_name)
        s.cp.kubectl("delete", "pvc", claim_name, "-n", CLUSTER_NS, "--wait=false", check=False)


__all__ = ["NS", "BoundDeletes", "HoldingProxy", "fenced_move", "holding_proxy",
           "node_verifies", "seed_unrelated"]  # fmt: skip

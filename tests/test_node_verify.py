"""Verification digests (node/verify.py, docs/mobility.md "Verifying a move") on real LVM in
UML, with topolvm-node's reconciler against the API emulator: a LogicalVolume whose
``spec.verify.id`` is set gets ``status.verify`` phase Cut, then Done with the digest of its
content at the instant of the cut (equal to one computed here independently, equal for a thin
and a thick volume of equal content, other after a block flipped), and its cut is gone after;
writes after the cut (the moved pod starting) are not in it, also when the node restarts
mid-read; a thick cut that overflows fails the verification, saying so."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import xxhash
from lightkube import AsyncClient

from tests.helpers import eventually
from tests.kube_emulator import KubeEmulator
from tests.kube_fixtures import kube  # noqa: F401
from tests.lvm_fixtures import THICK, THIN, VolumeGroups, lvm
from topolvm.constants import NORMAL
from topolvm.k8s import api
from topolvm.k8s.runtime import Controller, Informer
from topolvm.node.lvmd_client import SocketLvmd
from topolvm.node.reconciler import LogicalVolumeReconciler
from topolvm.node.verify import VerifyJobs
from topolvm.node.verifyread import verify_cut_name
from topolvm.proto import lvmd_pb2 as pb

pytestmark = pytest.mark.uml
MiB = 1 << 20
NODE = "node1"
RES = api.logicalvolume_resource(NORMAL)


def independent_digest(path: str, size: int) -> str:
    """docs/mobility.md's whole-volume digest, computed here from the device's bytes:
    ``c0 = BLAKE2b-256("topolvm-transfer-v1" || size)``, then per 1 MiB segment
    ``c = BLAKE2b-256(c || XXH3-128(segment))``."""
    state = hashlib.blake2b(b"topolvm-transfer-v1" + size.to_bytes(8, "big"),
                            digest_size=32).digest()  # fmt: skip
    with open(path, "rb", buffering=0) as f:
        for offset in range(0, size, MiB):
            segment = f.read(min(MiB, size - offset))
            state = hashlib.blake2b(state + xxhash.xxh3_128_digest(segment),
                                    digest_size=32).digest()  # fmt: skip
    return state.hex()


def dd(device: str, offset: int, length: int, source: str = "/dev/urandom") -> None:
    """``length`` bytes of ``source`` at byte ``offset`` of ``device`` (4 KiB multiples)."""
    subprocess.run(["dd", f"if={source}", f"of={device}", "bs=4096", f"seek={offset // 4096}",
                    f"count={length // 4096}", "oflag=direct", "status=none"],
                   check=True)  # fmt: skip


def verify_cuts() -> list[str]:
    out = lvm("lvs", "vg1", "--reportformat", "json", "-o", "lv_name")
    return [r["lv_name"] for r in json.loads(out)["report"][0]["lv"]
            if r["lv_name"].startswith("verify.")]  # fmt: skip


@dataclass
class Node:
    """topolvm-node's reconciler and verifications, wired as node/app.py wires them."""

    client: AsyncClient
    lvmd: SocketLvmd
    bandwidth: int = 0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    verifier: VerifyJobs | None = None

    def start(self) -> None:
        self.verifier = VerifyJobs(self.client, NORMAL, NODE, self.lvmd, self.bandwidth)
        reconciler = LogicalVolumeReconciler(self.client, NORMAL, NODE, self.lvmd, None,
                                             self.verifier)  # fmt: skip
        informer = Informer(self.client, RES, resync=30)
        controller = Controller("logicalvolume", reconciler.reconcile, base_backoff=0.05)
        reconciler.watch(informer, controller)
        self.tasks = [asyncio.create_task(informer.run()), asyncio.create_task(controller.run())]

    async def stop(self) -> None:
        """As a topolvm-node stopped mid-way: its parts end, its cuts stay."""
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self.verifier is not None:
            await self.verifier.stop()


@dataclass
class Env:
    kube: KubeEmulator
    client: AsyncClient
    lvmd: SocketLvmd
    nodes: list[Node] = field(default_factory=list)

    def node(self, bandwidth: int = 0) -> Node:
        node = Node(self.client, self.lvmd, bandwidth)
        node.start()
        self.nodes.append(node)
        return node

    async def volume(self, name: str, size: str, device_class: str = "") -> str:
        """A LogicalVolume made real by the node: its LV's device."""
        spec = {"name": name, "nodeName": NODE, "size": size, "deviceClass": device_class}
        await api.create(self.client, RES.from_dict({
            "apiVersion": f"{NORMAL.group}/v1", "kind": "LogicalVolume",
            "metadata": {"name": name}, "spec": spec}))  # fmt: skip

        def made() -> str:
            return str(((self.obj(name) or {}).get("status") or {}).get("volumeID") or "")

        return f"/dev/vg1/{await eventually(f'the LV of {name}', made, 30)}"

    def obj(self, name: str) -> dict[str, Any] | None:
        return self.kube.get("logicalvolumes", name, group=NORMAL.group)

    def verify_status(self, name: str) -> dict[str, Any]:
        return dict(((self.obj(name) or {}).get("status") or {}).get("verify") or {})

    async def ask(self, name: str, verify_id: str) -> None:
        await api.patch_merge(self.client, RES, name, {"spec": {"verify": {"id": verify_id}}})

    async def phase(
        self, name: str, verify_id: str, phase: str, timeout: float = 60
    ) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            st = self.verify_status(name)
            return st if st.get("id") == verify_id and st.get("phase") == phase else None

        found: dict[str, Any] = await eventually(
            f"status.verify {verify_id} {phase} of {name}", reached, timeout,
            details=lambda: str(self.verify_status(name)),
        )  # fmt: skip
        return found

    async def done(self, name: str, verify_id: str, timeout: float = 60) -> dict[str, Any]:
        """Waits for Done, having seen Cut on the way (or Done at once)."""
        seen: list[str] = []

        def ended() -> dict[str, Any] | None:
            st = self.verify_status(name)
            if st.get("id") != verify_id:
                return None
            if not seen or seen[-1] != st.get("phase"):
                seen.append(str(st.get("phase")))
            return st if st.get("phase") in ("Done", "Failed") else None

        st: dict[str, Any] = await eventually(f"status.verify {verify_id} of {name} done", ended,
                                              timeout, interval=0.01)  # fmt: skip
        assert seen[0] in ("Cut", "Done") and "Pending" not in seen, seen
        return st


@pytest.fixture
async def env(vgs: VolumeGroups, lvmd_factory: Any, kube: KubeEmulator) -> AsyncIterator[Env]:  # noqa: F811
    vgs.create("vg1", size_gib=6)
    vgs.thin_pool("vg1", "pool0", 2)
    server = await lvmd_factory([THICK, THIN])
    client = api.make_client(server=kube.url)
    lvmd = SocketLvmd(server.server.config.socket_name)
    e = Env(kube, client, lvmd)
    try:
        yield e

        def busy() -> bool:  # the last cut's removal may still run in lvmd
            return any(n.verifier.running() for n in e.nodes if n.verifier is not None)

        await eventually("the verifications ended", lambda: not busy(), 30)
    finally:
        for node in e.nodes:
            await node.stop()
        await lvmd.close()
        await client.close()


async def test_equal_content_gives_equal_digests_thin_or_thick_and_a_flipped_block_another(
    env: Env,
) -> None:
    env.node()
    thin = await env.volume("thin", "64Mi", "thin")
    thick = await env.volume("thick", "64Mi")
    for offset, length in ((0, MiB), (10 * MiB, 3 * MiB), (40 * MiB + 4096, 4096)):
        dd(thin, offset, length)  # a sparse thin volume: most of it unmapped
    dd(thick, 0, 64 * MiB, source=thin)  # the same bytes, all of them written
    expected = independent_digest(thin, 64 * MiB)

    await env.ask("thin", "m1")
    await env.ask("thick", "m1")
    for name in ("thin", "thick"):
        st = await env.done(name, "m1")
        assert st["phase"] == "Done", st
        assert st["digest"] == expected and st["sizeBytes"] == 64 * MiB
        assert st["cutTime"] and st["completionTime"]
    assert await eventually("no verification cut left", lambda: not verify_cuts(), 10)

    dd(thick, 20 * MiB, 4096)  # one block flipped
    await env.ask("thick", "m2")
    st = await env.done("thick", "m2")
    assert st["digest"] == independent_digest(thick, 64 * MiB) != expected
    assert env.verify_status("thin")["digest"] == expected  # its own id: not asked again
    assert await eventually("no verification cut left", lambda: not verify_cuts(), 10)


async def test_the_digest_is_of_the_cut_also_when_the_node_restarts_mid_read(env: Env) -> None:
    """The volume is written as soon as the node says Cut (a moved pod starts on it); the node
    stops mid-read and a new one goes on from the cut: the digest is of the content at the cut."""
    slow = env.node(bandwidth=16 * MiB)  # 4 s to read 64 MiB of data
    thick = await env.volume("pvc", "64Mi")
    dd(thick, 0, 64 * MiB)
    at_cut = independent_digest(thick, 64 * MiB)
    await env.ask("pvc", "move-1")
    cut = await env.phase("pvc", "move-1", "Cut", timeout=30)
    dd(thick, 8 * MiB, 4 * MiB)  # the pod writes
    await slow.stop()
    assert env.verify_status("pvc")["phase"] == "Cut" and verify_cuts()
    env.node()
    st = await env.done("pvc", "move-1")
    assert st["phase"] == "Done" and st["digest"] == at_cut
    assert st["cutTime"] == cut["cutTime"]  # the same cut, not one made after the restart
    assert independent_digest(thick, 64 * MiB) != at_cut
    assert await eventually("no verification cut left", lambda: not verify_cuts(), 10)


async def test_a_thick_cut_that_overflows_fails_the_verification(env: Env) -> None:
    """On a full node the thick cut is smaller than its volume; the volume changes by more than
    it holds while it is read: Failed, saying so, and the cut is removed."""
    env.node(bandwidth=16 * MiB)
    thick = await env.volume("full", "128Mi")
    dd(thick, 0, 128 * MiB)
    report = lvm("vgs", "vg1", "--reportformat", "json", "--units", "b", "--nosuffix",
                 "-o", "vg_free")  # fmt: skip
    free = int(json.loads(report)["report"][0]["vg"][0]["vg_free"])  # 64 MiB of it left:
    await env.lvmd.create_lv(pb.CreateLVRequest(name="fill", size_bytes=free - 64 * MiB))
    await env.ask("full", "m1")
    await env.phase("full", "m1", "Cut", timeout=30)
    dd(thick, 0, 64 * MiB)  # more than a quarter of the room (the cut's area) changes
    st = await env.done("full", "m1")
    assert st["phase"] == "Failed" and "overflowed" in st["message"], st
    assert not st.get("digest")
    assert await eventually("no verification cut left", lambda: not verify_cuts(), 10)


async def test_a_read_cut_is_removed_only_after_the_next_verifications_cut(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """The claims of one moved pod are asked for within a second or so, and the pod starts once
    every cut is made: a cut that is read already waits, so that the removal (an LVM change,
    and lvmd makes one at a time) does not go before the next verification's cut."""
    caplog.set_level(logging.INFO, logger="topolvm.node.verify")
    env.node()
    first = await env.volume("first", "64Mi", "thin")
    await env.volume("second", "64Mi")
    dd(first, 0, MiB)
    await env.ask("first", "m1")
    assert (await env.done("first", "m1"))["phase"] == "Done"
    await env.ask("second", "m1")
    assert (await env.done("second", "m1"))["phase"] == "Done"
    assert await eventually("no verification cut left", lambda: not verify_cuts(), 10)
    uid = (env.obj("first") or {})["metadata"]["uid"]
    told = [r.getMessage() if r.getMessage() != "removed a verification cut"
            else f"removed {r.__dict__.get('cut')}" for r in caplog.records
            if r.name == "topolvm.node.verify"]  # fmt: skip
    made = [i for i, m in enumerate(told) if m == "verification cut made"]
    assert len(made) == 2, told
    assert told.index(f"removed {verify_cut_name(uid)}") > made[1], told

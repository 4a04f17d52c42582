"""The node-to-node copy under faults, between two nodes' topolvm-node processes on real LVM
(docs/mobility.md): the receiving topolvm-node SIGKILLed, then the sending one, and the link
between the nodes cut, each in the middle of a copy in two streams: each stream goes on from its
own last checkpoint (the bytes sent say it did not start over) and the data matches. The
transfer port refuses what it must: no or a bad token, another ServiceAccount's, the right one
on the wrong node, a token a node showed another node's port (caught by a stand-in node) and
replayed, one of the audience all nodes used to share, an unknown job, a finished one; a copy
goes on while hundreds of idle and garbage connections are open at its source's port; a node
may make tokens only for itself and for transfer audiences, and none with credentials that
name no node (the chart's rules, real API server, node.ownNodeOnly off); and a source being
copied is not deleted underneath the copy.

Copies are made as the controller makes them, as LogicalVolume objects (the claims' path is
tests/test_cluster_transfer.py), and slowed by the nodes' bandwidth cap so a fault lands in
the middle."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from devtools.testbed.controlplane import TRANSFER_ACCOUNT, ControlPlane, host_address
from devtools.testbed.driver import DriverStack
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import unique
from tests.helpers import eventually
from tests.lvm_fixtures import THICK, THIN
from tests.provisioning import shared_nodes
from tests.transfer_helpers import MiB, metric
from tests.transfer_port_helpers import Crowd
from tests.transfer_token_helpers import (
    admin_review,
    as_account,
    node_pod,
    review,
    stand_in_node,
    token_rules,
)
from topolvm.constants import NORMAL
from topolvm.k8s import api
from topolvm.k8s.lvobject import CopyStatus, LogicalVolumeObject
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import csi_pb2_grpc as csi_grpc
from topolvm.transfer import client, messages
from topolvm.transfer.auth import LEGACY_AUDIENCE, NODE_NAME_KEY, audience
from topolvm.transfer.errors import ConnectionLost, Refused
from topolvm.transfer.server import HANDSHAKE_TIMEOUT

pytestmark = pytest.mark.cluster

SIZE = 128 * MiB
DATA = 96 * MiB  # random; the rest zeros
RATE = "6Mi"  # per copy, shared by its streams: a copy of DATA takes about 16 s
STREAMS = 2  # the copies here go in two streams of 64 MiB each, each resumed on its own
LV = api.logicalvolume_resource(NORMAL)


@pytest.fixture(scope="module")
def pair(
    control_plane: ControlPlane, driver: DriverStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[UmlNode]]:
    def pool(node: UmlNode) -> None:
        node.lvm("lvcreate", "-T", "vg1/pool0", "-L", "1g")

    with shared_nodes(
        control_plane, tmp_path_factory.mktemp("xfault"), "xfault", [4, 4], [THICK, THIN],
        prepare=pool,
        extra=[f"--transfer-bandwidth={RATE}", "--transfer-io-timeout=6",
               f"--transfer-streams={STREAMS}"], kubelet=False,
    ) as nodes:  # fmt: skip
        yield nodes


@pytest.fixture
async def lvs(
    control_plane: ControlPlane, pair: list[UmlNode], cluster_client: AsyncClient
) -> AsyncIterator[list[str]]:
    """Names of the LogicalVolumes the test made, deleted at its end."""
    made: list[str] = []
    yield made
    if made:
        control_plane.kubectl("delete", "logicalvolumes.topolvm.io", *made, "--wait=false",
                              check=False)  # fmt: skip

    async def gone() -> bool:
        items, _ = await api.list_all(cluster_client, LV)
        return not {o["metadata"]["name"] for o in items} & set(made)

    await eventually("the test's LogicalVolumes deleted", gone, timeout=120)


def _lv_object(
    name: str, node: str, copy_source: str = "", device_class: str = "ssd"
) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "nodeName": node, "size": str(SIZE),
                            "deviceClass": device_class}  # fmt: skip
    if copy_source:
        spec["copy"] = {"source": copy_source}
    return {"apiVersion": "topolvm.io/v1", "kind": "LogicalVolume", "metadata": {"name": name},
            "spec": spec}  # fmt: skip


async def _get(client: AsyncClient, name: str) -> LogicalVolumeObject | None:
    obj = await api.get(client, LV, name)
    return None if obj is None else LogicalVolumeObject.from_dict(obj)


async def _source(cp: ControlPlane, client: AsyncClient, node: UmlNode, made: list[str]) -> str:
    """A volume on ``node`` with DATA random bytes; its LogicalVolume's name."""
    name = unique("src")
    made.append(name)
    cp.apply(_lv_object(name, node.name))

    async def created() -> LogicalVolumeObject | None:
        lv = await _get(client, name)
        return lv if lv is not None and lv.volume_id else None

    lv = await eventually(f"{name} created", created, timeout=60)
    node.exec("dd", "if=/dev/urandom", f"of=/dev/vg1/{lv.volume_id}", "bs=1M",
              f"count={DATA // MiB}", "oflag=direct")  # fmt: skip
    return name


def _digest(node: UmlNode, uid: str) -> str:
    """The volume's SHA-256; a volume that is not there is an error, not the digest of nothing."""
    dev = f"/dev/vg1/{uid}"
    out = node.exec("sh", "-c", f"test -b {dev} && head -c {SIZE} {dev} | sha256sum").stdout
    return out.split()[0]


async def _copying(
    client: AsyncClient, name: str, past: int = 1, nodes: list[UmlNode] | None = None
) -> LogicalVolumeObject:
    """Once the copy of ``name`` persisted a checkpoint at ``past`` bytes or more."""
    seen: list[LogicalVolumeObject | None] = [None]

    async def check() -> LogicalVolumeObject | None:
        lv = seen[0] = await _get(client, name)
        cp = None if lv is None else lv.copy
        return lv if cp is not None and durable(cp) >= past else None

    def details() -> str:  # what the copy says, and the nodes' logs
        logs = "\n".join(f"{n.name}:\n{n.node_log(lines=25)}" for n in nodes or [])
        return f"copy status: {seen[0] and seen[0].copy}\n{logs}"

    result: LogicalVolumeObject = await eventually(
        f"{name} past {past}", check, timeout=120, details=details
    )
    return result


def durable(cp: CopyStatus) -> int:
    """The bytes a copy's checkpoints hold: of every part, for a copy in several streams."""
    if not cp.part_count:
        return cp.checkpoint_offset
    return sum(p.offset - p.begin for p in cp.part_checkpoints)


async def _done(client: AsyncClient, name: str, nodes: list[UmlNode]) -> LogicalVolumeObject:
    async def check() -> LogicalVolumeObject | None:
        lv = await _get(client, name)
        if lv is not None and lv.code:
            raise AssertionError(f"copy {name} failed: {lv.message}")
        return lv if lv is not None and lv.copy_done and lv.volume_id else None

    def logs() -> str:
        return "\n".join(f"{n.name}:\n{n.node_log(lines=25)}" for n in nodes)

    result: LogicalVolumeObject = await eventually(
        f"copy {name} done", check, timeout=240, details=logs
    )
    return result


async def _copy(
    cp: ControlPlane, source: str, node: UmlNode, made: list[str], device_class: str = "ssd"
) -> str:
    name = unique("copy")
    made.append(name)
    cp.apply(_lv_object(name, node.name, copy_source=source, device_class=device_class))
    return name


async def test_a_thin_copy_in_two_streams_is_sparse_where_its_source_is(
    control_plane: ControlPlane, pair: list[UmlNode], cluster_client: AsyncClient,
    lvs: list[str],
) -> None:  # fmt: skip
    """A thin source with data and holes in each stream's part (0-64 MiB and 64-128 MiB): the
    target holds its bytes, maps as much of its pool as the source does (the holes stay
    unmapped), and only the data travelled."""
    a, b = pair
    name = unique("thinsrc")
    lvs.append(name)
    control_plane.apply(_lv_object(name, a.name, device_class="thin"))

    async def created() -> LogicalVolumeObject | None:
        lv = await _get(cluster_client, name)
        return lv if lv is not None and lv.volume_id else None

    source = await eventually(f"{name} created", created, timeout=60)
    for mib in (0, 24, 40, 72, 100, 120):
        a.exec("dd", "if=/dev/urandom", f"of=/dev/vg1/{source.volume_id}", "bs=1M", "count=2",
               f"seek={mib}", "oflag=direct")  # fmt: skip
    sent_before = metric(a, "topolvm_transfer_data_bytes_total", role="sender")
    target = await _copy(control_plane, name, b, lvs, device_class="thin")
    done = await _done(cluster_client, target, pair)
    assert done.copy is not None and done.copy.part_count == STREAMS, done.copy
    assert _digest(b, done.volume_id) == _digest(a, source.volume_id)
    mapped = _mapped_share(a, source.volume_id)
    assert mapped == _mapped_share(b, done.volume_id) and 0 < mapped < 0.15, mapped
    sent = metric(a, "topolvm_transfer_data_bytes_total", role="sender") - sent_before
    assert sent == 12 * MiB, sent


def _mapped_share(node: UmlNode, uid: str) -> float:
    """The share of a thin volume its pool maps (lvs data_percent)."""
    out = node.lvm("lvs", "--noheadings", "-o", "data_percent", f"vg1/{uid}")
    return float(out.strip()) / 100


@pytest.mark.parametrize("victim", ["receiver", "sender"])
async def test_a_copy_resumes_after_either_topolvm_node_is_killed(
    control_plane: ControlPlane, pair: list[UmlNode], cluster_client: AsyncClient,
    lvs: list[str], victim: str,
) -> None:  # fmt: skip
    a, b = pair
    src = await _source(control_plane, cluster_client, a, lvs)
    sent_before = metric(a, "topolvm_transfer_data_bytes_total", role="sender")
    target = await _copy(control_plane, src, b, lvs)
    await _copying(cluster_client, target, past=16 * MiB)
    killed = b if victim == "receiver" else a
    killed.signal("topolvm-node", "SIGKILL", wait=10)
    if victim == "sender":
        sent_before = 0.0  # the new process counts from zero
    killed.respawn("topolvm-node")
    done = await _done(cluster_client, target, pair)
    source = await _get(cluster_client, src)
    assert source is not None and done.copy is not None
    assert done.copy.part_count == STREAMS, done.copy
    assert done.copy.resumed_from >= 16 * MiB, done.copy  # went on, not from zero
    assert done.copy.attempts >= 2
    assert _digest(b, done.volume_id) == _digest(a, source.volume_id)
    sent = metric(a, "topolvm_transfer_data_bytes_total", role="sender") - sent_before
    if victim == "sender":  # the restarted sender sent only what came after the checkpoint
        assert sent <= DATA - done.copy.resumed_from + 4 * MiB, (sent, done.copy)
    else:  # everything once, and again only what followed the last checkpoint
        assert sent < DATA + (DATA - 16 * MiB), (sent, done.copy)


async def test_a_copy_resumes_after_the_link_is_cut(
    control_plane: ControlPlane, pair: list[UmlNode], cluster_client: AsyncClient,
    lvs: list[str],
) -> None:  # fmt: skip
    a, b = pair
    src = await _source(control_plane, cluster_client, a, lvs)
    target = await _copy(control_plane, src, b, lvs)
    await _copying(cluster_client, target, past=16 * MiB)
    with _link_cut(a, b):
        await asyncio.sleep(10)  # longer than the I/O timeout: the connection is given up
    done = await _done(cluster_client, target, pair)
    source = await _get(cluster_client, src)
    assert source is not None and done.copy is not None and done.copy.part_count == STREAMS
    assert done.copy.resumed_from >= 16 * MiB and done.copy.attempts >= 2, done.copy
    assert _digest(b, done.volume_id) == _digest(a, source.volume_id)


@contextlib.contextmanager
def _link_cut(a: UmlNode, b: UmlNode) -> Iterator[None]:
    """No packet between the two guests (the API server stays reachable), in this namespace."""
    rules = (
        "table inet topolvm_test_cut {\n chain forwarded {\n"
        "  type filter hook forward priority 0;\n"
        f"  ip saddr {a.address} ip daddr {b.address} drop\n"
        f"  ip saddr {b.address} ip daddr {a.address} drop\n }}\n}}\n"
    )
    subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)
    try:
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "inet", "topolvm_test_cut"], check=False)


async def test_the_transfer_port_refuses_what_it_must(
    control_plane: ControlPlane, pair: list[UmlNode], cluster_client: AsyncClient,
    lvs: list[str], driver: DriverStack,
) -> None:  # fmt: skip
    a, b = pair
    cp = control_plane
    src = await _source(cp, cluster_client, a, lvs)
    target = await _copy(cp, src, b, lvs)
    lv = await _copying(cluster_client, target, past=1, nodes=pair)
    endpoint = await _endpoint(cluster_client, a)

    def ask(token: str, job: str = target, uid: str = lv.uid) -> None:
        hello = messages.Hello(version=1, token=token, job=job, job_uid=uid)
        client.receive(endpoint, hello, _nowhere(), lambda c: None, lambda *x: None,
                       threading.Event(), 10.0)  # fmt: skip

    def token(account: str, namespace: str, node: str, audience: str = audience(a.name)) -> str:
        bound = ["--bound-object-kind=Node", f"--bound-object-name={node}"]
        argv = ["create", "token", account, "-n", namespace, f"--audience={audience}", *bound]
        return cp.kubectl(*argv).strip()

    node_b = token("topolvm-node", "topolvm-system", b.name)
    cases = [
        ("not-a-token", {}, "unauthenticated"),
        (token("topolvm-node", "topolvm-system", b.name, audience="api"), {}, "unauthenticated"),
        (token("topolvm-node", "topolvm-system", a.name), {}, "forbidden"),  # the wrong node
        # the audience every node used to share (an older release's receiver): refused, saying so
        (token("topolvm-node", "topolvm-system", b.name, LEGACY_AUDIENCE), {}, "unauthenticated"),
        (node_b, {"job": "no-such-volume"}, "unknown-job"),
        (node_b, {"uid": "0b4f5c7e-1111-4222-8333-123456789abc"}, "unknown-job"),
        (token("default", "default", b.name), {}, "forbidden"),  # another ServiceAccount
        # ... which a review refused: this address gets no review for a while, for any token
        (token("topolvm-node", "topolvm-system", b.name), {}, "busy"),
    ]
    for tok, kw, reason in cases:
        with pytest.raises(Refused) as refused:
            await asyncio.to_thread(ask, tok, **kw)
        assert refused.value.reason == reason, (kw, refused.value)
    # a HELLO without a token is no HELLO: the connection ends without an answer
    with pytest.raises(ConnectionLost):
        await asyncio.to_thread(_raw_hello, endpoint, b'{"version":1,"job":"x"}')

    # the source cannot go while it is copied: the CSI call says so, and deleting the object
    # leaves the volume until the copy is done
    source = await _get(cluster_client, src)
    assert source is not None
    # read now: once the copy is done, the deletion below goes through and the volume with it
    source_digest = _digest(a, source.volume_id)
    async with grpc.aio.insecure_channel(f"unix://{driver.socket}") as channel:
        stub = csi_grpc.ControllerStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refusal:
            await stub.DeleteVolume(csi.DeleteVolumeRequest(volume_id=source.volume_id))
    assert refusal.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "source of a copy in progress" in (refusal.value.details() or "")
    cp.kubectl("delete", "logicalvolumes.topolvm.io", src, "--wait=false")

    # relaying: the token node b showed another node's port (a stand-in, whose port is this
    # test's), a real one made by b's topolvm-node with TokenRequest, good at that port only,
    # replayed at a's port for b's running copy: refused, and the copy is not disturbed
    before = await _get(cluster_client, target)
    async with stand_in_node(cp, b, lvs, _lv_object) as (other, shown):
        relayed = await asyncio.wait_for(shown, 120)
    said = await review(cluster_client, relayed, audience(other))
    assert said.get("authenticated") and said["user"]["extra"][NODE_NAME_KEY] == [b.name], said
    with pytest.raises(Refused, match="made for another node's transfer port") as refused:
        await asyncio.to_thread(ask, relayed)
    assert refused.value.reason == "unauthenticated"
    after = await _get(cluster_client, target)
    assert before is not None and before.copy is not None and after is not None
    assert after.copy is not None and after.copy.attempts == before.copy.attempts
    done = await _done(cluster_client, target, pair)
    assert _digest(b, done.volume_id) == source_digest

    async def source_gone() -> bool:
        return await _get(cluster_client, src) is None

    await eventually("the source removed once the copy is done", source_gone, timeout=60)
    # the job is finished: asking for it again is a replay
    with pytest.raises(Refused) as replayed:
        await asyncio.to_thread(ask, node_b)
    assert replayed.value.reason == "replayed"
    assert metric(a, "topolvm_transfer_refusals_total", reason="forbidden") >= 2


async def test_a_copy_goes_on_while_its_source_port_is_crowded(
    control_plane: ControlPlane, pair: list[UmlNode], cluster_client: AsyncClient,
    lvs: list[str],
) -> None:  # fmt: skip
    """Issue 39: 200 idle and 200 garbage connections at the source's port while a copy runs:
    the copy finishes with the source's data, and the idle ones are closed within the deadline
    that runs from accept (most at once: one address may connect only so often)."""
    a, b = pair
    src = await _source(control_plane, cluster_client, a, lvs)
    target = await _copy(control_plane, src, b, lvs)
    started = await _copying(cluster_client, target, past=1, nodes=pair)
    endpoint = await _endpoint(cluster_client, a)
    assert started.copy is not None
    dropped = "topolvm_transfer_connections_dropped_total"
    before = {r: metric(a, dropped, reason=r) for r in ("peer-limit", "handshake", "rate")}
    # a crowd at a's port while the copy runs: 200 idle connections from the host's address
    # on a's link (a's port holds 8 of them until the deadline, closes the rest at once: past
    # the address's rate at accept, or its oldest waiting one) and 200 garbage ones, again and
    # again, from its address on b's link
    idle, garbage = [host_address(a.index)] * 200, [host_address(b.index)] * 200
    async with Crowd(endpoint, idle, garbage) as crowd:
        # the copy goes on meanwhile: its streams' checkpoints come together every 5 s, 15 MiB
        # each at the cap: 24 MiB more is the next round of both, or the next two of one
        await _copying(cluster_client, target, past=durable(started.copy) + 24 * MiB)
    assert len(crowd.lived) == 200 and max(crowd.lived) < HANDSHAKE_TIMEOUT + 3, crowd.lived
    assert crowd.garbage_sent >= 200
    done = await _done(cluster_client, target, pair)
    source = await _get(cluster_client, src)
    assert source is not None and _digest(b, done.volume_id) == _digest(a, source.volume_id)
    closed_at_once = sum(metric(a, dropped, reason=r) - before[r] for r in ("peer-limit", "rate"))
    assert closed_at_once >= 192 + 50, closed_at_once  # the idle crowd's, and garbage's
    assert metric(a, dropped, reason="handshake") - before["handshake"] >= 10


async def test_a_node_makes_tokens_only_for_itself_and_for_transfer_audiences(
    control_plane: ControlPlane, pair: list[UmlNode]
) -> None:
    """The chart's rules for the tokens topolvm-node makes (its Role and the policy rendered
    with it), on the real API server, with node.ownNodeOnly off: as its pod on node b, it may
    make a token bound to that pod, or to Node b, for a transfer audience; not one bound to
    another node's pod or Node (which would name that node), not one for the API server, no
    token of another account, and none at all with credentials that name no node (a token of
    its account bound to nothing)."""
    a, b = pair
    cp = control_plane
    namespace, account = TRANSFER_ACCOUNT
    mine, theirs = unique("node-pod"), unique("node-pod")
    cp.apply(node_pod(mine, b.name), node_pod(theirs, a.name))
    try:
        uid = json.loads(cp.kubectl("get", "pod", mine, "-n", namespace, "-o", "json"))
        bound = [f"--bound-object-name={mine}", f"--bound-object-uid={uid['metadata']['uid']}"]
        pod_token = cp.kubectl("create", "token", account, "-n", namespace,
                               "--bound-object-kind=Pod", *bound).strip()  # fmt: skip
        with token_rules(cp):
            as_pod = as_account(cp, pod_token, mine)

            def make(kind: str, name: str, aud: str, who: str = account) -> Any:
                bind = [f"--bound-object-kind={kind}", f"--bound-object-name={name}"]
                return as_pod("create", "token", who, "-n", namespace, f"--audience={aud}", *bind)

            async def denied_other_pod() -> bool:  # the policy takes a moment to apply
                res = make("Pod", theirs, audience(a.name))
                return res.returncode != 0 and "may make tokens bound to its own pod" in res.stderr

            await eventually("the policy denies another pod's binding", denied_other_pod, 60)
            for kind, name in (("Pod", mine), ("Node", b.name)):
                made = make(kind, name, audience(a.name))
                assert made.returncode == 0, made.stderr
                said = admin_review(cp, made.stdout.strip(), audience(a.name))
                assert said["user"]["extra"][NODE_NAME_KEY] == [b.name], said
            for kind, name, aud in (("Node", a.name, audience(a.name)),
                                    ("Pod", mine, "https://kubernetes.default.svc")):  # fmt: skip
                refused = make(kind, name, aud)
                assert refused.returncode != 0, (kind, name, aud)
                assert "may make tokens bound to its own pod" in refused.stderr, refused.stderr
            other = make("Pod", mine, audience(a.name), who="default")
            assert other.returncode != 0 and "forbidden" in other.stderr.lower(), other.stderr
            unbound = cp.kubectl("create", "token", account, "-n", namespace).strip()
            as_nobody = as_account(cp, unbound, "unbound")
            for kind, name in (("Node", b.name), ("Pod", mine)):
                bind = [f"--bound-object-kind={kind}", f"--bound-object-name={name}"]
                refused = as_nobody("create", "token", account, "-n", namespace,
                                    f"--audience={audience(a.name)}", *bind)  # fmt: skip
                assert refused.returncode != 0, (kind, refused.stdout)
                assert "credentials that name its node" in refused.stderr, refused.stderr
    finally:
        cp.kubectl("delete", "pod", mine, theirs, "-n", namespace, "--wait=false", check=False)


async def _endpoint(client_: AsyncClient, node: UmlNode) -> client.Endpoint:
    obj = await api.get(client_, Node, node.name)
    assert obj is not None
    ann = obj["metadata"]["annotations"]
    host, port = ann[NORMAL.transfer_endpoint_annotation].rsplit(":", 1)
    return client.Endpoint(node.name, host, int(port), ann[NORMAL.transfer_cert_annotation])


def _nowhere() -> Any:
    from topolvm.transfer.jobs import VolumeInfo

    return VolumeInfo("/dev/null", SIZE, False, 0, "")


def _raw_hello(endpoint: client.Endpoint, payload: bytes) -> None:
    from topolvm.transfer import wire

    conn = client.connect(endpoint, 10.0)
    try:
        conn.send(wire.control(wire.Kind.HELLO, payload))
        conn.recv_message(messages.Accept)
    finally:
        conn.close()

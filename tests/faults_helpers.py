"""What the fault tests (tests/test_cluster_faults*.py) share: StorageClasses pinned to the
test's nodes, waits that survive an API server going away, "Bound, or an Event that names the
cause", and the check that no driver process needed a restart."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc
from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolume

from devtools.testbed.driver import DriverStack
from devtools.testbed.process import http_get
from devtools.testbed.umlnode import UmlNode
from tests.chaos_helpers import observe
from tests.cluster_fixtures import unique
from tests.helpers import eventually
from tests.invariants import DeviceClass, violations
from tests.provisioning import Scenario, events_for, pvc, storage_class
from topolvm.constants import NORMAL
from topolvm.k8s import api
from topolvm.k8s.errors import KubeError
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import csi_pb2_grpc as csi_grpc

NODE_ARGV = "topolvm --log-format text node"  # how topolvm-node's command line reads


def pinned_class(
    s: Scenario, nodes: Sequence[UmlNode], device_class: str = "ssd", binding: str = "Immediate"
) -> str:
    """A StorageClass whose volumes go to ``nodes`` only (``allowedTopologies``): other tests'
    nodes may exist in the session; with Immediate binding a claim needs no pod."""
    name = unique("sc")
    obj = storage_class(name, device_class, "xfs", binding=binding)
    obj["allowedTopologies"] = [{"matchLabelExpressions": [
        {"key": NORMAL.topology_key, "values": [n.name for n in nodes]}]}]  # fmt: skip
    s.apply(obj)
    return name


async def phase(client: AsyncClient, name: str) -> str:
    """The claim's phase; "" while it or the API server is not there."""
    try:
        obj = await pvc(client, name)
    except KubeError:
        return ""
    return str(((obj or {}).get("status") or {}).get("phase") or "")


async def claim_events(client: AsyncClient, name: str) -> list[str]:
    """The claim's events ("reason: message"); [] while the API server is not there."""
    try:
        return await events_for(client, "PersistentVolumeClaim", name)
    except KubeError:
        return []


async def all_bound(
    client: AsyncClient, claims: Sequence[str], timeout: float, details: Callable[[], str] = str
) -> None:
    """Until every claim is Bound; on timeout the failure lists each one that is not, with the
    events Kubernetes recorded for it."""
    left = list(claims)

    async def check() -> bool:
        for name in list(left):
            if await phase(client, name) == "Bound":
                left.remove(name)
        return not left

    try:
        await eventually(f"{len(claims)} claims Bound", check, timeout=timeout, interval=0.5)
    except AssertionError as exc:
        lines = [f"{n}: {await claim_events(client, n)}" for n in left[:5]]
        raise AssertionError(f"{exc}\nnot Bound: {len(left)}\n" + "\n".join(lines)
                             + f"\n{details()}") from None  # fmt: skip


async def event_naming(client: AsyncClient, claim: str, *words: str, timeout: float = 90) -> str:
    """The first event of the claim whose text has every one of ``words``: a claim that cannot
    be provisioned must say why, and soon."""
    seen: list[str] = []

    async def check() -> str | None:
        seen[:] = await claim_events(client, claim)
        return next((e for e in seen if all(w in e for w in words)), None)

    found: str = await eventually(f"an event of {claim} naming {words}", check, timeout=timeout,
                                  interval=0.5, details=lambda: f"events: {seen[-4:]}")  # fmt: skip
    return found


async def settle(
    client: AsyncClient, nodes: Sequence[UmlNode], classes: list[DeviceClass],
    storage_classes: dict[str, str], timeout: float = 180, details: Callable[[], str] = str,
) -> tuple[float, str]:  # fmt: skip
    """Wait until every invariant holds (as chaos_helpers.settled does); the seconds it took,
    and what was the last to hold ("" if all held at once), for the summary."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    last: list[str] = []
    slowest = ""

    async def holds() -> bool:
        nonlocal last, slowest
        last = violations(await observe(client, list(nodes), classes, storage_classes))
        if last:
            slowest = f"{last[0]} ({loop.time() - start:.0f}s)"
        return not last

    await eventually("every invariant to hold", holds, timeout=timeout, interval=1,
                     details=lambda: "\n  ".join(["still broken:", *last, details()]))  # fmt: skip
    return loop.time() - start, slowest


def cause(event: str, limit: int = 220) -> str:
    """What an event of csi-provisioner says the driver answered (after ``desc =``), short."""
    text = event.split("desc = ", 1)[-1]
    return text if len(text) <= limit else text[: limit - 3] + "..."


async def pv_size(client: AsyncClient, claim: str) -> str:
    obj = await pvc(client, claim)
    pv = await api.get(client, PersistentVolume, ((obj or {}).get("spec") or {}).get("volumeName")
                       or "-")  # fmt: skip
    return str(((pv or {}).get("spec") or {}).get("capacity", {}).get("storage") or "")


def node_pid(node: UmlNode) -> str:
    """topolvm-node's PID in the guest ("" if it does not run)."""
    return node.exec("pgrep", "-f", NODE_ARGV, check=False).stdout.strip()


def processes(driver: DriverStack, nodes: Sequence[UmlNode]) -> dict[str, str]:
    """The PID of topolvm-controller and of each node's topolvm-node."""
    ctl = driver.children["topolvm-controller"].proc
    return {"topolvm-controller": str(ctl.pid if ctl else ""),
            **{n.name: node_pid(n) for n in nodes}}  # fmt: skip


async def still_serving(driver: DriverStack, nodes: Sequence[UmlNode]) -> None:
    """The controller ready and each node answering CSI, as before the fault."""
    readyz = http_get(f"http://127.0.0.1:{driver.health_port}/readyz")
    assert readyz == b"ok", f"topolvm-controller /readyz: {readyz!r}"
    for n in nodes:
        async with grpc.aio.insecure_channel(n.csi_target) as ch:
            await csi_grpc.IdentityStub(ch).Probe(csi.ProbeRequest(), timeout=10)


def sidecars(driver: DriverStack) -> str:
    return ", ".join(f"{n} {'running' if c.running() else 'EXITED'}"
                     for n, c in driver.children.items())  # fmt: skip


@contextlib.contextmanager
def controller_with_kubeconfig(driver: DriverStack, kubeconfig: Path) -> Iterator[None]:
    """The session's topolvm-controller restarted with ``kubeconfig`` (its sidecars with it,
    as after a crash); afterwards restarted with the control plane's own again."""
    driver.stop_controller(sidecars=True)
    driver.controller_kubeconfig = kubeconfig
    try:
        driver.restart_after_crash()
        yield
    finally:
        driver.stop_controller(sidecars=True)
        driver.controller_kubeconfig = None
        driver.restart_after_crash()


def logs(driver: DriverStack, nodes: Sequence[UmlNode], lines: int = 15) -> str:
    """The last lines of the controller's log and of each node's, for a failure message."""
    ctl = driver.log("topolvm-controller").read_text(errors="replace").splitlines()[-lines:]
    parts = ["topolvm-controller:", *ctl]
    for n in nodes:
        parts += [f"{n.name}:", n.node_log(lines=lines)]
    return "\n".join(parts)

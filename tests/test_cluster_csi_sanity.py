"""The real csi-sanity (kubernetes-csi/csi-test v5.6.0) against topolvm-controller's CSI socket
on the host and topolvm-node's in a UML guest with real LVM, once for a thick and once for a
thin device class, as upstream's e2e suite does last (spec §13 "CSI sanity"; the cases and
their skips are in docs/csi-sanity.md).

csi-sanity's publish and staging folders live in the guest: its path commands reach the guest
through the agent (devtools/testbed/guestpath.py). Volumes land on the guest because no other
Node has as much capacity in the device class (checked before the run).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from devtools import gobuild
from devtools.testbed import guestpath
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.process import die_with_parent
from devtools.testbed.umlnode import AGENT_PORT, UmlNode
from tests.cluster_fixtures import node_annotations
from tests.helpers import eventually
from tests.lvm_fixtures import THICK, THIN
from tests.provisioning import GiB, shared_nodes
from topolvm.constants import NORMAL
from topolvm.k8s import api

pytestmark = pytest.mark.cluster

STATUSES = ("passed", "skipped", "pending")
SANITY_TIMEOUT = 1200  # seconds for one whole csi-sanity run
# Guest folders for csi-sanity's NodePublish target parent and (unused: no STAGE_UNSTAGE)
# staging folder, made and removed around every case.
MOUNT_DIR = "/run/csi-sanity/mount"
STAGING_DIR = "/run/csi-sanity/staging"
# Upstream skips the snapshot and clone cases for thick LVM (test/e2e/sanity_test.go): there
# they need a thin pool. Here a thick snapshot or clone is a copy (docs/mobility.md), and they run.


MUTABLE_PARAMETERS = {"topolvm.io/write-iops": "1000", "qosBandwithReadPerSec": "100Mi"}


@dataclass(frozen=True)
class Case:
    device_class: str
    parameters: dict[str, str]
    # As docs/csi-sanity.md lists them; "pending" is csi-sanity's one disabled case (XIt).
    passed: int
    skipped: int
    pending: int = 1
    skip: str | None = None


CASES = {
    "thick": Case(THICK["name"], {NORMAL.device_class_param: THICK["name"]}, passed=60, skipped=42),
    "thin": Case(
        THIN["name"], {NORMAL.device_class_param: THIN["name"], "csi.storage.k8s.io/fstype": "xfs"},
        passed=60, skipped=42,
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def sanity_node(
    control_plane: ControlPlane, driver: DriverStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[UmlNode]:
    """One UML node for the module: vg1 (12 GiB) with thin pool0 (4 GiB), topolvm-node running
    with device classes ssd (thick, default) and thin."""

    def thin_pool(node: UmlNode) -> None:
        node.lvm("lvcreate", "-T", "vg1/pool0", "-L", f"{4 * GiB}b", "-y")

    with shared_nodes(
        control_plane, tmp_path_factory.mktemp("sanity"), "sanity", [12], [THICK, THIN],
        prepare=thin_pool,
    ) as [node]:  # fmt: skip
        yield node


@dataclass
class Result:
    name: str
    status: str  # passed, failed, skipped, ...
    message: str


def read_report(path: Path) -> list[Result]:
    """The cases (``It``) of a Ginkgo JUnit report."""
    results = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        if not name.startswith("[It] "):
            continue  # suite-level nodes
        detail = next(iter(case), None)
        message = "" if detail is None else (detail.get("message") or detail.text or "")
        results.append(Result(name.removeprefix("[It] "), case.get("status", ""), message))
    return results


async def run(argv: list[str], timeout: float) -> tuple[int, str]:
    """(exit status, combined output); the process group is killed on timeout."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = await proc.communicate()
        return -1, out.decode(errors="replace") + f"\n(test: csi-sanity killed after {timeout}s)"
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


async def capacities(client: AsyncClient, key: str) -> dict[str, int]:
    """Every Node's capacity annotation ``key`` (Nodes without it left out)."""
    nodes, _ = await api.list_all(client, Node)
    out = {}
    for n in nodes:
        value = (n["metadata"].get("annotations") or {}).get(key)
        if value is not None:
            out[n["metadata"]["name"]] = int(value)
    return out


@pytest.mark.parametrize("name", list(CASES))
async def test_csi_sanity_passes(
    name: str,
    sanity_node: UmlNode,
    driver: DriverStack,
    cluster_client: AsyncClient,
    tmp_path: Path,
) -> None:
    case, node = CASES[name], sanity_node
    dc = case.device_class
    key = f"{NORMAL.capacity_prefix}{dc}"

    # CreateVolume without topology goes to the node with the most capacity: ours must be it.
    async def annotated() -> dict[str, int] | None:
        found = await capacities(cluster_client, key)
        return found if found.get(node.name, 0) > 0 else None

    found = await eventually(f"annotation {key} on {node.name}", annotated, timeout=120)
    others = {n: c for n, c in found.items() if n != node.name and c >= found[node.name]}
    assert not others, f"other Nodes have at least as much {dc} capacity as {node.name}: {found}"
    before = {
        k: v
        for k, v in (await node_annotations(cluster_client, node.name)).items()
        if k.startswith(NORMAL.capacity_prefix)
    }

    node.exec("mkdir", "-p", str(Path(MOUNT_DIR).parent), str(Path(STAGING_DIR).parent))
    cmds = guestpath.write_commands(tmp_path / "bin", f"{node.address}:{AGENT_PORT}")
    params = tmp_path / "parameters.yaml"
    params.write_text(yaml.safe_dump(case.parameters))
    mutable = tmp_path / "mutable-parameters.yaml"  # a VolumeAttributesClass's (docs/qos.md)
    mutable.write_text(yaml.safe_dump(MUTABLE_PARAMETERS))
    report = tmp_path / "junit.xml"
    argv = [
        str(gobuild.ensure("csi-sanity")["csi-sanity"]),
        f"--csi.endpoint=dns:///{node.csi_target}",
        f"--csi.controllerendpoint=unix://{driver.socket}",
        f"--csi.mountdir={MOUNT_DIR}", f"--csi.stagingdir={STAGING_DIR}",
        f"--csi.createmountpathcmd={cmds['mkdir']}",
        f"--csi.createstagingpathcmd={cmds['mkdir']}",
        f"--csi.removemountpathcmd={cmds['rmdir']}",
        f"--csi.removestagingpathcmd={cmds['rmdir']}",
        f"--csi.checkpathcmd={cmds['check']}",
        f"--csi.testvolumesize={GiB}",
        f"--csi.testvolumeparameters={params}",
        f"--csi.testvolumemutableparameters={mutable}",
        f"--ginkgo.junit-report={report}",
        "--ginkgo.no-color", "--ginkgo.v",
        f"--ginkgo.timeout={SANITY_TIMEOUT - 60}s",
        *([f"--ginkgo.skip={case.skip}"] if case.skip else []),
    ]  # fmt: skip
    rc, output = await run(argv, SANITY_TIMEOUT)
    (tmp_path / "csi-sanity.log").write_text(output)
    results = read_report(report) if report.exists() else []

    lv_res = api.logicalvolume_resource(NORMAL)
    lvs, _ = await api.list_all(cluster_client, lv_res)
    left_objects = [o["metadata"]["name"] for o in lvs if o["spec"].get("nodeName") == node.name]
    left_lvs = sorted(set(node.lvs("vg1")) - {"pool0"})

    failed = [r for r in results if r.status not in STATUSES]
    tail = "\n".join(output.splitlines()[-80:])
    failures = "\n".join(f"- {r.name} [{r.status}]: {r.message[:600]}" for r in failed)
    ok = rc == 0 and bool(results) and not failed
    assert ok, (
        f"csi-sanity ({dc}) exited {rc}; {len(failed)} of {len(results)} cases failed:\n"
        f"{failures}\nLogicalVolumes left: {left_objects}; LVs left: {left_lvs}\n"
        f"topolvm-node log:\n{node.node_log()}\n"
        f"csi-sanity output ({tmp_path / 'csi-sanity.log'}), last lines:\n{tail}"
    )
    by_status = {s: [r.name for r in results if r.status == s] for s in STATUSES}
    counts = tuple(len(by_status[s]) for s in STATUSES)
    assert counts == (case.passed, case.skipped, case.pending), (
        f"{dc}: {counts} {STATUSES}, docs/csi-sanity.md lists "
        f"{(case.passed, case.skipped, case.pending)}. Passed: {by_status['passed']}"
    )
    assert not left_objects, f"LogicalVolumes left on {node.name}: {left_objects}"
    assert not left_lvs, f"LVs left in vg1 on {node.name}: {left_lvs}"

    async def restored() -> bool:
        now = await node_annotations(cluster_client, node.name)
        return {k: v for k, v in now.items() if k.startswith(NORMAL.capacity_prefix)} == before

    await eventually("capacity annotations as before csi-sanity", restored, timeout=60)

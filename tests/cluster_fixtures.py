"""Fixtures for the real-control-plane tier (tests marked ``cluster``).

The session's pytest process moves into a private network namespace before the first such test
(``pytest_collection_modifyitems`` in conftest.py), so the control plane's fixed ports and the
UML nodes' TAP links exist only there and vanish with the process.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import yaml
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, Pod

from devtools import gobuild
from devtools.testbed.bed import CLUSTER_BINARIES, Testbed
from devtools.testbed.chart import Release
from devtools.testbed.controlplane import GUEST_SUBNETS, ControlPlane
from devtools.testbed.driver import SIDECAR_BINARIES, DriverStack, csidriver
from devtools.testbed.process import Child, http_get
from devtools.testbed.umlnode import UmlNode
from topolvm.k8s import api
from topolvm.k8s.api import make_client

EXTENDER_PORTS = {"topolvm-extender": 9251, "topolvm-marker": 9252, "topolvm-nodecache": 9253}
GROUP_LABEL = "topolvm.test/group"  # pods select their test's nodes with it
_stats: dict[str, float] = {}
_lines: list[str] = []


def peak_rss_mib(pid: int) -> float:
    """VmHWM (peak resident set) of a live process, in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler for the whole session."""
    folder = tmp_path_factory.mktemp("controlplane")
    bed = Testbed(folder, gobuild.ensure(*CLUSTER_BINARIES))
    cp = bed.start_control_plane(folder)
    _stats["start_seconds"] = cp.started_in
    try:
        yield cp
    finally:
        _stats["peak_rss_mib"] = sum(
            peak_rss_mib(c.proc.pid) for c in cp.children.values() if c.proc is not None
        )
        bed.teardown()


def record_stat(name: str, value: float) -> None:
    """A measurement for the end-of-session summary (see :func:`report_stats`)."""
    _stats[name] = value


def record_line(text: str) -> None:
    """A finished report (say, the chaos campaign's) for the end-of-session summary."""
    _lines.append(text)


def report_stats() -> str | None:
    if not _stats:
        return None
    line = (
        f"real control plane: started in {_stats.get('start_seconds', 0):.1f}s, "
        f"peak RSS of its processes {_stats.get('peak_rss_mib', 0):.0f} MiB (sum of VmHWM)"
    )
    if "doctor_scale_seconds" in _stats:
        line += (
            f"\ntopolvm doctor on 1000 nodes, 5000 PVCs, 2500 pods: "
            f"{_stats['doctor_scale_seconds']:.2f}s (whole process; its own reading "
            f"{_stats['doctor_scale_reported']:.2f}s)"
        )
    return "\n".join([line, *_lines])


@pytest.fixture
async def cluster_client(control_plane: ControlPlane) -> AsyncIterator[AsyncClient]:
    """A lightkube client with the admin kubeconfig."""
    client = make_client(str(control_plane.kubeconfig))
    try:
        yield client
    finally:
        await client.close()


_free_indices = list(range(1, GUEST_SUBNETS + 1))


def short_name(request: pytest.FixtureRequest) -> str:
    """A DNS-label-safe prefix unique to the test, for cluster-scoped object names."""
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:30].strip("-")
    return f"{base}-{os.getpid() % 1000}"


UmlNodes = Callable[..., list[UmlNode]]


class NodeSet:
    """UML nodes registered with the control plane, each with VG ``vg1`` on its first disk and
    the label ``topolvm.test/group=<prefix>``; :meth:`close` stops topolvm-node, deletes the
    Node objects and the LogicalVolumes on them, and removes the guests and their TAP links."""

    def __init__(self, cp: ControlPlane, prefix: str, workdir: Path) -> None:
        self.cp, self.prefix = cp, prefix
        self.bed = Testbed(workdir, cp.bins, cp=cp, node_dir=workdir, before_node_stop=self._forget)

    def make(
        self, count: int = 1, vg_gib: list[float] | None = None, disks: int = 2,
        disk_gib: int = 16, kubelet: bool = False, driver_images: bool = False,
    ) -> list[UmlNode]:  # fmt: skip
        """With ``kubelet``, real Kubernetes nodes (devtools/testbed/kubenode.py) that run the
        test's pods; ``driver_images`` puts the project's and the sidecars' images there too."""
        sizes = vg_gib or [10.0] * count
        made = []
        for i in range(count):
            if not _free_indices:
                raise RuntimeError(f"at most {GUEST_SUBNETS} UML nodes at once")
            name = f"{self.prefix}-n{len(self.bed.nodes) + 1}"
            node = self.bed.start_node(name, _free_indices.pop(0), sizes[i],
                                       disks=(disk_gib << 30,) * disks,
                                       labels={GROUP_LABEL: self.prefix}, kubelet=kubelet,
                                       driver_images=driver_images)  # fmt: skip
            made.append(node)
        return made

    def _forget(self, node: UmlNode) -> None:
        """The cluster's objects of a node whose topolvm-node is stopped."""
        cp = self.cp
        # pods left on it (a failed test's) would stay Terminating without their kubelet
        cp.kubectl("delete", "pods", "-A", f"--field-selector=spec.nodeName={node.name}",
                   "--force", "--grace-period=0", "--wait=false", check=False)  # fmt: skip
        cp.kubectl("delete", "node", node.name, "--wait=false", check=False)
        cp.kubectl("delete", "csinode", node.name, "--wait=false", check=False)
        _drop_finalizers(cp, "node", node.name)
        for group in ("logicalvolumes.topolvm.io", "logicalvolumes.topolvm.cybozu.com"):
            _delete_lvs_on(cp, group, node.name)

    def close(self) -> None:
        """Every step runs for every node, whatever an earlier one raised; the first error is
        raised at the end."""
        indices = [node.index for node in self.bed.nodes]
        try:
            self.bed.teardown()
        finally:
            _free_indices.extend(indices)


@pytest.fixture
def uml_nodes(
    control_plane: ControlPlane, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[UmlNodes]:
    """``uml_nodes(count, vg_gib=[...])`` boots UML nodes for this test (see :class:`NodeSet`)."""
    nodes = NodeSet(control_plane, short_name(request), tmp_path)
    try:
        yield nodes.make
    finally:
        nodes.close()


def _drop_finalizers(cp: ControlPlane, kind: str, name: str) -> None:
    cp.kubectl(
        "patch", kind, name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False
    )


def _delete_lvs_on(cp: ControlPlane, group: str, node: str) -> None:
    out = cp.kubectl("get", group, "-o", "yaml", check=False)
    for item in (yaml.safe_load(out) or {}).get("items", []):
        if item["spec"].get("nodeName") == node:
            name = item["metadata"]["name"]
            cp.kubectl("delete", group, name, "--wait=false", check=False)
            _drop_finalizers(cp, group, name)


@pytest.fixture(scope="session")
def extenders(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Child]]:
    """``topolvm scheduler`` in each mode, each behind its own kube-scheduler process, chosen by
    the pod's ``schedulerName``: ``topolvm-extender`` is the default mode (every pod is sent),
    ``topolvm-marker`` upstream's marker-resource mode, ``topolvm-nodecache`` the
    nodeCacheCapable mode fed by a Node watch on the real API server. The kube-scheduler
    stanzas come from ``topolvm scheduler print-config``."""
    folder = tmp_path_factory.mktemp("extenders")
    started: dict[str, Child] = {}
    try:
        for profile, port in EXTENDER_PORTS.items():
            marker = {
                "topolvm-marker": ["--managed-resource"],
                "topolvm-nodecache": ["--node-cache"],
            }.get(profile, [])
            watch = [f"--kubeconfig={control_plane.kubeconfig}"] if "--node-cache" in marker else []
            child = Child(
                profile,
                [sys.executable, "-m", "topolvm", "--log-format", "text", "scheduler",
                 f"--listen=127.0.0.1:{port}", *marker, *watch],
                folder / f"{profile}.log",
            ).start()  # fmt: skip
            started[profile] = child
            status = f"http://127.0.0.1:{port}/status"
            child.wait_until("serving /status", lambda url=status: http_get(url) != b"")  # type: ignore[misc]
            stanza = subprocess.run(
                [sys.executable, "-m", "topolvm", "scheduler", "print-config", "--extender-only",
                 f"--url=http://127.0.0.1:{port}", "--weight=100", *marker],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            control_plane.start_scheduler(profile, yaml.safe_load(stanza))
        yield started
    finally:
        for profile in EXTENDER_PORTS:
            control_plane.stop_scheduler(profile)
        for child in started.values():
            child.stop()


@pytest.fixture(scope="session")
def driver(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DriverStack]:
    """``topolvm controller`` on the host with the real csi-provisioner (``--enable-capacity``),
    csi-resizer, csi-snapshotter and snapshot-controller, and the CSIDriver ``topolvm.io``."""
    folder = tmp_path_factory.mktemp("driver")
    bed = Testbed(folder, gobuild.ensure(*SIDECAR_BINARIES), cp=control_plane)
    stack = bed.start_driver(folder=folder)
    _RUNNING_DRIVERS.append(stack)
    try:
        yield stack
    finally:
        _RUNNING_DRIVERS.remove(stack)
        bed.teardown()


_RUNNING_DRIVERS: list[DriverStack] = []


@contextlib.contextmanager
def session_controller_paused() -> Iterator[None]:
    """Stop the session's topolvm-controller and its CSI sidecars, if they run, for a test of
    behaviour that they would change (node-deletion cleanup deleting the test's LogicalVolumes,
    csi-snapshotter acting on the test's VolumeSnapshotContents); starts them again afterwards.
    Starts nothing when no driver runs."""
    stacks = [s for s in _RUNNING_DRIVERS if "topolvm-controller" in s.children]
    for stack in stacks:
        stack.stop_controller(sidecars=True)
    try:
        yield
    finally:
        for stack in stacks:
            stack.restart_after_crash()


@contextlib.contextmanager
def chart_release(
    control_plane: ControlPlane, driver: DriverStack, prefix: str
) -> Iterator[Release]:
    """A release of charts/topolvm (not yet installed) in a namespace of its own, while the
    session's controller and sidecars are paused. At the end it is uninstalled (leave its nodes
    running until then, so that their kubelets stop its pods), the namespace deleted and the
    session's CSIDriver, which the release takes over (``--take-ownership``), given back."""
    release = Release(control_plane, unique("tl"), unique(prefix))
    with session_controller_paused():
        try:
            yield release
        finally:
            try:
                release.uninstall()
                control_plane.kubectl("delete", "namespace", release.namespace, "--wait=false")
            finally:
                control_plane.apply(csidriver(driver.plugin))


async def node_annotations(client: AsyncClient, node: str) -> dict[str, str]:
    """The Node's annotations ({} if it has none or does not exist)."""
    obj = await api.get(client, Node, node)
    return dict(((obj or {}).get("metadata") or {}).get("annotations") or {})


async def pod_node(client: AsyncClient, pod: str, namespace: str = "default") -> str | None:
    """The node a pod is bound to, or None while it is not scheduled."""
    obj = await api.get(client, Pod, pod, namespace=namespace)
    node = (obj or {}).get("spec", {}).get("nodeName")
    return str(node) if node else None


_names = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}-{int(time.time()) % 100000}-{next(_names)}"

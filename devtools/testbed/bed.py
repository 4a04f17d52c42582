"""One test bed as every user of it assembles one (``make demo``, ``python -m devtools.cluster``,
the cluster tier's fixtures, ``bench.controller_bench``): the control plane, UML guests with a VG
``vg1`` registered as Nodes (optionally running ``topolvm node``), the driver's cluster side
(devtools/testbed/driver.py), add-on processes, and one teardown that stops what the bed started,
last started first, each part whatever the others raise.

The caller is already in a private network namespace (``process.enter_private_netns`` or
``ip netns exec``): the control plane's fixed ports and the guests' TAP links live there. A bed
may share a control plane that another started (``cp=``, the fixtures' session-wide one): it
then neither starts nor stops it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from devtools import gobuild, nodeimages
from devtools.testbed import systemdisk
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack, apply_snapshot_crds, snapshot_controller_argv
from devtools.testbed.kubenode import NODE_BINARIES, KubeNode, pod_subnet
from devtools.testbed.process import Child, HarnessError
from devtools.testbed.umlnode import UmlNode

CLUSTER_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                    "kubectl")  # fmt: skip
VG = "vg1"
THICK = {"name": "ssd", "volume-group": VG, "default": True, "spare-gb": 1}
"""The one thick device class on ``vg1`` that ``topolvm node`` gets unless a caller says else."""
KUBE_NODE_MEM_MB = 1536  # the kubelet, containerd, kube-proxy and the pods, with room


@dataclass
class Testbed:
    """``workdir`` holds ``controlplane/``, ``nodes/`` (``node_dir``), ``driver/`` and
    ``logs/`` (add-ons); ``bins`` maps the Go binaries' names to their paths.

    ``before_node_stop(node)`` runs at teardown for every guest after its ``topolvm node`` is
    stopped and before the guest is: to delete its Node objects, say, or keep its logs."""

    __test__ = False  # not a pytest test class, in whatever module imports it

    workdir: Path
    bins: dict[str, Path]
    cp: ControlPlane | None = None
    node_dir: Path | None = None
    before_node_stop: Callable[[UmlNode], None] | None = None
    nodes: list[UmlNode] = field(default_factory=list)
    driver: DriverStack | None = None
    kubes: dict[str, KubeNode] = field(default_factory=dict)  # node name -> its Kubernetes side
    _stops: list[tuple[str, Callable[[], None]]] = field(default_factory=list, repr=False)

    @property
    def kube(self) -> ControlPlane:
        if self.cp is None:
            raise HarnessError("the test bed has no control plane")
        return self.cp

    def node(self, name: str) -> UmlNode:
        return next(n for n in self.nodes if n.name == name)

    def __enter__(self) -> Testbed:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.teardown()

    # --- start --------------------------------------------------------------------------

    def start_control_plane(self, folder: Path | None = None, crds: bool = True) -> ControlPlane:
        """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and (with ``crds``) the
        LogicalVolume CRDs (devtools/testbed/controlplane.py), in ``folder``
        (``workdir/controlplane``)."""
        self.cp = ControlPlane(folder or self.workdir / "controlplane", self.bins).start(crds)
        self.defer("control plane", self._stop_control_plane)
        return self.cp

    def start_node(
        self,
        name: str,
        index: int,
        vg_gib: float,
        *,
        disks: tuple[int, ...] = UmlNode.disks,
        labels: dict[str, str] | None = None,
        device_classes: list[dict[str, Any]] | None = None,
        kubelet: bool = False,
        driver_images: bool = False,
    ) -> UmlNode:
        """Boot UML guest ``index`` (its TAP link and addresses) and make VG ``vg1`` of
        ``vg_gib`` on its first disk. With ``kubelet``, the guest is a real Kubernetes node
        (containerd, the kubelet, kube-proxy: devtools/testbed/kubenode.py) that registers
        itself with ``labels`` and is Ready on return; else a simulated Node with ``labels`` and
        a CSINode are created for it; with ``driver_images`` its containerd holds the project's
        image and the CSI sidecars' besides the workloads' busybox. With ``device_classes``,
        ``topolvm node`` is started there with lvmd embedded."""
        if not any(what == "UML nodes" for what, _ in self._stops):
            self.defer("UML nodes", self._stop_nodes)
        node = UmlNode(name, index, self.node_dir or self.workdir / "nodes", disks=disks,
                       labels=dict(labels or {}))  # fmt: skip
        if kubelet:
            # /var/lib: containerd with every image, the kubelet's root
            images = nodeimages.all_images() if driver_images else nodeimages.workload_images()
            node.system_disk, node.mem_mb = systemdisk.template(images), KUBE_NODE_MEM_MB
            node.kubelet = True
            node.routed.append(pod_subnet(index))
        self.nodes.append(node)  # before it starts: teardown stops a half-started guest too
        node.start()
        node.make_vg(VG, vg_gib)
        if kubelet:
            bins = {**self.bins, **gobuild.ensure(*NODE_BINARIES)}
            kube = KubeNode(node, self.kube, bins, labels=node.labels)
            self.kubes[name] = kube.start()
        else:
            self.kube.add_node(name, labels=node.labels)
        if device_classes is not None:
            node.start_topolvm_node(self.kube, device_classes)
        return node

    def start_driver(self, *, sidecars: bool = True, folder: Path | None = None) -> DriverStack:
        """The CSIDriver and ``topolvm controller`` on the host, with ``sidecars`` the CSI
        sidecars, snapshot-controller and the VolumeSnapshot CRDs too (:class:`DriverStack`),
        in ``folder`` (``workdir/driver``)."""
        stack = DriverStack(self.kube, self.bins, folder or self.workdir / "driver")
        self.driver = stack.start(sidecars=sidecars)
        self.defer("the driver", self._stop_driver)
        return stack

    def start_addon(self, name: str, argv: list[str]) -> Child:
        """A cluster add-on process, its output in ``workdir/logs/<name>.log``."""
        child = Child(name, argv, self.workdir / "logs" / f"{name}.log").start()
        self.defer(name, child.stop)
        return child

    def start_snapshot_controller(self) -> Child:
        """The VolumeSnapshot CRDs and snapshot-controller, as on any cluster with snapshots."""
        cp = self.kube
        apply_snapshot_crds(cp, self.bins)
        return self.start_addon("snapshot-controller", snapshot_controller_argv(cp, self.bins))

    def defer(self, what: str, stop: Callable[[], None]) -> None:
        """Call ``stop`` at teardown, before what was started earlier is stopped."""
        self._stops.append((what, stop))

    # --- stop ---------------------------------------------------------------------------

    def teardown(self, warn: Callable[[str], None] | None = None) -> None:
        """Stop what this bed started, last started first; each part is stopped whatever the
        others raise. A failure goes to ``warn`` as one line, or without ``warn`` the first is
        raised once all is stopped. Safe to call twice."""
        errors: list[Exception] = []
        while self._stops:
            what, stop = self._stops.pop()
            try:
                stop()
            except Exception as exc:
                if warn is None:
                    errors.append(exc)
                else:
                    warn(f"WARNING: stopping {what}: {exc}")
        if errors:
            raise errors[0]

    def _stop_nodes(self) -> None:
        """``topolvm node`` and the kubelet in every guest first (none running is fine), then
        for each guest ``before_node_stop`` and the guest itself (its disks and TAP link go with
        it)."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop_topolvm_node()
            if (kube := self.kubes.pop(node.name, None)) is not None:
                with contextlib.suppress(Exception):  # else it registers the Node again
                    kube.stop()
        errors: list[Exception] = []
        while self.nodes:
            node = self.nodes.pop()
            for step in (self.before_node_stop, UmlNode.stop):
                try:
                    if step is not None:
                        step(node)
                except Exception as exc:
                    errors.append(exc)
        if errors:
            raise errors[0]

    def _stop_driver(self) -> None:
        if self.driver is not None:
            self.driver.stop()
            self.driver = None

    def _stop_control_plane(self) -> None:
        if self.cp is not None:
            self.cp.stop()
            self.cp = None

"""The test bed of ``make demo`` (devtools/demo.py): what it needs built before it leaves the
machine's network namespace (:func:`tools`), and :class:`DemoBed`, the test bed
(devtools/testbed/bed.py) with 3 real Kubernetes nodes in UML guests and the chart's release,
whose pods' and nodes' logs it keeps in .cache/demo/ for a failed run."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from devtools import gobuild, helm, nodeimages
from devtools.demo_plan import NODE_VG_GIB, THIN_POOL_GIB
from devtools.demo_steps import (
    RELEASE,
    RELEASE_NS,
    indent,
    kubectl,
    say,
)
from devtools.testbed import systemdisk
from devtools.testbed.bed import CLUSTER_BINARIES, Testbed
from devtools.testbed.chart import Release
from devtools.testbed.driver import SIDECAR_BINARIES
from devtools.testbed.kubenode import NODE_BINARIES
from devtools.testbed.umlnode import GiB, UmlNode

NEEDED = (*CLUSTER_BINARIES, *SIDECAR_BINARIES, *NODE_BINARIES)
WORK = gobuild.ROOT / ".cache" / "demo"


def tools() -> dict[str, Path]:
    """The pinned Kubernetes components (built on the first run), helm, and the nodes' system
    disk with every image (built when an image changed), all made before the process leaves the
    machine's network namespace (they need Go's module proxy, Debian's archive, PyPI)."""
    wanted = set(NEEDED)
    cold = [g for g in gobuild.GROUPS if (set(g.binaries) | set(g.files)) & wanted
            and not (gobuild.cache_dir(g) / ".complete").exists()]  # fmt: skip
    if cold:
        say("  first run: building Kubernetes components from Go modules, this takes a few "
            f"minutes (up to {sum(g.cold_minutes for g in cold)} on 2 cores with empty Go "
            f"caches; kept in {gobuild.CACHE})")  # fmt: skip
    bins = gobuild.ensure(*NEEDED)
    pins = gobuild.versions()
    built = [f"{name} {pins.get(pkg, '?')}" for g in gobuild.GROUPS
             for name, pkg in g.binaries.items()
             if name in wanted and name not in ("kubectl", "ctr")]  # fmt: skip
    say(f"  built from pinned Go modules: {', '.join(built)}")
    helm_bin = helm.helm()
    version = subprocess.run([str(helm_bin), "version", "--short"], capture_output=True,
                             text=True, check=False).stdout.strip()  # fmt: skip
    say(f"  helm {version} ({helm_bin})")
    t0 = time.monotonic()
    images = nodeimages.all_images()
    disk = systemdisk.template(images)
    say(f"  the nodes' images, in their containerd without a registry: "
        f"{', '.join(i.name for i in images)}")  # fmt: skip
    say(f"  system disk with them unpacked: {disk} ({time.monotonic() - t0:.1f}s; built only "
        "when an image changed)")  # fmt: skip
    return bins


def keep_node_logs(node: UmlNode) -> None:
    """The guest's containerd, kubelet and kube-proxy logs beside its console."""
    for daemon in node.spawned:
        with contextlib.suppress(Exception):
            log = node.daemon(daemon, lines=0)["log"]
            (node.workdir / f"{node.name}.{daemon}.log").write_text(log)


@dataclass
class DemoBed(Testbed):
    """The test bed as step 1 starts it, and the chart's release once step 2 installs it;
    :meth:`stop_all` stops them all."""

    before_node_stop: Callable[[UmlNode], None] | None = keep_node_logs
    release: Release | None = None
    installed: bool = False  # the release is there: its pods' logs can be kept

    def logs(self) -> str:
        """For a timeout message: the chart's pods and the tails of their containers' logs."""
        if self.release is None or not self.installed:
            return ""
        parts = [f"the chart's pods:\n{indent(self.release.describe())}"]
        with contextlib.suppress(Exception):
            for name, text in self.release.logs().items():
                last = "\n".join(text.splitlines()[-15:])
                parts.append(f"{name}:\n{indent(last)}")
        return "\n".join(parts)

    def keep_chart_logs(self) -> None:
        """Every container's log of the release, in .cache/demo/chart/ (before it goes)."""
        if self.release is None or not self.installed:
            return
        folder = self.workdir / "chart"
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):
            for name, text in self.release.logs().items():
                (folder / f"{name.replace('/', '_').replace(' ', '')}.log").write_text(text)

    def start_cluster(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
        # A fresh cluster has no LogicalVolume CRDs: the chart installs them. (Deleting the test
        # bed's right after it applied them could hang in the API server's CRD finalizer.)
        cp = self.start_control_plane(crds=False)
        say(f"  control plane up in {cp.started_in:.1f}s: etcd, kube-apiserver, "
            f"kube-controller-manager, kube-scheduler (logs in {cp.workdir / 'logs'})")  # fmt: skip
        self.start_snapshot_controller()
        say("  cluster add-ons, as on any cluster with snapshots: VolumeSnapshot CRDs, "
            "snapshot-controller")  # fmt: skip
        for index, (name, size) in enumerate(NODE_VG_GIB.items(), start=1):
            node = self.start_node(name, index, size, disks=(size * GiB,), kubelet=True,
                                   driver_images=True)  # fmt: skip
            node.lvm("lvcreate", "-T", "vg1/pool0", "-L", f"{THIN_POOL_GIB}g")
            say(f"  {name}: UML guest at {node.address} ({node.mem_mb} MiB), VG vg1 of {size} "
                f"GiB on {node.disk_devices[0]} with thin pool pool0 ({THIN_POOL_GIB} GiB); "
                f"containerd, kubelet, kube-proxy: Ready in "
                f"{self.kubes[name].started_in:.1f}s")  # fmt: skip
        # runs before the nodes stop: a failed run keeps the chart's logs
        self.defer("the chart's logs", self.keep_chart_logs)
        kubectl(cp, "get", "nodes", "-o", "wide")

    def uninstall(self) -> None:
        """``helm uninstall``, after keeping the pods' logs."""
        assert self.release is not None
        self.keep_chart_logs()
        say(f"  $ helm uninstall {RELEASE} -n {RELEASE_NS} --wait")
        say(indent(self.release.helm("uninstall", RELEASE, "-n", RELEASE_NS, "--wait")))
        self.installed = False

    def stop_all(self, verbose: bool = False) -> None:
        """Stop whatever runs; safe to call twice. Each part is stopped whatever the others do."""
        self.teardown(warn=lambda line: say(f"  {line}"))
        if verbose:
            say("  stopped: UML nodes (kubelet, kube-proxy, containerd; their disks, in "
                ".cache/demo-disks, removed), snapshot-controller, control plane; the network "
                "namespace ends with this process")  # fmt: skip

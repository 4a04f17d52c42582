"""The cluster side of the driver in the test bed: the CSIDriver object, ``topolvm controller``
on the host and the real CSI sidecars next to it, as the chart runs them in the controller pod
(csi-provisioner with ``--enable-capacity``, csi-resizer, csi-snapshotter, plus the cluster's
snapshot-controller and the VolumeSnapshot CRDs)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.process import Child, http_get, kill_group

SIDECAR_BINARIES = ("csi-provisioner", "csi-resizer", "csi-snapshotter", "snapshot-controller",
                    "snapshot-crds")  # fmt: skip
CSI_SIDECARS = ("csi-provisioner", "csi-resizer", "csi-snapshotter")
"""The sidecars that talk to the controller's CSI socket."""
NAMESPACE = "topolvm-system"


def csidriver(plugin: str, storage_capacity: bool = True) -> dict[str, object]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": plugin},
        "spec": {"attachRequired": False, "podInfoOnMount": True,
                 "storageCapacity": storage_capacity, "volumeLifecycleModes": ["Persistent"]},
    }  # fmt: skip


def apply_snapshot_crds(cp: ControlPlane, bins: dict[str, Path]) -> None:
    for f in sorted(bins["snapshot-crds"].glob("snapshot.storage.k8s.io_*.yaml")):
        cp.kubectl("apply", "--server-side", "-f", str(f))


def snapshot_controller_argv(cp: ControlPlane, bins: dict[str, Path]) -> list[str]:
    return [str(bins["snapshot-controller"]), f"--kubeconfig={cp.kubeconfig}"]


@dataclass
class DriverStack:
    cp: ControlPlane
    bins: dict[str, Path]
    workdir: Path
    legacy: bool = False
    controller_args: tuple[str, ...] = ()
    capacity_poll: str = "2s"
    health_port: int = 18081
    metrics_port: int = 18080
    # topolvm-controller's kubeconfig (say, one through a fault proxy); None: the control
    # plane's admin kubeconfig, which the sidecars always use
    controller_kubeconfig: Path | None = None
    children: dict[str, Child] = field(default_factory=dict)

    @property
    def plugin(self) -> str:
        return "topolvm.cybozu.com" if self.legacy else "topolvm.io"

    @property
    def socket(self) -> Path:
        return self.workdir / "csi-topolvm.sock"

    def _child(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        child = Child(name, argv, self.workdir / "logs" / f"{name}.log",
                      env={**os.environ, **(env or {})}).start()  # fmt: skip
        self.children[name] = child
        return child

    def start(self, sidecars: bool = True) -> DriverStack:
        """The CSIDriver, the namespace and ``topolvm controller``; with ``sidecars`` also the
        VolumeSnapshot CRDs, the CSI sidecars and snapshot-controller."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if sidecars:
            apply_snapshot_crds(self.cp, self.bins)
        self.cp.apply(csidriver(self.plugin))
        self.cp.kubectl("create", "namespace", NAMESPACE, check=False)
        try:
            self.start_controller()
            if sidecars:
                self._start_sidecars()
        except BaseException:
            self.stop()
            raise
        return self

    def start_controller(self) -> Child:
        legacy = ["--legacy"] if self.legacy else []
        child = self._child(
            "topolvm-controller",
            [sys.executable, "-m", "topolvm", "--log-format", "text", "controller",
             f"--csi-socket={self.socket}",
             f"--kubeconfig={self.controller_kubeconfig or self.cp.kubeconfig}",
             "--leader-election=false", "--enable-webhooks=false",
             f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
             f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
             *legacy, *self.controller_args],
            env={"POD_NAMESPACE": NAMESPACE},
        )  # fmt: skip
        readyz = f"http://127.0.0.1:{self.health_port}/readyz"
        child.wait_until("ready (/readyz)", lambda: http_get(readyz) == b"ok")
        return child

    def kill_controller(self) -> None:
        """SIGKILL ``topolvm controller`` (no graceful shutdown: a crash, an OOM kill)."""
        child = self.children.pop("topolvm-controller", None)
        if child is not None and child.proc is not None:
            kill_group(child.proc.pid)
            child.proc.wait()
            child.proc = None

    def restart_after_crash(self) -> None:
        """Start the controller again, and the sidecars: each exits when it loses its CSI
        connection (some only at their next call), and the kubelet restarts them in a real
        pod; restarting all of them here makes that deterministic."""
        for name in CSI_SIDECARS:
            child = self.children.get(name)
            if child is not None:
                child.stop()
        self.start_controller()
        for name in CSI_SIDECARS:
            child = self.children.get(name)
            if child is not None:
                child.start()

    def stop_controller(self, sidecars: bool = False) -> None:
        """Stop ``topolvm controller`` (and with ``sidecars`` the CSI sidecars, which would
        otherwise act on objects meanwhile); :meth:`restart_after_crash` starts them again."""
        child = self.children.pop("topolvm-controller", None)
        if child is not None:
            child.stop()
        for name in CSI_SIDECARS if sidecars else ():
            if (sidecar := self.children.get(name)) is not None:
                sidecar.stop()

    def _start_sidecars(self) -> None:
        common = [f"--csi-address={self.socket}", f"--kubeconfig={self.cp.kubeconfig}", "--v=2"]
        self._child(
            "csi-provisioner",
            [str(self.bins["csi-provisioner"]), *common, "--feature-gates=Topology=true",
             "--enable-capacity", "--capacity-ownerref-level=-1",
             f"--capacity-poll-interval={self.capacity_poll}", "--timeout=60s",
             "--retry-interval-max=10s", "--kube-api-capacity-qps=50",
             "--kube-api-capacity-burst=100", "--extra-create-metadata"],
            env={"NAMESPACE": NAMESPACE, "POD_NAME": "topolvm-controller-testbed"},
        )  # fmt: skip
        self._child("csi-resizer", [str(self.bins["csi-resizer"]), *common, "--timeout=60s"])
        self._child("csi-snapshotter",
                    [str(self.bins["csi-snapshotter"]), *common, "--timeout=60s",
                     "--extra-create-metadata"])  # fmt: skip
        self._child("snapshot-controller", snapshot_controller_argv(self.cp, self.bins))

    def log(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    def stop(self) -> None:
        for name in reversed(list(self.children)):
            self.children.pop(name).stop()

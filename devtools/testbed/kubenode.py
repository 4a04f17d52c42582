"""A real Kubernetes node inside a UML guest: containerd with runc, the bridge CNI, the kubelet
and kube-proxy, each the pinned upstream binary (devtools/gobuild.py), started through the
guest's agent so that a test can kill and restart any of them.

The guest's root is the host's filesystem, so everything the node writes goes to guest-only
places: an ext4 system disk mounted over ``/var/lib`` (containerd's images and the kubelet's
root, ``/var/lib/kubelet`` as on any node), a tmpfs over ``/var/log``, and the configuration in
``/run/node`` (the guest's tmpfs). The host's ``/var/lib`` and ``/var/log`` are only hidden
inside the guest. Mounts are shared from ``/`` down, so the Bidirectional mounts a CSI node
plugin makes in its container reach the kubelet.

Identity: the kubelet authenticates with a client certificate ``system:node:<name>`` in
``system:nodes`` (the Node authorizer and NodeRestriction apply), kube-proxy as
``system:kube-proxy``. Pods get addresses from ``pod_subnet(index)`` on bridge ``cni0``; the
host routes that subnet to the guest, so pods reach the API server (and each other) and the API
server reaches pods (the webhook). The system disk is a copy-on-write layer over a template
whose containerd already holds every image (devtools/testbed/systemdisk.py); nothing is pulled.
"""

from __future__ import annotations

import json
import shlex
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devtools.nodeimages import PAUSE
from devtools.testbed.controlplane import API_PORT, ControlPlane, host_address
from devtools.testbed.process import HarnessError
from devtools.testbed.umlnode import UmlNode

NODE_BINARIES = ("kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "ctr", "runc",
                 "bridge", "host-local", "loopback")  # fmt: skip
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
KUBELET_DIR = "/var/lib/kubelet"
KUBELET_PORT = 10250
RUN = "/run/node"  # the node's configuration, in the guest's own tmpfs
# containerd's registry hosts (``<host:port>/hosts.toml``): empty unless a test serves a registry
REGISTRY_HOSTS = f"{RUN}/registries"
POD_NETWORK = "10.200.0.0/16"
DAEMONS = ("containerd", "kubelet", "kube-proxy")  # in start order


def pod_subnet(index: int) -> str:
    """The pod addresses of UML node ``index``."""
    return f"10.200.{index}.0/24"


# --- configuration ------------------------------------------------------------------------


def containerd_config(bins: dict[str, Path]) -> str:
    """containerd 2.x: CRI with runc (cgroupfs) and the CNI plugins from the build cache."""
    return f"""\
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "{CONTAINERD_SOCKET}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{REGISTRY_HOSTS}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{bins["runc"]}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{bins["bridge"].parent}"]
    conf_dir = "{RUN}/cni"
"""


def cni_config(index: int) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "testbed",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,  # the host routes the pod subnet back: no NAT needed
                "hairpinMode": True,  # a pod reaches itself through a Service
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_subnet(index)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    }


def kubelet_config(node: UmlNode, ca: Path) -> dict[str, Any]:
    tiny = "1%"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.address,
        "readOnlyPort": 0,
        "authentication": {
            "x509": {"clientCAFile": str(ca)},
            "webhook": {"enabled": True},
            "anonymous": {"enabled": False},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",  # no systemd in the guest
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "failSwapOn": False,
        "resolvConf": "",  # no cluster DNS in the test bed
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": tiny,
            "nodefs.inodesFree": tiny,
            "imagefs.available": tiny,
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "nodeStatusReportFrequency": "1m",
        "syncFrequency": "10s",
        "fileCheckFrequency": "60s",
    }


def kube_proxy_config(node: UmlNode, kubeconfig: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node.name,
        "clusterCIDR": POD_NETWORK,
        "bindAddress": node.address,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {"maxPerCore": 0},  # leave the guest's conntrack sysctls alone
    }


def setup_script(node: UmlNode, system_disk: str, files: Path) -> str:
    """The guest-side preparation, run at every boot before the daemons start."""
    q = shlex.quote
    return f"""\
set -eu
mountpoint -q /sys/fs/cgroup || mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount --make-rshared /
mountpoint -q /var/lib || mount -o noatime {system_disk} /var/lib
mkdir -p {KUBELET_DIR} /var/lib/containerd
mountpoint -q /var/log || mount -t tmpfs -o mode=0755 tmpfs /var/log
mkdir -p /var/log/pods /var/log/containers {RUN}/cni /run/topolvm
cp {q(str(files / "10-bridge.conflist"))} {RUN}/cni/
# lvm run by a container through nsenter reads /etc/lvm: the guest's configuration (no udev)
mountpoint -q /etc/lvm || mount --bind /run/lvm-conf /etc/lvm
# cAdvisor needs a clock speed; UML's cpuinfo has none
if ! grep -q '^cpu MHz' /proc/cpuinfo; then
  sed 's/^processor.*/&\\ncpu MHz\\t\\t: 1000.000/' /proc/cpuinfo > {RUN}/cpuinfo
  mount --bind {RUN}/cpuinfo /proc/cpuinfo
fi
hostname {q(node.name)}
echo 1 > /proc/sys/net/ipv4/ip_forward
ip route replace default via {host_address(node.index)}
"""


# --- the node -----------------------------------------------------------------------------


@dataclass
class KubeNode:
    """The Kubernetes side of ``node``: :meth:`start` after the guest booted, before anything
    needs the Node object; ``labels`` are the Node's (the kubelet registers them)."""

    node: UmlNode
    cp: ControlPlane
    bins: dict[str, Path]
    labels: dict[str, str] = field(default_factory=dict)
    started_in: float = 0.0

    @property
    def files(self) -> Path:
        return self.node.workdir / self.node.name / "kube"

    def start(self, timeout: float = 180) -> KubeNode:
        t0 = time.monotonic()
        self._write_files()
        self.node.on_boot(["sh", str(self.files / "setup.sh")])
        self.node.exec("sh", str(self.files / "setup.sh"))
        self._start_daemon("containerd")
        self.node.serves_on("containerd", CONTAINERD_SOCKET)  # a power cycle waits for it too
        self._wait("containerd's socket", lambda: self.node.exec(
            "test", "-S", CONTAINERD_SOCKET, check=False).rc == 0, 60)  # fmt: skip
        self._start_daemon("kubelet")
        self._start_daemon("kube-proxy")
        self.wait_ready(timeout)
        # what the first start wrote (the kubelet's self-signed serving certificate, say) on
        # disk, as on a machine up for a while: a power cycle (UmlNode.power_cycle) found it
        # empty, and the kubelet would not start again
        self.node.exec("sync")
        self.started_in = time.monotonic() - t0
        return self

    def _write_files(self) -> None:
        f = self.files
        f.mkdir(parents=True, exist_ok=True)
        cp, node = self.cp, self.node
        server = f"https://{host_address(node.index)}:{API_PORT}"
        crt, key = cp.pki.issue(f"node-{node.name}", f"system:node:{node.name}",
                                org="system:nodes", folder=f)  # fmt: skip
        cp.write_kubeconfig(f / "kubelet.kubeconfig", server, cert=(crt, key))
        crt, key = cp.pki.issue(f"proxy-{node.name}", "system:kube-proxy", folder=f)
        cp.write_kubeconfig(f / "kube-proxy.kubeconfig", server, cert=(crt, key))
        (f / "containerd.toml").write_text(containerd_config(self.bins))
        (f / "10-bridge.conflist").write_text(json.dumps(cni_config(node.index), indent=2))
        (f / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_config(node, cp.pki.ca_file)))
        (f / "kube-proxy.yaml").write_text(
            yaml.safe_dump(kube_proxy_config(node, f / "kube-proxy.kubeconfig"))
        )
        disk = node.system_device
        if disk is None:
            raise HarnessError(f"{node.name}: a Kubernetes node needs a system disk")
        (f / "setup.sh").write_text(setup_script(node, disk, f))

    def argv(self, daemon: str) -> list[str]:
        f, b, node = self.files, self.bins, self.node
        if daemon == "containerd":
            return [str(b["containerd"]), f"--config={f / 'containerd.toml'}"]
        if daemon == "kubelet":
            labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
            return [str(b["kubelet"]), f"--config={f / 'kubelet.yaml'}",
                    f"--kubeconfig={f / 'kubelet.kubeconfig'}", f"--hostname-override={node.name}",
                    f"--node-ip={node.address}", f"--root-dir={KUBELET_DIR}",
                    *([f"--node-labels={labels}"] if labels else []), "--v=1"]  # fmt: skip
        if daemon == "kube-proxy":
            return [str(b["kube-proxy"]), f"--config={f / 'kube-proxy.yaml'}", "--v=1"]
        raise ValueError(daemon)

    def env(self) -> dict[str, str]:
        """PATH with the shim (containerd finds it there) and runc."""
        dirs = {str(self.bins[n].parent) for n in ("containerd-shim-runc-v2", "runc")}
        return {"PATH": ":".join([*sorted(dirs), "/usr/sbin:/usr/bin:/sbin:/bin"])}

    def _start_daemon(self, name: str) -> None:
        self.node.spawn(name, self.argv(name), self.env())

    def restart(self, daemon: str, sig: str = "SIGTERM") -> None:
        """Stop ``daemon`` with ``sig`` (SIGKILL: a crash) and start it again; a kubelet is
        waited for until its API (logs, exec) serves again."""
        res = self.node.signal(daemon, sig, wait=60)
        if res.get("running"):
            self.node.signal(daemon, "SIGKILL", wait=10)
        self._start_daemon(daemon)
        if daemon == "kubelet":
            self._wait("the kubelet's API on :10250", self._kubelet_serving, 120)

    def _kubelet_serving(self) -> bool:
        try:
            with socket.create_connection((self.node.address, KUBELET_PORT), timeout=2):
                return True
        except OSError:
            return False

    def node_object(self) -> dict[str, Any] | None:
        out = self.cp.kubectl("get", "node", self.node.name, "-o", "json", check=False)
        return json.loads(out) if out.strip() else None

    def ready(self) -> bool:
        obj = self.node_object() or {}
        conditions = obj.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def wait_ready(self, timeout: float = 180) -> None:
        self._wait("the Node Ready (kubelet registered, runtime and network ready)", self.ready,
                   timeout)  # fmt: skip

    def _wait(self, what: str, check: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            for daemon in DAEMONS:
                state = self.node.daemon(daemon, lines=40) if self._spawned(daemon) else None
                if state is not None and not state["running"]:
                    raise HarnessError(f"{self.node.name}: {daemon} exited ({state['rc']}) while "
                                       f"waiting for {what}:\n{state['log']}")  # fmt: skip
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {d}:\n{self.node.daemon(d, lines=25)['log']}"
                                 for d in DAEMONS if self._spawned(d))  # fmt: skip
                raise HarnessError(f"{self.node.name}: no {what} within {timeout:.0f}s\n{logs}")
            time.sleep(0.5)

    def _spawned(self, daemon: str) -> bool:
        return daemon in self.node.spawned

    def stop(self) -> None:
        """The kubelet and kube-proxy, then containerd (the guest goes with the node)."""
        for daemon in reversed(DAEMONS):
            if self._spawned(daemon):
                res = self.node.signal(daemon, "SIGTERM", wait=20)
                if res.get("running"):
                    self.node.signal(daemon, "SIGKILL", wait=10)

"""A real Kubernetes control plane without a kubelet: etcd, kube-apiserver (TLS, RBAC,
service-account tokens, admission webhooks), kube-controller-manager with the volume
controllers, and kube-scheduler (plus extra kube-scheduler processes, one per profile name,
for extender set-ups).

The caller runs it inside a private network namespace (see ``process.enter_private_netns``), so
the fixed ports below never clash with anything on the machine. UML guests reach the API server
at ``10.199.<n>.1:6443`` over their TAP links.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devtools.testbed.pki import Pki
from devtools.testbed.process import Child, HarnessError, http_get, kill_group

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "deploy" / "crds"
ETCD_PORT = 2379
API_PORT = 6443
TRANSFER_ACCOUNT = ("topolvm-system", "topolvm-node")
"""The ServiceAccount whose tokens a guest-process topolvm-node presents and accepts."""
GUEST_SUBNETS = 16  # 10.199.1.0/24 ... 10.199.16.0/24, one per UML node
KCM_CONTROLLERS = (
    "persistentvolume-binder-controller",
    "persistentvolume-expander-controller",
    "persistentvolumeclaim-protection-controller",
    "persistentvolume-protection-controller",
    "ephemeral-volume-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "statefulset-controller",
    "deployment-controller",  # the chart's controller Deployment makes real Pod objects
    "replicaset-controller",
    # for real kubelets: the chart's DaemonSets, Services (kube-proxy and the webhook's
    # endpoint), kube-root-ca.crt in every namespace (pods' ServiceAccount token volumes)
    "daemonset-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "root-ca-certificate-publisher-controller",
    "disruption-controller",  # PodDisruptionBudgets' status, which topolvm drain honours
    # a VolumeAttributesClass keeps its protection finalizer while a claim or volume names it
    # (docs/qos.md); without this controller, deleting one never ends
    "volumeattributesclass-protection-controller",
)
DEFAULT_NODE_CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}


ADVERTISE = "10.199.0.1"
"""The API server's address for pods (the ``kubernetes`` Service's endpoint): on the namespace's
loopback link, reached from every guest through its TAP link's host side."""


def host_address(index: int) -> str:
    """The host's address on UML guest ``index``'s TAP link (``index`` from 1)."""
    return f"10.199.{index}.1"


def guest_address(index: int) -> str:
    return f"10.199.{index}.2"


@dataclass
class ControlPlane:
    """Start with :meth:`start`, stop with :meth:`stop`; ``bins`` maps binary names to paths."""

    workdir: Path
    bins: dict[str, Path]
    etcd_port: int = ETCD_PORT
    children: dict[str, Child] = field(default_factory=dict)
    started_in: float = 0.0
    _next_scheduler_port: int = 10259
    _transfer_account: bool = False

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{API_PORT}"

    def log(self, component: str) -> Path:
        return self.workdir / "logs" / f"{component}.log"

    # --- start / stop -------------------------------------------------------------------

    def start(self, crds: bool = True) -> ControlPlane:
        """Start every component; with ``crds``, apply the LogicalVolume CRDs too."""
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pki = Pki(self.workdir / "pki")
        hosts: tuple[str, ...] = (
            "127.0.0.1",
            "localhost",
            "10.0.0.1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            ADVERTISE,
        )
        hosts += tuple(host_address(i) for i in range(1, GUEST_SUBNETS + 1))
        self.serving = self.pki.issue("apiserver", "kube-apiserver", hosts=hosts, server=True)
        self.admin_cert = self.pki.issue("admin", "admin", org="system:masters")
        # how the API server authenticates to kubelets (kubectl logs, exec)
        self.kubelet_client = self.pki.issue("apiserver-kubelet-client",
                                             "kube-apiserver-kubelet-client",
                                             org="system:masters")  # fmt: skip
        self.write_kubeconfig(self.kubeconfig, self.server)
        try:
            _namespace_network()
            self._start_etcd()
            self._start_apiserver()
            self._start_controller_manager()
            self.start_scheduler("default-scheduler")
            if crds:
                self.kubectl("apply", "--server-side", "-f", str(CRDS))
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Stop every component (last started first); keep the logs, drop etcd's data."""
        for name in reversed(list(self.children)):
            self.children.pop(name).stop()
        shutil.rmtree(self.workdir / "etcd", ignore_errors=True)

    def restart(self, name: str, *, crash: bool = False, down: float = 0.0) -> None:
        """Stop one running component (``etcd``, ``kube-apiserver``, ``kube-controller-manager``,
        a ``kube-scheduler``) and start it again with the same command line, waiting until it is
        healthy: SIGTERM and its graceful shutdown, or with ``crash`` a SIGKILL of its process
        group; ``down`` seconds in between. etcd keeps its data folder (only :meth:`stop` drops
        it), the API server its certificates; logs go on in the same file. Call it on the
        thread that lives as long as the control plane (not ``asyncio.to_thread``): the child
        gets SIGKILL when the thread that started it ends (``process.die_with_parent``)."""
        child = self.children[name]
        if crash and child.proc is not None:
            kill_group(child.proc.pid)
            child.proc.wait()
            child.proc = None
        child.stop()
        time.sleep(down)
        child.start()
        child.wait_until("healthy again", lambda: self._healthy(name, child), timeout=120)

    def _healthy(self, name: str, child: Child) -> bool:
        if name == "etcd":
            return b'"true"' in http_get(f"http://127.0.0.1:{self.etcd_port}/health")
        if name == "kube-apiserver":
            return self._get("/readyz") == b"ok"
        port = next(a.split("=", 1)[1] for a in child.argv if a.startswith("--secure-port="))
        return http_get(f"https://127.0.0.1:{port}/healthz") == b"ok"

    def _start_etcd(self) -> None:
        data = self.workdir / "etcd"
        shutil.rmtree(data, ignore_errors=True)
        url = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_port + 1}"
        etcd = self._child(
            "etcd",
            [
                str(self.bins["etcd"]), "--name=testbed", f"--data-dir={data}",
                f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=testbed={peer}", "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )  # fmt: skip
        etcd.wait_until("healthy", lambda: b'"true"' in http_get(f"{url}/health"))

    def _start_apiserver(self) -> None:
        crt, key = self.serving
        api = self._child(
            "kube-apiserver",
            [
                str(self.bins["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=0.0.0.0", f"--secure-port={API_PORT}",
                f"--advertise-address={ADVERTISE}",
                f"--tls-cert-file={crt}", f"--tls-private-key-file={key}",
                f"--client-ca-file={self.pki.ca_file}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--kubelet-client-certificate={self.kubelet_client[0]}",
                f"--kubelet-client-key={self.kubelet_client[1]}",
                "--kubelet-preferred-address-types=InternalIP",
                # webhooks (and aggregated APIs) are dialled at a Service's endpoint, a pod
                # address the namespace routes to its node; no kube-proxy runs on the host
                "--enable-aggregator-routing=true",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={self.pki.sa_pub_file}",
                f"--service-account-signing-key-file={self.pki.sa_key_file}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                # Only the node-lifecycle controller would lift the not-ready taint; it never runs.
                "--disable-admission-plugins=TaintNodesByCondition",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
            ],
        )  # fmt: skip
        api.wait_until("ready (/readyz)", lambda: self._get("/readyz") == b"ok", timeout=120)

    def _start_controller_manager(self) -> None:
        kcm = self._child(
            "kube-controller-manager",
            [
                str(self.bins["kube-controller-manager"]),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=10257",
                # The default 20 requests/s made the PVC protection controller take 4 minutes
                # over the 5000 claims of the doctor scale test, with the session's other claims
                # queued behind them; a large cluster's operator raises it the same way.
                "--kube-api-qps=200", "--kube-api-burst=400",
                f"--controllers={','.join(KCM_CONTROLLERS)}",
                f"--service-account-private-key-file={self.pki.sa_key_file}",
                f"--root-ca-file={self.pki.ca_file}",
            ],
        )  # fmt: skip
        kcm.wait_until("healthy", lambda: http_get("https://127.0.0.1:10257/healthz") == b"ok")

    def start_scheduler(self, profile: str, extenders: list[dict[str, Any]] | None = None) -> Child:
        """A kube-scheduler process whose only profile is ``profile`` (the pods' schedulerName),
        with ``extenders`` as in a KubeSchedulerConfiguration. Started once per profile."""
        name = "kube-scheduler" if profile == "default-scheduler" else f"kube-scheduler-{profile}"
        if name in self.children:
            return self.children[name]
        config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig)},
            "leaderElection": {"leaderElect": False},
            "profiles": [
                {"schedulerName": profile}
                if not extenders
                # With an extender, placement by capacity is the extender's score alone: the
                # test bed's CSIDriver also has storageCapacity on, and VolumeBinding's own
                # capacity score (StorageCapacityScoring) ranks nodes the other way round.
                else {
                    "schedulerName": profile,
                    "plugins": {"score": {"disabled": [{"name": "VolumeBinding"}]}},
                }
            ],
            "extenders": extenders or [],
        }
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        port = self._next_scheduler_port
        self._next_scheduler_port += 1
        sched = self._child(
            name,
            [
                str(self.bins["kube-scheduler"]), f"--config={path}",
                "--bind-address=127.0.0.1", f"--secure-port={port}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
            ],
        )  # fmt: skip
        sched.wait_until("healthy", lambda: http_get(f"https://127.0.0.1:{port}/healthz") == b"ok")
        return sched

    def stop_scheduler(self, profile: str) -> None:
        name = "kube-scheduler" if profile == "default-scheduler" else f"kube-scheduler-{profile}"
        child = self.children.pop(name, None)
        if child:
            child.stop()

    def _child(self, name: str, argv: list[str]) -> Child:
        child = Child(name, argv, self.log(name)).start()
        self.children[name] = child
        return child

    # --- access -------------------------------------------------------------------------

    def transfer_account(self) -> tuple[str, str]:
        """topolvm-node's ServiceAccount (``topolvm-system/topolvm-node``, made if missing):
        a topolvm-node running as a guest process makes its transfer tokens for it with
        TokenRequest, bound to its Node, as the chart's pod makes them bound to itself."""
        namespace, account = TRANSFER_ACCOUNT
        if not self._transfer_account:
            self.kubectl("create", "namespace", namespace, check=False)
            self.kubectl("create", "serviceaccount", account, "-n", namespace, check=False)
            self._transfer_account = True
        return namespace, account

    def write_kubeconfig(
        self,
        path: Path,
        server: str,
        token: str | None = None,
        cert: tuple[Path, Path] | None = None,
    ) -> Path:
        """A kubeconfig for ``server``: admin (client certificate in ``system:masters``), with
        ``token`` a bearer token (say, a ServiceAccount's from ``kubectl create token``), or with
        ``cert`` that client certificate and key (a node's, say)."""
        crt, key = cert or self.admin_cert
        user = (
            {"token": token} if token else {"client-certificate": str(crt), "client-key": str(key)}
        )
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "testbed",
                            "cluster": {
                                "server": server,
                                "certificate-authority": str(self.pki.ca_file),
                            },
                        }
                    ],
                    "users": [
                        {
                            "name": "admin",
                            "user": user,
                        }
                    ],
                    "contexts": [
                        {"name": "testbed", "context": {"cluster": "testbed", "user": "admin"}}
                    ],
                    "current-context": "testbed",
                }
            )
        )
        return path

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> str:
        """Run the pinned kubectl with the admin kubeconfig; return stdout."""
        proc = subprocess.run(
            [str(self.bins["kubectl"]), f"--kubeconfig={self.kubeconfig}", *args],
            input=input, capture_output=True, text=True, check=False, timeout=timeout,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise HarnessError(f"kubectl {' '.join(args)}: exit {proc.returncode}: {proc.stderr}")
        return proc.stdout

    def apply(self, *objects: dict[str, Any]) -> None:
        docs = "\n---\n".join(json.dumps(o) for o in objects)
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=docs)

    def add_node(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        capacity: dict[str, str] | None = None,
    ) -> None:
        """A simulated Node (Ready, labels as kubelet sets them) and its CSINode for topolvm.io."""
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "topology.topolvm.io/node": name,
                    **(labels or {}),
                },
            },
            "status": {
                "capacity": {**DEFAULT_NODE_CAPACITY, **(capacity or {})},
                "allocatable": {**DEFAULT_NODE_CAPACITY, **(capacity or {})},
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady",
                     "message": "test bed: simulated node"},
                ],
            },
        }  # fmt: skip
        # create (not apply): status is kept on create, as when a kubelet registers.
        self.kubectl("create", "-f", "-", input=json.dumps(node))
        self.apply(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSINode",
                "metadata": {"name": name},
                "spec": {
                    "drivers": [
                        {
                            "name": "topolvm.io",
                            "nodeID": name,
                            "topologyKeys": ["topology.topolvm.io/node"],
                        }
                    ]
                },
            }
        )

    def _get(self, path: str) -> bytes:
        crt, key = self.admin_cert
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_file))
        ctx.load_cert_chain(str(crt), str(key))
        with urllib.request.urlopen(self.server + path, context=ctx, timeout=5) as r:
            body: bytes = r.read()
            return body

    def describe(self) -> str:
        """Where everything is, for a developer."""
        lines = [f"kubeconfig: {self.kubeconfig}", f"server:     {self.server}"]
        lines += [f"log:        {c.log}  ({n})" for n, c in self.children.items()]
        return "\n".join(lines)


def _namespace_network() -> None:
    """:data:`ADVERTISE` on the namespace's loopback link (once), and forwarding on (pod to pod
    across nodes passes the namespace)."""
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
    shown = subprocess.run(["ip", "-4", "addr", "show", "dev", "lo"], capture_output=True,
                           text=True, check=False)  # fmt: skip
    if f" {ADVERTISE}/" in shown.stdout:
        return
    res = subprocess.run(["ip", "addr", "add", f"{ADVERTISE}/32", "dev", "lo"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    if res.returncode != 0:
        raise HarnessError(f"ip addr add {ADVERTISE}/32 dev lo: {res.stderr.strip()}")

"""The chart's workloads, run for real without a kubelet: a Helm release installed into the
test bed's control plane, and the containers of its controller Deployment run as host processes,
its topolvm-node container as a daemon in a UML guest, each exactly as the chart renders it
(command, flags, environment) and each authenticated with its ServiceAccount's token, not as
admin. So a chart that passes a wrong flag or a ClusterRole that misses a rule fails here.

Only what a pod's sandbox decides is adapted, by :func:`localize`: the CSI socket's path, and
listen addresses (health and metrics ports bound on loopback, at free ports). The Deployment's
own Pods exist (kube-controller-manager makes them; no kubelet runs them): csi-provisioner
resolves its owner (Pod -> ReplicaSet -> Deployment) through ``POD_NAME``.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devtools.helm import helm
from devtools.testbed.controlplane import API_PORT, ControlPlane, host_address
from devtools.testbed.process import Child
from devtools.testbed.umlnode import CSI_SOCKET, LVM, UmlNode

Obj = dict[str, Any]

# The sidecars' binaries, by the command the chart gives (the images' entry points).
SIDECARS = ("csi-provisioner", "csi-resizer", "csi-snapshotter")
_ADDRESS_FLAGS = ("--metrics-bind-address", "--health-probe-bind-address", "--http-endpoint")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def localize(argv: list[str], csi_socket: str) -> list[str]:
    """``argv`` with the CSI socket at ``csi_socket`` and every listen address on loopback at a
    free port (several "pods" share one network namespace here)."""
    out = []
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        if eq and flag in ("--csi-address", "--csi-socket"):
            out.append(f"{flag}={csi_socket}")
        elif eq and flag in _ADDRESS_FLAGS:
            out.append(f"{flag}=127.0.0.1:{free_port()}")
        else:
            out.append(arg)
    return out


def env_of(container: Obj, fields: dict[str, str]) -> dict[str, str]:
    """The container's env, ``valueFrom.fieldRef`` resolved from ``fields`` (fieldPath ->
    value: ``metadata.namespace``, ``metadata.name``, ``spec.nodeName``)."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif ref := e.get("valueFrom", {}).get("fieldRef"):
            env[e["name"]] = fields[ref["fieldPath"]]
    return env


def argv_of(container: Obj) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


@dataclass
class Release:
    """A Helm release of charts/topolvm in the test bed, installed as admin."""

    cp: ControlPlane
    chart: Path
    name: str
    namespace: str

    def helm(self, *args: str) -> str:
        env = {"KUBECONFIG": str(self.cp.kubeconfig), "HELM_CACHE_HOME": str(self._home("cache")),
               "HELM_CONFIG_HOME": str(self._home("config")),
               "HELM_DATA_HOME": str(self._home("data")), "HOME": str(self._home("home")),
               "KUBECACHEDIR": str(self._home("kube-cache")), "PATH": "/usr/bin:/bin"}  # fmt: skip
        res = subprocess.run([str(helm()), *args], capture_output=True, text=True, env=env,
                             timeout=300, check=False)  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)}: {res.stderr.strip()}")
        return res.stdout

    def _home(self, what: str) -> Path:
        path = self.cp.workdir / "helm" / what
        path.mkdir(parents=True, exist_ok=True)
        return path

    def install(self, values: dict[str, Any], *extra: str) -> str:
        return self._apply("install", values, "--create-namespace", *extra)

    def upgrade(self, values: dict[str, Any], *extra: str) -> str:
        return self._apply("upgrade", values, *extra)

    def _apply(self, verb: str, values: dict[str, Any], *extra: str) -> str:
        path = self.cp.workdir / "helm" / f"{self.name}-values.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
        return self.helm(verb, self.name, str(self.chart), "-n", self.namespace, "-f", str(path),
                         "--wait=false", *extra)  # fmt: skip

    def uninstall(self) -> None:
        self.helm("uninstall", self.name, "-n", self.namespace, "--wait")

    def manifest(self) -> list[Obj]:
        docs = yaml.safe_load_all(self.helm("get", "manifest", self.name, "-n", self.namespace))
        return [d for d in docs if d]

    def workload(self, kind: str, component: str) -> Obj:
        [obj] = [d for d in self.manifest() if d["kind"] == kind
                 and d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
                 == component]  # fmt: skip
        return obj

    def token(self, service_account: str) -> str:
        return self.cp.kubectl("create", "token", service_account, "-n", self.namespace,
                               "--duration=2h").strip()  # fmt: skip


@dataclass
class ControllerPod:
    """The containers of the chart's controller Deployment, on the host, as its ServiceAccount."""

    release: Release
    bins: dict[str, Path]
    workdir: Path
    pod_name: str
    children: dict[str, Child] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.workdir / "csi-topolvm.sock"

    def start(self) -> ControllerPod:
        rel = self.release
        deployment = rel.workload("Deployment", "controller")
        spec = deployment["spec"]["template"]["spec"]
        self.workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = rel.cp.write_kubeconfig(
            self.workdir / "kubeconfig", rel.cp.server, rel.token(spec["serviceAccountName"])
        )
        fields = {"metadata.namespace": rel.namespace, "metadata.name": self.pod_name}
        for c in spec["containers"]:
            argv = localize(argv_of(c), str(self.socket))
            exe = Path(argv[0]).name
            if exe == "topolvm":
                argv = [sys.executable, "-m", "topolvm", *argv[1:]]
            elif exe in SIDECARS:
                argv = [str(self.bins[exe]), *argv[1:]]
            else:
                continue  # livenessprobe: kubelet's business
            child = Child(c["name"], [*argv, f"--kubeconfig={kubeconfig}"],
                          self.workdir / "logs" / f"{c['name']}.log",
                          env={"PATH": "/usr/bin:/bin", **env_of(c, fields)})  # fmt: skip
            self.children[c["name"]] = child.start()
        return self

    def logs(self) -> dict[str, str]:
        return {name: c.log.read_text(errors="replace") for name, c in self.children.items()}

    def stop(self) -> None:
        for name in reversed(list(self.children)):
            self.children.pop(name).stop()


@dataclass
class SchedulerPod:
    """The chart's topolvm-scheduler container on the host, as its ServiceAccount, with the
    options file of the chart's ConfigMap; it listens on loopback at a free port (``url``)."""

    release: Release
    workdir: Path
    port: int = field(default_factory=free_port)
    child: Child | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SchedulerPod:
        rel = self.release
        manifest = rel.manifest()
        [workload] = [d for d in manifest if d["kind"] in ("DaemonSet", "Deployment")
                      and d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
                      == "scheduler"]  # fmt: skip
        [options] = [d for d in manifest if d["kind"] == "ConfigMap"
                     and d["metadata"]["name"].endswith("-scheduler-options")]  # fmt: skip
        spec = workload["spec"]["template"]["spec"]
        [c] = [c for c in spec["containers"] if c["name"] == "topolvm-scheduler"]
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "scheduler-options.yaml"
        config.write_text(options["data"]["scheduler-options.yaml"])
        kubeconfig = rel.cp.write_kubeconfig(
            self.workdir / "kubeconfig", rel.cp.server, rel.token(spec["serviceAccountName"])
        )
        argv = [f"--config={config}" if a.startswith("--config=") else a for a in argv_of(c)]
        self.child = Child(
            "topolvm-scheduler",
            [sys.executable, "-m", "topolvm", *argv[1:], f"--listen=127.0.0.1:{self.port}",
             f"--kubeconfig={kubeconfig}"],
            self.workdir / "topolvm-scheduler.log",
        ).start()  # fmt: skip
        return self

    def log(self) -> str:
        return self.child.log.read_text(errors="replace") if self.child else ""

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()


def scheduler_stanza(notes: str, url: str) -> list[Obj]:
    """The ``extenders`` of the KubeSchedulerConfiguration the chart's NOTES print, with the
    extender's URL replaced by ``url`` (the test bed has no cluster DNS)."""
    lines = notes.splitlines()
    start = next(i for i, line in enumerate(lines) if "apiVersion: kubescheduler" in line)
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    config = yaml.safe_load("\n".join(line[4:] for line in lines[start:end]))
    extenders: list[Obj] = config["extenders"]
    for e in extenders:
        e["urlPrefix"] = url
    return extenders


def start_node_pod(release: Release, node: UmlNode, lvmd_config: str) -> None:
    """The chart's topolvm-node container in ``node``'s guest as its ServiceAccount, lvmd
    embedded (``--config`` gets ``lvmd_config``, the chart's ConfigMap content, plus the
    guest's ``lvm-command-prefix``: no nsenter in a guest without a container)."""
    ds = release.workload("DaemonSet", "node")
    spec = ds["spec"]["template"]["spec"]
    [c] = [c for c in spec["containers"] if c["name"] == "topolvm-node"]
    fields = {"metadata.namespace": release.namespace, "spec.nodeName": node.name,
              "metadata.name": f"{ds['metadata']['name']}-{node.name}"}  # fmt: skip
    folder = node.workdir / node.name
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "chart-lvmd.yaml"
    config.write_text(yaml.safe_dump({**yaml.safe_load(lvmd_config), "lvm-command-prefix": [LVM]}))
    argv = [f"--config={config}" if a.startswith("--config=") else a
            for a in localize(argv_of(c)[1:], CSI_SOCKET)]  # fmt: skip
    server = f"https://{host_address(node.index)}:{API_PORT}"
    token = release.token(spec["serviceAccountName"])
    kubeconfig = release.cp.write_kubeconfig(folder / "kubeconfig-chart", server, token)
    node.exec("mkdir", "-p", "/run/topolvm")
    node.spawn("topolvm-node", [sys.executable, "-m", "topolvm", *argv,
                                f"--kubeconfig={kubeconfig}"], env_of(c, fields))  # fmt: skip


FORBIDDEN = re.compile(r"\b403\b|[Ff]orbidden")


def forbidden_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if FORBIDDEN.search(line)]

"""charts/topolvm installed into the test bed the way a user installs it: ``helm install``, and
the kubelets of the bed's Kubernetes nodes run its pods in containerd from the images their
system disk holds (devtools/nodeimages.py; ``imagePullPolicy: IfNotPresent``, nothing pulled).

:func:`testbed_values` are the only values the test bed adds to a user's: those image tags, the
built-in kubelet registration and liveness endpoints (csi-node-driver-registrar and livenessprobe
are not buildable here: not on the Go module proxy), and a node selector so that the DaemonSets
stay on the bed's own nodes (other tests' simulated Nodes have no kubelet).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devtools import nodeimages
from devtools.helm import helm
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.process import HarnessError

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "topolvm"
Obj = dict[str, Any]


def testbed_values(node_selector: dict[str, str]) -> Obj:
    """What the test bed adds to a user's values (merge with :func:`merged`)."""
    sidecars = {i.name.rsplit("/", 1)[-1].split(":")[0]: i.name for i in nodeimages.sidecars()}
    selector = {"nodeSelector": dict(node_selector)}
    return {
        "image": {
            "pullPolicy": "IfNotPresent",
            "csi": {
                "csiProvisioner": sidecars["csi-provisioner"],
                "csiResizer": sidecars["csi-resizer"],
                "csiSnapshotter": sidecars["csi-snapshotter"],
            },
        },
        "csiSidecars": {"nodeDriverRegistrar": False, "livenessProbe": False},
        "node": selector,
        "lvmd": selector,
        "controller": selector,
        "scheduler": selector,
    }


def merged(base: Obj, extra: Obj) -> Obj:
    """``base`` with ``extra`` merged in, dictionaries key by key (as helm merges values)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


@dataclass
class Release:
    """A Helm release of charts/topolvm in the test bed, installed as admin."""

    cp: ControlPlane
    name: str
    namespace: str
    chart: Path = CHART

    def helm(self, *args: str) -> str:
        env = {"KUBECONFIG": str(self.cp.kubeconfig), "HELM_CACHE_HOME": str(self._home("cache")),
               "HELM_CONFIG_HOME": str(self._home("config")),
               "HELM_DATA_HOME": str(self._home("data")), "HOME": str(self._home("home")),
               "KUBECACHEDIR": str(self._home("kube-cache")), "PATH": "/usr/bin:/bin"}  # fmt: skip
        res = subprocess.run([str(helm()), *args], capture_output=True, text=True, env=env,
                             timeout=300, check=False)  # fmt: skip
        if res.returncode != 0:
            raise HarnessError(f"helm {' '.join(args)}: {res.stderr.strip()}")
        return res.stdout

    def _home(self, what: str) -> Path:
        path = self.cp.workdir / "helm" / what
        path.mkdir(parents=True, exist_ok=True)
        return path

    def install(self, values: Obj, *extra: str) -> str:
        return self._apply("install", values, "--create-namespace", *extra)

    def upgrade(self, values: Obj, *extra: str) -> str:
        return self._apply("upgrade", values, *extra)

    def _apply(self, verb: str, values: Obj, *extra: str) -> str:
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

    def pods(self) -> list[Obj]:
        out = self.cp.kubectl("get", "pods", "-n", self.namespace, "-l",
                              f"app.kubernetes.io/instance={self.name}", "-o", "json")  # fmt: skip
        items: list[Obj] = json.loads(out)["items"]
        return items

    def wait_running(self, expected: int, timeout: float = 300) -> list[Obj]:
        """Until ``expected`` pods of the release run with every container ready; a container
        that keeps failing is reported with its state and the pod's events."""
        deadline = time.monotonic() + timeout
        while True:
            pods = self.pods()
            ready = [p for p in pods if _all_ready(p)]
            if len(ready) >= expected:
                return ready
            if time.monotonic() > deadline:
                raise HarnessError(
                    f"release {self.name}: {len(ready)} of {expected} pods running after "
                    f"{timeout:.0f}s:\n{self.describe(pods)}"
                )
            time.sleep(1)

    def describe(self, pods: list[Obj] | None = None) -> str:
        lines = []
        for p in pods if pods is not None else self.pods():
            name = p["metadata"]["name"]
            for s in p.get("status", {}).get("containerStatuses") or []:
                state = f"restarts={s.get('restartCount')} state={s.get('state')}"
                lines.append(f"{name}/{s['name']}: ready={s.get('ready')} {state}")
            if not p.get("status", {}).get("containerStatuses"):
                lines.append(f"{name}: {p.get('status', {}).get('phase')} "
                             f"{p.get('status', {}).get('conditions')}")  # fmt: skip
        events = self.cp.kubectl("get", "events", "-n", self.namespace, check=False)
        return "\n".join([*lines, events[-3000:]])

    def logs(self) -> dict[str, str]:
        """Every container's log (and its previous run's, after a restart), by pod/container."""
        out = {}
        for p in self.pods():
            name = p["metadata"]["name"]
            for c in p["spec"]["containers"]:
                key = f"{name}/{c['name']}"
                out[key] = self.cp.kubectl("logs", "-n", self.namespace, name, "-c", c["name"],
                                           check=False)  # fmt: skip
                previous = self.cp.kubectl("logs", "-n", self.namespace, name, "-c", c["name"],
                                           "--previous", check=False)  # fmt: skip
                if previous:
                    out[f"{key} (previous)"] = previous
        return out


def _all_ready(pod: Obj) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return (pod.get("status", {}).get("phase") == "Running" and bool(statuses)
            and all(s.get("ready") for s in statuses))  # fmt: skip


# HTTP 403, or the word; not the digits of a decimal ("secs": 0.403) or of a longer number
FORBIDDEN = re.compile(r"(?<![\w.])403(?!\w|\.\d)|[Ff]orbidden")


def forbidden_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if FORBIDDEN.search(line)]

"""Running ``topolvm doctor`` against the test bed's real control plane, and building the
objects its checks look at (namespaces, simulated nodes) so that each test removes them."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.testbed.controlplane import ControlPlane
from tests.cluster_fixtures import unique

Doc = dict[str, Any]


async def run(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """A command, without blocking the event loop (a test's webhook server may run in it):
    (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


async def doctor(cp: ControlPlane, *args: str, kubeconfig: Path | None = None) -> tuple[int, Doc]:
    """``topolvm doctor -o json`` as a user runs it: (exit code, JSON document)."""
    code, out, err = await run(
        sys.executable, "-m", "topolvm", "doctor", "-o", "json",
        f"--kubeconfig={kubeconfig or cp.kubeconfig}", *args,
    )  # fmt: skip
    assert out, f"doctor printed nothing (exit {code}): {err}"
    doc: Doc = json.loads(out)
    return code, doc


def about(doc: Doc, check: str, name: str) -> list[Doc]:
    """The findings of ``check`` that name an object called ``name``."""
    return [
        f for f in doc["findings"]
        if f["check"] == check and any(o["name"] == name for o in f["objects"])
    ]  # fmt: skip


def one(doc: Doc, check: str, name: str) -> Doc:
    found = about(doc, check, name)
    assert len(found) == 1, f"expected one {check} finding about {name}:\n" + json.dumps(
        doc["findings"], indent=1
    )
    return found[0]


@dataclass
class Made:
    """Objects a test made on the real cluster, removed by :meth:`clean` (force where no kubelet
    would confirm a deletion, finalizers dropped where no controller would)."""

    cp: ControlPlane
    namespaces: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    cluster_objects: list[tuple[str, str]] = field(default_factory=list)

    def namespace(self) -> str:
        ns = unique("doctor")
        self.cp.kubectl("create", "namespace", ns)
        self.namespaces.append(ns)
        return ns

    def node(self, annotations: dict[str, str] | None = None) -> str:
        name = unique("docnode")
        self.cp.add_node(name)
        self.nodes.append(name)
        if annotations:
            self.cp.kubectl("annotate", "node", name, *(f"{k}={v}" for k, v in annotations.items()))
        return name

    def account(self, rules: list[Doc], workdir: Path) -> Path:
        """A kubeconfig for a new ServiceAccount whose only rights are a ClusterRole of
        ``rules``: a user with those permissions."""
        ns, name = self.namespace(), unique("doctor-user")
        self.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": {"name": name}, "rules": rules})  # fmt: skip
        self.cluster_objects.append(("clusterrole", name))
        k = self.cp.kubectl
        k("create", "serviceaccount", "-n", ns, "user")
        k("create", "clusterrolebinding", name, f"--clusterrole={name}",
          f"--serviceaccount={ns}:user")  # fmt: skip
        self.cluster_objects.append(("clusterrolebinding", name))
        token = k("create", "token", "-n", ns, "user").strip()
        return self.cp.write_kubeconfig(workdir / name, self.cp.server, token)

    def apply(self, *objs: Doc) -> None:
        for o in objs:
            if not o["metadata"].get("namespace") and o["kind"] in CLUSTER_KINDS:
                self.cluster_objects.append((o["kind"].lower(), o["metadata"]["name"]))
        self.cp.apply(*objs)

    def clean(self) -> None:
        k = self.cp.kubectl
        for ns in self.namespaces:
            k("delete", "pods", "--all", "-n", ns, "--force", "--grace-period=0", check=False)
            k("delete", "namespace", ns, "--wait=false", check=False)
        for kind, name in reversed(self.cluster_objects):
            k("patch", kind, name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
              check=False)  # fmt: skip
            k("delete", kind, name, "--ignore-not-found", "--wait=false", check=False)
        for name in self.nodes:
            k("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)
            k("delete", "csinode", name, "--ignore-not-found", "--wait=false", check=False)


CLUSTER_KINDS = {
    "StorageClass", "CSIDriver", "LogicalVolume", "MutatingWebhookConfiguration",
    "PersistentVolume",
}  # fmt: skip


def made(cp: ControlPlane) -> Iterator[Made]:
    m = Made(cp)
    try:
        yield m
    finally:
        m.clean()


def sc(name: str, *, provisioner: str = "topolvm.io", device_class: str | None = "ssd",
       binding: str = "WaitForFirstConsumer", **extra: Any) -> Doc:  # fmt: skip
    params = {} if device_class is None else {f"{provisioner}/device-class": device_class}
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name}, "provisioner": provisioner, "parameters": params,
            "volumeBindingMode": binding, **extra}  # fmt: skip


def pvc(name: str, ns: str, sc_name: str, size: str = "1Gi") -> Doc:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": sc_name,
                     "resources": {"requests": {"storage": size}}}}  # fmt: skip


def pod(name: str, ns: str, *claims: str, **spec: Any) -> Doc:
    container: Doc = {"name": "app", "image": "registry.invalid/app:1"}
    if claims:
        container["volumeMounts"] = [{"name": c, "mountPath": f"/{c}"} for c in claims]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [container], "automountServiceAccountToken": False,
                     "volumes": [{"name": c, "persistentVolumeClaim": {"claimName": c}}
                                 for c in claims], **spec}}  # fmt: skip


def logical_volume(name: str, node: str, group: str = "topolvm.io", **meta: Any) -> Doc:
    return {"apiVersion": f"{group}/v1", "kind": "LogicalVolume",
            "metadata": {"name": name, **meta},
            "spec": {"name": name, "nodeName": node, "deviceClass": "ssd",
                     "size": "1Gi"}}  # fmt: skip

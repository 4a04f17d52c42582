"""What tests/test_cluster_transfer_faults.py needs to catch and check real transfer tokens:
a stand-in node whose "transfer port" is the test's own and keeps the token a receiver shows it,
and the chart's rules for the tokens a node makes (Role, ValidatingAdmissionPolicy) applied to
the real API server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import yaml
from lightkube import AsyncClient
from lightkube.models.authentication_v1 import TokenReviewSpec
from lightkube.resources.authentication_v1 import TokenReview

from devtools.helm import helm
from devtools.testbed.controlplane import TRANSFER_ACCOUNT, ControlPlane, host_address
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import unique
from topolvm.constants import NORMAL
from topolvm.k8s import api
from topolvm.transfer import messages
from topolvm.transfer.errors import Refused
from topolvm.transfer.jobs import Job, Limits
from topolvm.transfer.metrics import TransferMetrics
from topolvm.transfer.server import TransferServer

CHART = Path(__file__).resolve().parent.parent / "charts" / "topolvm"


@contextlib.asynccontextmanager
async def stand_in_node(
    cp: ControlPlane, receiver: UmlNode, made: list[str], lv: Any
) -> AsyncIterator[tuple[str, asyncio.Future[str]]]:
    """A Node ``c`` (an API object) whose transfer endpoint is a port of this test's, reached
    by ``receiver`` on its link to the host, a volume "on c" and a copy of it that
    ``receiver`` fills: ``receiver``'s topolvm-node connects and shows its token for c's port,
    which the port keeps (the future) and refuses ``busy``. ``lv(name, node, source)`` makes a
    LogicalVolume object; ``made`` collects their names (removed by the caller)."""
    name = unique("standin")
    shown: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def authorise(hello: messages.Hello) -> Job:
        if not shown.done():
            shown.set_result(hello.token)
        raise Refused("busy", "a test's stand-in port: it keeps the token")

    server = TransferServer(name, authorise, None, Limits(), TransferMetrics(None, name))  # type: ignore[arg-type]
    await server.start("0.0.0.0", 0)
    try:
        ann = {NORMAL.transfer_endpoint_annotation: f"{host_address(receiver.index)}:{server.port}",
               NORMAL.transfer_cert_annotation: server.fingerprint}  # fmt: skip
        cp.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                  "annotations": ann, "labels": {"kubernetes.io/hostname": name}}})  # fmt: skip
        source, target = unique("src"), unique("copy")
        made += [target, source]
        cp.apply(lv(source, name, ""))
        status = json.dumps({"status": {"volumeID": "not-a-volume"}})  # "holds its data"
        cp.kubectl("patch", "logicalvolumes.topolvm.io", source, "--subresource=status",
                   "--type=merge", "-p", status)  # fmt: skip
        cp.apply(lv(target, receiver.name, source))
        yield name, shown
    finally:
        for obj in made[-2:]:
            cp.kubectl("delete", "logicalvolumes.topolvm.io", obj, "--wait=false", check=False)
        cp.kubectl("delete", "node", name, "--wait=false", check=False)
        await server.stop()


async def review(client: AsyncClient, token: str, audience: str) -> dict[str, Any]:
    """What the API server says of ``token`` for ``audience``."""
    spec = TokenReviewSpec(token=token, audiences=[audience])
    return (await api.create(client, TokenReview(spec=spec))).get("status") or {}


@contextlib.contextmanager
def token_rules(cp: ControlPlane) -> Iterator[None]:
    """The chart's Role (TokenRequest for topolvm-node's own account) and the
    ValidatingAdmissionPolicy rendered with it, for a release whose node account is the test
    bed's and with node.ownNodeOnly off (the tokens' policy stands on its own), applied,
    removed afterwards."""
    namespace, account = TRANSFER_ACCOUNT
    release = account.removesuffix("-node")
    out = subprocess.run(
        [str(helm()), "template", release, str(CHART), "-n", namespace,
         "--set", "node.ownNodeOnly=false"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    wanted = {"Role", "RoleBinding", "ValidatingAdmissionPolicy",
              "ValidatingAdmissionPolicyBinding"}  # fmt: skip
    docs = [d for d in yaml.safe_load_all(out) if d and d["kind"] in wanted
            and d["metadata"]["name"].startswith(account)]  # fmt: skip
    assert {d["kind"] for d in docs} == wanted, [d["metadata"]["name"] for d in docs]
    policies = [d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    assert policies == [f"{account}-tokens"], policies  # the own-node one is off
    cp.apply(*docs)
    try:
        yield
    finally:
        for d in docs:
            ns = ["-n", namespace] if d["kind"] in ("Role", "RoleBinding") else []
            cp.kubectl("delete", d["kind"].lower(), d["metadata"]["name"], *ns, check=False)


def as_account(cp: ControlPlane, token: str, label: str) -> Any:
    """kubectl as the bearer of ``token``."""
    config = cp.write_kubeconfig(cp.workdir / f"token-{label}", cp.server, token)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(cp.bins["kubectl"]), f"--kubeconfig={config}", *args],
                              capture_output=True, text=True, check=False, timeout=60)  # fmt: skip

    return run


def node_pod(name: str, node: str) -> dict[str, Any]:
    """A pod object of topolvm-node's account on ``node`` (never run: no kubelet there)."""
    namespace, account = TRANSFER_ACCOUNT
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node, "serviceAccountName": account,
                     "automountServiceAccountToken": False,
                     "containers": [{"name": "c", "image": "registry.invalid/none"}]}}  # fmt: skip


def admin_review(cp: ControlPlane, token: str, aud: str) -> dict[str, Any]:
    """The API server's review of ``token`` for ``aud``, asked by the admin (authenticated)."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": [aud]}}  # fmt: skip
    out = cp.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(body))
    status: dict[str, Any] = json.loads(out)["status"]
    assert status.get("authenticated"), status
    return status

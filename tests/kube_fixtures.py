"""Fixtures for tests against the Kubernetes API emulator.

Import them explicitly: ``from tests.kube_fixtures import kube, kube_client  # noqa: F401``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User

from tests.kube_emulator import KubeEmulator
from topolvm.move.prepull import COMPONENT, COMPONENT_LABEL


def client_for(emu: KubeEmulator, namespace: str = "default") -> AsyncClient:
    """A lightkube AsyncClient talking to ``emu`` (the caller closes it)."""
    # KubeConfig.from_server() has no user, which lightkube 1.0.1 rejects ("Missing user").
    config = KubeConfig.from_one(cluster=Cluster(server=emu.url), user=User(), namespace=namespace)
    return AsyncClient(config=config, trust_env=False)


@pytest.fixture
async def kube() -> AsyncIterator[KubeEmulator]:
    """A started :class:`KubeEmulator`, stopped after the test."""
    emu = KubeEmulator(bookmark_interval=0.2)
    await emu.start()
    try:
        yield emu
    finally:
        await emu.stop()


@pytest.fixture
async def kube_client(kube: KubeEmulator) -> AsyncIterator[AsyncClient]:
    """A lightkube AsyncClient pointed at the ``kube`` emulator, closed after the test."""
    client = client_for(kube)
    try:
        yield client
    finally:
        await client.close()


def write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig file for ``server``, for processes that tests and the demo start."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "test"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def pulled_at_once(obj: dict[str, Any]) -> None:
    """An emulator ``on_create`` hook: the target's kubelet takes a move's pre-pull pod
    (src/topolvm/move/prepull.py), finds its images there and fails to start its containers,
    as a real one does with the pod's command that does not exist."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if obj.get("kind", "Pod") != "Pod" or labels.get(COMPONENT_LABEL) != COMPONENT:
        return
    containers = (obj.get("spec") or {}).get("containers") or []
    obj["status"] = {"phase": "Failed", "containerStatuses": [
        {"name": c["name"], "image": c["image"], "imageID": f"sha256:{i:064x}", "ready": False,
         "restartCount": 0,
         "state": {"terminated": {"reason": "StartError", "exitCode": 128}}}
        for i, c in enumerate(containers)]}  # fmt: skip

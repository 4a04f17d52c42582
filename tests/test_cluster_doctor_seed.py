"""The outage this project was born from, replayed on the real control plane, and
``topolvm doctor`` naming it, printing the fix, and reporting healthy once the fix is applied.

One worker (a UML guest with real LVM) whose topolvm-node publishes
``capacity.topolvm.io/ssd: "257693843456"`` (a 240 GiB volume group) and, like upstream's, does
not advertise the marker resource; a Vault StatefulSet of three pods, each with a 10Gi data and
a 5Gi audit PVC; the pod webhook in upstream's marker mode puts ``topolvm.io/capacity: 1`` on
the pods; kube-scheduler has no extender. The real kube-scheduler reports
``Insufficient topolvm.io/capacity`` while the worker has 240 GiB free."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolumeClaim, Pod

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from tests.cluster_fixtures import GROUP_LABEL, NodeSet, node_annotations, short_name
from tests.cluster_webhook_helpers import served_by_api_server, webhook
from tests.doctor_helpers import doctor, run
from tests.helpers import eventually
from tests.lvm_fixtures import THICK_DC
from topolvm.k8s import api

pytestmark = pytest.mark.cluster
SEED_FREE = "257693843456"  # 240 GiB less LVM's metadata area: 61439 extents of 4 MiB
CAUSE = "pod webhook adds topolvm.io/capacity but kube-scheduler has no extender for it"


def vault(ns: str, sc: str, group: str) -> dict[str, Any]:
    def claim(name: str, size: str) -> dict[str, Any]:
        return {"metadata": {"name": name},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": sc,
                         "resources": {"requests": {"storage": size}}}}  # fmt: skip

    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "vault", "namespace": ns},
        "spec": {
            "serviceName": "vault", "replicas": 3, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "vault"}},
            "template": {
                "metadata": {"labels": {"app": "vault"}},
                "spec": {
                    "nodeSelector": {GROUP_LABEL: group},
                    "automountServiceAccountToken": False,
                    "containers": [{
                        "name": "vault", "image": "registry.invalid/vault:1.15",
                        "volumeMounts": [{"name": "data", "mountPath": "/vault/data"},
                                         {"name": "audit", "mountPath": "/vault/audit"}],
                    }],
                },
            },
            "volumeClaimTemplates": [claim("data", "10Gi"), claim("audit", "5Gi")],
        },
    }  # fmt: skip


async def test_seed_outage_is_named_first_and_its_printed_fix_schedules_the_pods(
    control_plane: ControlPlane,
    driver: DriverStack,
    cluster_client: AsyncClient,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    cp = control_plane
    nodes = NodeSet(cp, short_name(request), tmp_path)
    try:
        [worker] = nodes.make(1, vg_gib=[240], disks=1, disk_gib=241)
        worker.start_topolvm_node(
            cp, [{**THICK_DC, "spare-gb": 0}], "--advertise-capacity-resource=false"
        )

        seen: dict[str, str] = {}

        async def published() -> bool:
            seen.update(await node_annotations(cluster_client, worker.name))
            return seen.get("capacity.topolvm.io/ssd") == SEED_FREE

        await eventually("the seed's capacity annotation", published, timeout=120,
                         details=lambda: f"{seen}; {worker.lvm('vgs')}")  # fmt: skip
        async with webhook(cp, cluster_client, marker_mode=True) as hook:
            await served_by_api_server(hook)
            ns = hook.ns
            cp.apply(vault(ns, hook.classes["ssd"], worker.labels[GROUP_LABEL]))
            pods = [f"vault-{i}" for i in range(3)]

            async def stranded() -> bool:
                for name in pods:
                    obj = await api.get(cluster_client, Pod, name, namespace=ns)
                    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
                    if not any("Insufficient topolvm.io/capacity" in str(c.get("message"))
                               for c in conditions):  # fmt: skip
                        return False
                return True

            await eventually("kube-scheduler's Insufficient topolvm.io/capacity", stranded,
                             timeout=120)  # fmt: skip

            code, doc = await doctor(cp)
            first = doc["findings"][0]
            assert code == 1
            assert (first["check"], first["cause"]) == ("marker-without-extender", CAUSE), doc
            assert {o["name"] for o in first["objects"] if o["kind"] == "Pod"} >= set(pods)
            free = [e for e in first["evidence"] if e.startswith(f"node {worker.name} has free")]
            assert free and "ssd 240.0 GiB" in free[0], first["evidence"]
            _, text, _ = await run(
                sys.executable, "-m", "topolvm", "doctor", f"--kubeconfig={cp.kubeconfig}",
                "-n", ns,
            )  # fmt: skip
            assert f"cause: {CAUSE}" in text and "$ kubectl delete pod" in text, text

            [fix] = [f for f in first["fixes"] if "Storage Capacity Tracking" in f["summary"]]
            env = {**os.environ, "KUBECONFIG": str(cp.kubeconfig),
                   "PATH": f"{cp.bins['kubectl'].parent}:{os.environ['PATH']}"}  # fmt: skip
            for command in fix["commands"]:
                proc = await asyncio.create_subprocess_shell(command, env=env)
                assert await proc.wait() == 0, command

            async def all_bound() -> bool:
                claims, _ = await api.list_all(cluster_client, PersistentVolumeClaim,
                                               namespace=ns)  # fmt: skip
                phases = [c.get("status", {}).get("phase") for c in claims]
                placed = [
                    ((await api.get(cluster_client, Pod, p, namespace=ns)) or {})
                    .get("spec", {}).get("nodeName")
                    for p in pods
                ]  # fmt: skip
                return len(claims) == 6 and phases == ["Bound"] * 6 and placed == [worker.name] * 3

            await eventually("3 pods scheduled and 6 PVCs bound", all_bound, timeout=240)
            assert len(worker.lvs("vg1")) == 6
            code, doc = await doctor(cp, "-n", ns)
            assert (code, doc["findings"]) == (0, []), json.dumps(doc, indent=1)

            cp.kubectl("delete", "statefulset", "-n", ns, "vault", "--cascade=orphan")
            cp.kubectl("delete", "pods", "--all", "-n", ns, "--force", "--grace-period=0")
            cp.kubectl("delete", "pvc", "--all", "-n", ns, "--wait=false")
            await eventually("the LVs removed", lambda: asyncio.to_thread(
                lambda: not worker.lvs("vg1")), timeout=180, interval=1)  # fmt: skip
    finally:
        nodes.close()

"""Burst: 30 pods with one PVC each, created at once, on 3 UML nodes that together fit exactly
30 volumes. Every pod must get its volume and its container run (real kubelets), and no node
may be promised more than it has: CreateVolume checks the node's free space minus the volumes in
flight there and answers RESOURCE_EXHAUSTED otherwise, so csi-provisioner asks kube-scheduler
for another node."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.process import http_get
from tests.cluster_fixtures import UmlNodes, unique
from tests.helpers import eventually
from tests.lvm_fixtures import THICK
from tests.provisioning import NS, GiB, Scenario, claim, pod, runtime_logs
from topolvm.k8s import api

pytestmark = pytest.mark.cluster

PODS = 30
REPORT = Path(__file__).resolve().parent.parent / ".cache" / "burst-report.json"


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_thirty_pods_at_once_fill_three_nodes_exactly(
    control_plane: ControlPlane,
    driver: DriverStack,
    uml_nodes: UmlNodes,
    cluster_client: AsyncClient,
) -> None:
    # 11.01 GiB VGs: 2818 extents of 4 MiB; minus the 1 GiB spare that is room for exactly
    # ten 1 GiB volumes per node by the capacity annotations (lvmd itself would take 11).
    nodes = uml_nodes(3, vg_gib=[11.01] * 3, kubelet=True)
    for n in nodes:
        n.start_topolvm_node(control_plane, [THICK])
    s = Scenario(control_plane, cluster_client, nodes)
    await s.record()
    for name, ann in s.before.items():
        assert int(ann["capacity.topolvm.io/ssd"]) // GiB == 10, (name, ann)
    metrics_url = f"http://127.0.0.1:{driver.metrics_port}/metrics"
    before = http_get(metrics_url).decode()
    timeline: list[str] = []  # when each node's annotation changed, for a failure's message
    watcher = asyncio.create_task(_annotation_changes(s, timeline))
    try:
        sc = s.sc(fs_type="ext4")
        names = [(unique("burst"), unique("data")) for _ in range(PODS)]
        started = time.monotonic()
        objs = []
        for app, data in names:
            objs += [claim(data, sc, "1Gi"), pod(app, s.group, [data])]
        s.apply(*objs)
        apps = {app for app, _ in names}

        async def all_running() -> bool:
            items, _ = await api.list_all(cluster_client, Pod, namespace=NS)
            up = {p["metadata"]["name"] for p in items if p["metadata"]["name"] in apps
                  and all(c.get("ready") for c in p.get("status", {}).get("containerStatuses")
                          or [{}])}  # fmt: skip
            return len(up) == PODS

        def stuck() -> str:  # which pods are not running, where, and what their nodes said
            pods = s.cp.kubectl("get", "pods", "-n", NS, "-o", "wide", check=False)
            events = s.cp.kubectl("get", "events", "-n", NS, "--sort-by=.lastTimestamp",
                                  check=False)  # fmt: skip
            return f"{runtime_logs(nodes)}\n{pods[-4000:]}\n{events[-4000:]}\n{s._state()}"

        await eventually(f"{PODS} pods Running", all_running, timeout=900, details=stuck)
        elapsed = time.monotonic() - started
        after = http_get(metrics_url).decode()

        def calls(code: str) -> float:
            return sum(
                sign * _metric(text, "grpc_server_handled_total", grpc_method="CreateVolume",
                               grpc_code=code)
                for sign, text in ((1, after), (-1, before))
            )  # fmt: skip

        exhausted, created = calls("RESOURCE_EXHAUSTED"), calls("OK")
        per_node = {n.name: len(n.lvs("vg1")) for n in nodes}
        watcher.cancel()
        made = "\n".join(f"{n.name}: " + " ".join(sorted(n.lvm(
            "lvs", "--noheadings", "-o", "lv_time", "--config", "report/time_format=\"%T\"",
            "vg1").split())) for n in nodes)  # fmt: skip
        assert per_node == {n.name: 10 for n in nodes}, (
            f"{per_node}; CreateVolume OK {created}, RESOURCE_EXHAUSTED {exhausted}\n"
            f"LVs made at:\n{made}\nannotations:\n" + "\n".join(timeline)
        )
        for n in nodes:
            assert sum(int(lv["lv_size"]) for lv in n.lvs("vg1").values()) == 10 * GiB
        report = {"pods": PODS, "seconds_to_all_running": round(elapsed, 1),
                  "create_volume_ok": created, "create_volume_resource_exhausted": exhausted,
                  "lvs_per_node": per_node}  # fmt: skip
        REPORT.parent.mkdir(exist_ok=True)
        REPORT.write_text(json.dumps(report, indent=1))
        print(f"\nburst: {report}")
    finally:
        watcher.cancel()
        await asyncio.shield(s.clean())


async def _annotation_changes(s: Scenario, into: list[str]) -> None:
    last: dict[str, str | None] = {}
    while True:
        for name, ann in (await s.annotations()).items():
            value = ann.get("capacity.topolvm.io/ssd")
            if value != last.get(name, ""):
                last[name] = value
                shown = f"{int(value) / GiB:.2f} GiB" if value else str(value)
                into.append(f"{time.strftime('%H:%M:%S')} {name}: {shown}")
        await asyncio.sleep(0.5)

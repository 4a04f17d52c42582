"""Helpers of the move tests (docs/mobility.md, "Move"): a StatefulSet whose pod writes a
numbered log without pause, the pod webhook that holds pods of a claim being moved, the wait
for a VolumeMove to end, and the check that the nodes hold no LV beyond their LogicalVolumes'
(tests/invariants.py), made after every move, rollback, drain, restore and clone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration

from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import GROUP_LABEL
from tests.cluster_webhook_helpers import configuration, webhook
from tests.helpers import eventually
from tests.invariants import ClusterView, DeviceClass, Lv, NodeView, volume_violations
from tests.provisioning import NS, Scenario, busybox
from topolvm.constants import NORMAL
from topolvm.k8s import api
from topolvm.k8s.moveobject import MovePhase, VolumeMoveObject, manifest

# one numbered line at a time, each synced; on SIGTERM a last line "stop N", synced
WRITER = (
    "i=$(wc -l < /data/log 2>/dev/null || echo 0); trap 'echo stop $i >> /data/log; sync; "
    "exit 0' TERM; while true; do echo $i >> /data/log; sync; i=$((i+1)); sleep 0.02 & wait; "
    "done"
)


def writer_set(
    name: str, sc: str, group: str, size: str = "1Gi", replicas: int = 1, logs_sc: str = "",
    logs_size: str = "512Mi", image: str = "",
) -> dict[str, Any]:  # fmt: skip
    """A one-replica StatefulSet (claim ``data-<name>-0``) whose pod writes without pause, on
    a node of ``group``; with ``logs_sc`` its pods mount a second claim (``logs-<name>-0``,
    ``logs_size``) at /logs."""
    labels = {"app": name}
    mounts = [{"name": "data", "mountPath": "/data"}]
    templates = [{
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": sc,
                 "resources": {"requests": {"storage": size}}},
    }]  # fmt: skip
    if logs_sc:
        mounts.append({"name": "logs", "mountPath": "/logs"})
        templates.append({
            "metadata": {"name": "logs"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": logs_sc,
                     "resources": {"requests": {"storage": logs_size}}},
        })  # fmt: skip
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas, "serviceName": name, "selector": {"matchLabels": labels},
            "podManagementPolicy": "Parallel",
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 10, "automountServiceAccountToken": False,
                    "nodeSelector": {GROUP_LABEL: group},
                    "containers": [{
                        "name": "writer", "image": image or busybox(),
                        "command": ["sh", "-c", WRITER],
                        "volumeMounts": mounts,
                    }],
                },
            },
            "volumeClaimTemplates": templates,
        },
    }  # fmt: skip


def holding_set(name: str, claim: str, group: str) -> dict[str, Any]:
    """A one-replica StatefulSet whose pod (``<name>-0``, on a node of ``group``) mounts the
    existing claim ``claim`` at /data and sleeps."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": 1, "serviceName": name, "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False,
                    "nodeSelector": {GROUP_LABEL: group},
                    "containers": [{
                        "name": "app", "image": busybox(), "command": ["sleep", "1000000"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
                },
            },
        },
    }  # fmt: skip


@contextlib.asynccontextmanager
async def move_webhook(cp: ControlPlane, client: AsyncClient) -> AsyncIterator[None]:
    """topolvm-controller's pod webhook for the tests' namespace (it holds the pods of a claim
    being moved with a scheduling gate): the configuration carries the hook's name, so that
    its certificate checks write the caBundle into it."""
    async with webhook(cp, client, marker_mode=False, configure=False) as hook:
        await api.create(client, MutatingWebhookConfiguration.from_dict(
            configuration(hook.ns, NS, hook.port)))  # fmt: skip

        async def trusted() -> bool:
            obj = await api.get(client, MutatingWebhookConfiguration, hook.ns)
            hooks = (obj or {}).get("webhooks") or [{}]
            return bool((hooks[0].get("clientConfig") or {}).get("caBundle"))

        await eventually("the move webhook's caBundle", trusted)
        yield  # the hook's exit deletes the configuration


async def start_move(
    client: AsyncClient, claim: str, target: str = "", together: tuple[str, ...] = ()
) -> None:
    res = api.volumemove_resource(NORMAL)
    body = manifest(NORMAL.group, NS, claim, target, together)
    await api.create(client, res.from_dict(body))


async def move_done(client: AsyncClient, claim: str, timeout: float = 300) -> VolumeMoveObject:
    res = api.volumemove_resource(NORMAL)
    seen: list[str] = []

    async def done() -> VolumeMoveObject | None:
        obj = await api.get(client, res, claim, namespace=NS)
        if obj is None:
            return None
        vm = VolumeMoveObject.from_dict(obj)
        if not seen or seen[-1] != vm.status.phase:
            seen.append(vm.status.phase)
        return vm if vm.status.phase in MovePhase.DONE else None

    def details() -> str:
        return f"phases seen: {seen}"

    moved: VolumeMoveObject = await eventually(
        f"the move of {claim}", done, timeout=timeout, details=details
    )
    return moved


async def delete_move(client: AsyncClient, claim: str) -> None:
    await api.delete(client, api.volumemove_resource(NORMAL), claim, namespace=NS)


async def phase_of(client: AsyncClient, claim: str) -> str:
    obj = await api.get(client, api.volumemove_resource(NORMAL), claim, namespace=NS)
    return VolumeMoveObject.from_dict(obj).status.phase if obj is not None else ""


async def at_phases(
    client: AsyncClient, claim: str, act: dict[str, Callable[[], None]], timeout: float = 300
) -> list[str]:
    """Run ``act[phase]`` once when the move of ``claim`` is seen in that phase (polled every
    0.1 s), until the move is done; the phases acted in, in order. On this thread: a process
    started from a worker thread dies with it (PR_SET_PDEATHSIG)."""
    acted: list[str] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        phase = await phase_of(client, claim)
        if phase in act and phase not in acted:
            acted.append(phase)
            act[phase]()
        if phase in MovePhase.DONE:
            return acted
        await asyncio.sleep(0.1)
    raise AssertionError(f"the move of {claim} did not end; faults made in {acted}")


def check_log(lines: list[str], written_before: int) -> None:
    """The writer's log holds every number up to its stop, then "stop N" (no write lost). N is
    the next number, or the last one written when SIGTERM came before its increment."""
    stop = next(i for i, line in enumerate(lines) if line.startswith("stop "))
    assert lines[:stop] == [str(i) for i in range(stop)], "a write was lost"
    assert lines[stop] in (f"stop {stop}", f"stop {stop - 1}"), lines[stop - 2 : stop + 2]
    assert stop > written_before, (stop, written_before)


def budget(name: str, app: str, min_available: int) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"minAvailable": min_available,
                     "selector": {"matchLabels": {"app": app}}}}  # fmt: skip


async def moves_now(client: AsyncClient) -> list[VolumeMoveObject]:
    items, _ = await api.list_all(client, api.volumemove_resource(NORMAL), namespace=NS)
    return [VolumeMoveObject.from_dict(o) for o in items]


def _lvm_view(nodes: list[UmlNode], vgs: tuple[str, ...]) -> dict[str, NodeView]:
    return {n.name: NodeView(n.name, {vg: {name: Lv(int(r["lv_size"]), r["lv_attr"],
                                                    r.get("pool_lv") or "")
                                           for name, r in n.lvs(vg).items()} for vg in vgs},
                             {})
            for n in nodes}  # fmt: skip


async def lvs_accounted(
    s: Scenario, after: str, within: float = 10.0, vgs: tuple[str, ...] = ("vg1",)
) -> None:
    """Within ``within`` seconds of ``after`` (a move, a rollback, a drain, a restore, a
    clone): each node's LVs are exactly its LogicalVolumes' LVs, its thin pools and the cuts of
    copies still running (tests/invariants.py), and every LogicalVolume of these nodes has its
    LV. On failure: what is left, with LVM's word on it and what topolvm-node said of cuts."""
    classes = [DeviceClass(vg, vg, 0) for vg in vgs]
    last: list[str] = []

    async def holds() -> bool:
        nonlocal last
        nodes = await asyncio.to_thread(_lvm_view, s.nodes, vgs)
        objects, _ = await api.list_all(s.client, api.logicalvolume_resource(s.names))
        last = volume_violations(ClusterView(nodes, classes, [], objects, [], {}, s.names))
        return not last

    def details() -> str:
        lines = ["left:", *last]
        for n in s.nodes:
            for vg in vgs:
                out = n.lvm("lvs", vg, "-o", "lv_name,lv_size,origin,lv_tags,lv_attr")
                lines.append(f"{n.name} {vg}:\n{out}")
            said = [ln for ln in n.node_log(lines=400).splitlines() if "cut" in ln]
            lines.append(f"{n.name} topolvm-node on cuts:\n" + "\n".join(said[-25:]))
        return "\n".join(lines)

    await eventually(f"no LV left over {within:.0f} s after {after}", holds, timeout=within,
                     interval=1, details=details)  # fmt: skip

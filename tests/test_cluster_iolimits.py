"""IO limits per claim (docs/qos.md, issue 41) on the real control plane, the real
csi-provisioner and csi-resizer (ControllerModifyVolume), and a UML node with the real kubelet
and containerd (cgroupfs driver, cgroup v2, the test bed's kernel with block throttling).

Rates are measured inside the pod with direct-IO writes (busybox dd, oflag=direct); each test
states the rates it saw. A limit holds when the rate is at most 1.1 times the limit; the rate
without a limit is the baseline of the same run, never a fixed figure."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, PersistentVolumeClaim, Pod
from prometheus_client.parser import text_string_to_metric_families

from devtools.demo_qos import measured_rate, pod_io_max, write_script
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.driver import DriverStack
from devtools.testbed.umlnode import UmlNode
from tests.cluster_fixtures import unique
from tests.helpers import eventually
from tests.lvm_fixtures import THICK
from tests.provisioning import NS, MiB, Scenario, bound, claim, pod, pvc, shared_nodes
from topolvm.iolimits import NODE_CONDITION
from topolvm.k8s import api
from topolvm.node import podcgroup

pytestmark = pytest.mark.cluster
CLASS_LABEL = "topolvm-test=qos"


@pytest.fixture(scope="module")
def qos_nodes(
    control_plane: ControlPlane, driver: DriverStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[UmlNode]]:
    with shared_nodes(control_plane, tmp_path_factory.mktemp("qos"), "qos", [6], [THICK]) as nodes:
        yield nodes


@pytest.fixture
async def qos(
    control_plane: ControlPlane, qos_nodes: list[UmlNode], cluster_client: AsyncClient
) -> AsyncIterator[Scenario]:
    s = Scenario(control_plane, cluster_client, qos_nodes)
    await s.record()
    try:
        yield s
    finally:
        await s.clean()
        # the protection controller lets a class go once no claim or volume names it
        control_plane.kubectl("delete", "volumeattributesclass", "-l", CLASS_LABEL,
                              "--timeout=60s")  # fmt: skip


def vac(s: Scenario, **parameters: str) -> str:
    """A VolumeAttributesClass of this driver with ``parameters``: a keyword ``write_iops``
    is ``topolvm.io/write-iops``, OpenEBS's ``qos...`` keys stay as they are."""
    name = unique("vac")
    params = {k if k.startswith("qos") else "topolvm.io/" + k.replace("_", "-"): v
              for k, v in parameters.items()}  # fmt: skip
    key, value = CLASS_LABEL.split("=")
    s.cp.apply({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttributesClass",
                "metadata": {"name": name, "labels": {key: value}},
                "driverName": s.names.plugin, "parameters": params})  # fmt: skip
    return name


def limited_claim(name: str, sc: str, size: str, attribute_class: str | None) -> dict[str, Any]:
    c = claim(name, sc, size)
    if attribute_class:
        c["spec"]["volumeAttributesClassName"] = attribute_class
    return c


def write_rate(s: Scenario, app: str, path: str, *, block: str = "1M", count: int = 48) -> float:
    """Bytes per second of a direct-IO write of ``count`` blocks of ``block`` in the pod, timed
    there (/proc/uptime: 10 ms steps)."""
    out = s.cp.kubectl("exec", "-n", NS, app, "--", "sh", "-c", write_script(path, block, count))
    return measured_rate(out)


async def lv_of(s: Scenario, claim_name: str) -> dict[str, Any]:
    bound_pvc = await bound(s.client, claim_name)
    lv = await api.get(
        s.client, api.logicalvolume_resource(s.names), bound_pvc["spec"]["volumeName"]
    )
    assert lv is not None
    return lv


async def pod_uid(s: Scenario, app: str) -> str:
    obj = await api.get(s.client, Pod, app, namespace=NS)
    assert obj is not None
    return str(obj["metadata"]["uid"])


async def running_with(s: Scenario, sc: str, attribute_class: str) -> tuple[str, str, str]:
    """A 1 GiB claim of ``attribute_class`` and a pod that mounts it, running: the claim's and
    the pod's names, and the pod's UID."""
    data, app = unique("data"), unique("app")
    s.apply(limited_claim(data, sc, "1Gi", attribute_class), pod(app, s.group, [data]))
    await s.running(app)
    return data, app, await pod_uid(s, app)


def io_metrics(node: UmlNode, volume: str) -> dict[tuple[str, str], float]:
    """topolvm-node's IO-limit metrics of ``volume``: (name, key or kind) -> value."""
    text = node.http_get(8080, "/metrics")
    return {
        (m.name, m.labels.get("key") or m.labels.get("kind", "")): m.value
        for family in text_string_to_metric_families(text)
        for m in family.samples
        if m.name.startswith("topolvm_volume_io") and m.labels.get("volume") == volume
    }


def io_max(node: UmlNode, uid: str) -> str:
    text = pod_io_max(node, uid)
    assert text is not None, f"no cgroup with io.max for pod {uid} on {node.name}"
    return text


async def set_class(s: Scenario, claim_name: str, attribute_class: str) -> None:
    await api.patch_merge(s.client, PersistentVolumeClaim, claim_name,
                          {"spec": {"volumeAttributesClassName": attribute_class}},
                          namespace=NS)  # fmt: skip


async def current_class(s: Scenario, claim_name: str, attribute_class: str) -> None:
    async def check() -> bool:
        obj = await pvc(s.client, claim_name)
        st = (obj or {}).get("status") or {}
        return st.get("currentVolumeAttributesClassName") == attribute_class

    await eventually(f"{claim_name} in class {attribute_class}", check, timeout=120)


async def test_a_class_limits_a_pods_writes_and_a_new_class_changes_the_limit_live(
    qos: Scenario,
) -> None:
    s = qos
    sc = s.sc()
    slow = vac(s, write_bytes_per_second="20Mi")
    fast = vac(s, qosBandwithWritePerSec="50Mi")  # OpenEBS's key, carried over
    limited, free, app = unique("lim"), unique("free"), unique("app")
    s.apply(limited_claim(limited, sc, "1Gi", slow), limited_claim(free, sc, "1Gi", None),
            pod(app, s.group, [limited, free]))  # fmt: skip
    await s.running(app)
    lv = await lv_of(s, limited)
    assert lv["spec"]["ioLimits"] == {"writeBytesPerSecond": 20 * MiB}
    uid = await pod_uid(s, app)

    at_20 = write_rate(s, app, f"/{limited}/f")
    unlimited = write_rate(s, app, f"/{free}/f")
    print(f"direct 1 MiB writes: limited to 20 MiB/s {at_20 / MiB:.1f} MiB/s, "
          f"unlimited {unlimited / MiB:.1f} MiB/s")  # fmt: skip
    assert at_20 <= 1.1 * 20 * MiB
    assert unlimited > 1.1 * at_20

    # topolvm-node's metrics: the limit, the pod's writes on the device, its IO stall
    seen = io_metrics(s.nodes[0], lv["metadata"]["name"])
    print(f"metrics: {seen}")
    assert seen[("topolvm_volume_io_limit", "wbps")] == 20 * MiB
    assert seen[("topolvm_volume_io_total", "wbytes")] >= 48 * MiB
    assert seen[("topolvm_volume_io_stalled_seconds_total", "some")] > 0.5  # 48 MiB: ~2.4 s

    await set_class(s, limited, fast)
    await current_class(s, limited, fast)
    node = s.nodes[0]

    def raised() -> bool:
        return f"wbps={50 * MiB}" in io_max(node, uid)

    await eventually("the 50 MiB/s limit in force", raised, timeout=60, interval=0.5)
    at_50 = write_rate(s, app, f"/{limited}/f", count=120)
    print(f"after the class changed to 50 MiB/s: {at_50 / MiB:.1f} MiB/s")
    assert at_50 <= 1.1 * 50 * MiB
    assert at_50 > 1.1 * 20 * MiB
    obj = await api.get(s.client, Pod, app, namespace=NS)
    assert obj is not None and obj["metadata"]["uid"] == uid  # the same pod, not restarted
    assert all(c.get("restartCount", 0) == 0 for c in obj["status"]["containerStatuses"])


async def test_an_invalid_class_is_infeasible_and_changes_nothing(qos: Scenario) -> None:
    s = qos
    sc = s.sc()
    good = vac(s, write_iops="100")
    bad = vac(s, write_bytes_per_second="fast")
    data, _, uid = await running_with(s, sc, good)
    before = io_max(s.nodes[0], uid)
    assert "wiops=100" in before

    await set_class(s, data, bad)

    async def infeasible() -> dict[str, Any] | None:
        obj = await pvc(s.client, data)
        st = ((obj or {}).get("status") or {}).get("modifyVolumeStatus") or {}
        return st if st.get("status") == "Infeasible" else None

    status = await eventually("the modify marked Infeasible", infeasible, timeout=120)
    assert status["targetVolumeAttributesClassName"] == bad
    lv = await lv_of(s, data)
    assert lv["spec"]["ioLimits"] == {"writeIOPS": 100}
    assert io_max(s.nodes[0], uid) == before
    events = s.cp.kubectl("get", "events", "-n", NS, "--field-selector",
                          f"involvedObject.name={data}", "-o", "json")  # fmt: skip
    assert "write-bytes-per-second" in events  # the error names the key


async def test_an_iops_limit_holds_for_4k_direct_writes(qos: Scenario) -> None:
    s = qos
    sc = s.sc()
    iops = vac(s, write_iops="200")
    data, app, _ = await running_with(s, sc, iops)
    rate = write_rate(s, app, f"/{data}/f", block="4k", count=600) / 4096
    print(f"4 KiB direct writes at a 200 IOPS limit: {rate:.0f} IOPS")
    assert rate <= 1.1 * 200


async def test_a_per_gib_limit_grows_with_an_online_expansion(qos: Scenario) -> None:
    s = qos
    sc = s.sc(fs_type="xfs")
    per_gib = vac(s, write_bytes_per_second_per_gib="10Mi")
    data, _, uid = await running_with(s, sc, per_gib)
    node = s.nodes[0]
    assert f"wbps={10 * MiB}" in io_max(node, uid)
    await api.patch_merge(s.client, PersistentVolumeClaim, data,
                          {"spec": {"resources": {"requests": {"storage": "2Gi"}}}},
                          namespace=NS)  # fmt: skip
    await s.expanded(data)

    def doubled() -> bool:
        return f"wbps={20 * MiB}" in io_max(node, uid)

    await eventually("the limit for 2 GiB in force", doubled, timeout=60, interval=0.5)


async def test_limits_come_back_after_topolvm_node_and_the_pod_restart(qos: Scenario) -> None:
    s = qos
    sc = s.sc()
    first = vac(s, bytes_per_second="30Mi")
    second = vac(s, bytes_per_second="40Mi")
    data, app, uid = await running_with(s, sc, first)
    node = s.nodes[0]
    assert f"rbps={30 * MiB} wbps={30 * MiB}" in io_max(node, uid)

    async def node_says_in_force() -> bool:  # the Node condition: limits can be put in force
        obj = await api.get(s.client, Node, node.name)
        found = {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions", [])}
        said = found.get(NODE_CONDITION) or {}
        return (said.get("status"), said.get("reason")) == ("False", podcgroup.SUPPORTED)

    await eventually(f"{NODE_CONDITION} False on {node.name}", node_says_in_force, timeout=30)

    # the class changes while topolvm-node is down: it applies the new one when it starts
    node.stop_topolvm_node()
    try:
        await set_class(s, data, second)
        lv_name = (await bound(s.client, data))["spec"]["volumeName"]

        async def respec() -> bool:
            lv = await api.get(s.client, api.logicalvolume_resource(s.names), lv_name)
            limits = ((lv or {}).get("spec") or {}).get("ioLimits") or {}
            return bool(limits.get("readBytesPerSecond") == 40 * MiB)

        # csi-resizer's ModifyVolume reaches topolvm-controller, which runs on the host
        await eventually("spec.ioLimits at 40 MiB/s", respec, timeout=120)
    finally:
        node.respawn("topolvm-node")

    def applied() -> bool:
        return f"wbps={40 * MiB}" in io_max(node, uid)

    await eventually("the 40 MiB/s limit after topolvm-node restarted", applied, timeout=120,
                     interval=0.5)  # fmt: skip

    # a new pod for the same claim: its publish puts the limit in force
    await s.delete_pod(app)
    app2 = unique("app")
    s.apply(pod(app2, s.group, [data]))
    await s.running(app2)
    assert f"wbps={40 * MiB}" in io_max(node, await pod_uid(s, app2))


async def test_a_volume_on_a_device_mapper_minor_above_255_is_limited_on_its_own_device(
    qos: Scenario,
) -> None:
    s = qos
    node = s.nodes[0]
    # 260 device-mapper devices of the core error target take the low minors
    node.exec("sh", "-c", "for i in $(seq 1 260); do "
              "echo '0 8 error' | dmsetup create qos-filler-$i; done")  # fmt: skip
    try:
        sc = s.sc()
        limit = vac(s, write_bytes_per_second="25Mi")
        data, app, uid = await running_with(s, sc, limit)
        lv = await lv_of(s, data)
        volume = lv["status"]["volumeID"]
        found = node.exec("sh", "-c", f"stat -L -c '%t:%T' $(lvs --noheadings -o lv_path "
                          f"-S lv_name={volume} | tr -d ' ')").stdout.strip()  # fmt: skip
        major, minor = (int(x, 16) for x in found.split(":"))
        assert minor > 255, found
        assert f"{major}:{minor} rbps=max wbps={25 * MiB}" in io_max(node, uid)
        rate = write_rate(s, app, f"/{data}/f")
        print(f"on {major}:{minor}: {rate / MiB:.1f} MiB/s at a 25 MiB/s limit")
        assert rate <= 1.1 * 25 * MiB
    finally:
        node.exec("sh", "-c", "for i in $(seq 1 260); do dmsetup remove qos-filler-$i; done",
                  check=False)  # fmt: skip

"""Step 6 of ``make demo`` (devtools/demo.py): an IO limit per claim (docs/qos.md). A Vault
replica's audit claim names a VolumeAttributesClass of 20 MiB/s writes while the pod runs; a
direct-IO write inside the container is measured before and after, and the limit read back
from the pod's cgroup on its node."""

from __future__ import annotations

import json
import re

from devtools.demo_steps import NS, DemoError, get_json, in_pod, kubectl, say, show_yaml, until
from devtools.testbed.controlplane import ControlPlane
from devtools.testbed.umlnode import UmlNode
from topolvm.node import podcgroup

CLASS = "vault-audit-20mib"
LIMIT_MIB = 20
MiB = 1 << 20
PROBE = "/vault/audit/.rate-probe"
_TIMED = re.compile(r"([0-9.]+) ([0-9.]+) (\d+)")


def attribute_class(driver: str) -> dict[str, object]:
    return {
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttributesClass",
        "metadata": {"name": CLASS}, "driverName": driver,
        "parameters": {"topolvm.io/write-bytes-per-second": f"{LIMIT_MIB}Mi"},
    }  # fmt: skip


def write_script(path: str, block: str = "1M", count: int = 48) -> str:
    """busybox sh: a direct-IO dd timed in the container (two readings of /proc/uptime, 10 ms
    steps; busybox's dd prints no rate), then the bytes written. :func:`measured_rate` reads
    its output."""
    return (f"a=$(cut -d' ' -f1 /proc/uptime); dd if=/dev/zero of={path} bs={block} "
            f"count={count} oflag=direct 2>/dev/null; b=$(cut -d' ' -f1 /proc/uptime); "
            f"echo \"$a $b $(stat -c %s {path})\"; rm -f {path}")  # fmt: skip


def measured_rate(out: str) -> float:
    """Bytes per second from :func:`write_script`'s output."""
    m = _TIMED.search(out)
    if m is None:
        raise DemoError(f"the timed write printed no figures: {out!r}")
    start, end, size = float(m.group(1)), float(m.group(2)), int(m.group(3))
    return size / max(end - start, 0.01)


def pod_io_max(node: UmlNode, uid: str) -> str | None:
    """The io.max of pod ``uid``'s cgroup on ``node`` (cgroupfs or systemd driver), or None
    when the node has no such cgroup."""
    for rel in podcgroup.pod_dirs(uid):
        res = node.exec("cat", f"/sys/fs/cgroup/{rel}/io.max", check=False)
        if res.rc == 0:
            return res.stdout
    return None


def write_rate(cp: ControlPlane, pod: str) -> float:
    """MiB/s of a 48 MiB direct-IO write into the pod's audit volume."""
    return measured_rate(in_pod(cp, pod, write_script(PROBE))) / MiB


def limit_audit(cp: ControlPlane, pod: str, node: UmlNode, driver: str) -> None:
    claim = f"audit-{pod}"
    before = write_rate(cp, pod)
    say(f"  {pod} writes into its audit volume at {before:.0f} MiB/s (direct IO, no limit)")
    show_yaml(attribute_class(driver))
    cp.apply(attribute_class(driver))
    patch = json.dumps({"spec": {"volumeAttributesClassName": CLASS}})
    kubectl(cp, "patch", "pvc", claim, "--type=merge", "-p", patch)

    def in_class() -> bool:
        status = get_json(cp, "pvc", claim, "-n", NS).get("status") or {}
        return bool(status.get("currentVolumeAttributesClassName") == CLASS)

    until(f"{claim} in class {CLASS} (csi-resizer -> ControllerModifyVolume)", in_class, 120)
    uid = get_json(cp, "pod", pod, "-n", NS)["metadata"]["uid"]

    def io_max() -> str:
        text = pod_io_max(node, uid) or ""
        return text.strip() if f"wbps={LIMIT_MIB * MiB}" in text else ""

    line = until(f"the limit in {pod}'s cgroup on {node.name}", io_max, 60)
    pv = cp.kubectl("get", "pvc", claim, "-n", NS, "-o", "jsonpath={.spec.volumeName}")
    say("  csi-resizer -> ControllerModifyVolume -> LogicalVolume spec.ioLimits -> topolvm-node "
        f"writes io.max in the pod's cgroup on {node.name}:")  # fmt: skip
    kubectl(cp, "get", "logicalvolumes.topolvm.io", pv)
    say(f"  {node.name}: io.max of pod {pod}: {line}")
    after = write_rate(cp, pod)
    say(f"  the same container, still running, now writes at {after:.1f} MiB/s "
        f"(limit {LIMIT_MIB} MiB/s; {before:.0f} MiB/s before)")  # fmt: skip
    if after > 1.1 * LIMIT_MIB or after >= before:
        raise DemoError(f"the limit does not hold: {after:.1f} MiB/s after, {before:.1f} before")

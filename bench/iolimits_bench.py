"""``make bench``: IO limits per claim (docs/qos.md), as ratios measured in one run.

Set-up: ``python -m devtools.cluster up --nodes 1`` (the real control plane, csi-provisioner
and csi-resizer, one UML Kubernetes node with containerd and the kubelet, the chart's pods), then
one busybox pod that mounts five 1 GiB claims: one without a class, one of a class whose limits
are all ``max`` (unlimited), and three of classes with a write limit of 10, 30 and 60 MiB/s.

1. Overhead of an unlimited class: 32 MiB of 4 KiB direct writes (``dd oflag=direct``, timed
   in the container) on the claim of the unlimited class against the claim without one, in
   ABBA order, ``--rounds`` times each; the medians' ratio. Target: the unlimited class costs
   <= 2%. (An unlimited class writes no io.max line at all: what this measures beyond noise
   would be the device-mapper devices' own difference.)
2. How closely a limit holds: 1 MiB direct writes for about 3 s on each limited claim; the
   rate / the limit. Target: <= 1.1, and >= 0.8 (a limit that holds back more than asked is
   wrong too).

Results go to ``.cache/bench/iolimits.json``. The bench prints whether the targets are met; it
never fails on them. ``python -m devtools.cluster down`` runs at the end (also after a failure).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

from bench.outcome import save
from devtools import cluster, gobuild, nodeimages
from devtools.demo_qos import measured_rate, write_script

MiB = 1 << 20
RESULTS = gobuild.ROOT / ".cache" / "bench" / "iolimits.json"
NS = "default"
SC = "topolvm-provisioner"
POD = "io-bench"
LIMITS_MIB = (10, 30, 60)
CLASSES: dict[str, dict[str, str]] = {
    "bench-io-unlimited": {"topolvm.io/bytes-per-second": "max", "topolvm.io/iops": "max"},
    **{f"bench-io-{m}mib": {"topolvm.io/write-bytes-per-second": f"{m}Mi"} for m in LIMITS_MIB},
}
CLAIMS: dict[str, str | None] = {
    "bench-none": None,
    "bench-unlimited": "bench-io-unlimited",
    **{f"bench-{m}mib": f"bench-io-{m}mib" for m in LIMITS_MIB},
}


def kubectl(*args: str, stdin: str | None = None) -> str:
    state = json.loads(cluster.STATE.read_text())
    argv = ["ip", "netns", "exec", cluster.NETNS, f"{state['bins']}/kubectl",
            f"--kubeconfig={state['kubeconfig']}", *args]  # fmt: skip
    out = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False,
                         timeout=300)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def objects() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttributesClass",
         "metadata": {"name": name}, "driverName": "topolvm.io", "parameters": params}
        for name, params in CLASSES.items()
    ]  # fmt: skip
    for name, attribute_class in CLAIMS.items():
        spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "storageClassName": SC,
                                "resources": {"requests": {"storage": "1Gi"}}}  # fmt: skip
        if attribute_class:
            spec["volumeAttributesClassName"] = attribute_class
        out.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": name, "namespace": NS}, "spec": spec})  # fmt: skip
    out.append({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": NS},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "app", "image": nodeimages.busybox().name, "imagePullPolicy": "Never",
            "command": ["sleep", "1000000"],
            "volumeMounts": [{"name": c, "mountPath": f"/{c}"} for c in CLAIMS]}],
            "volumes": [{"name": c, "persistentVolumeClaim": {"claimName": c}} for c in CLAIMS]},
    })  # fmt: skip
    return out


def rate(claim: str, block: str, count: int) -> float:
    out = kubectl(
        "exec", "-n", NS, POD, "--", "sh", "-c", write_script(f"/{claim}/f", block, count)
    )
    return measured_rate(out)


def measure(rounds: int) -> dict[str, Any]:
    kubectl("apply", "-f", "-", stdin="\n---\n".join(json.dumps(o) for o in objects()))
    kubectl("wait", "-n", NS, "--for=condition=Ready", f"pod/{POD}", "--timeout=300s")
    none: list[float] = []
    unlimited: list[float] = []
    for r in range(rounds):  # ABBA: neither claim always goes first
        pair = [("bench-none", none), ("bench-unlimited", unlimited)]
        for claim, into in pair if r % 2 == 0 else pair[::-1]:
            into.append(rate(claim, "4k", 8000) / 4096)
    overhead = 1 - statistics.median(unlimited) / statistics.median(none)
    held = {}
    for m in LIMITS_MIB:
        held[m] = rate(f"bench-{m}mib", "1M", 3 * m) / (m * MiB)
    return {
        "iops_no_class": [round(x) for x in none],
        "iops_unlimited_class": [round(x) for x in unlimited],
        "unlimited_overhead": round(overhead, 4),
        "rate_over_limit": {f"{m}MiB/s": round(r, 3) for m, r in held.items()},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=12)
    args = p.parse_args()
    if cluster.up(1, 12.0) != 0:
        return 1
    try:
        results = measure(args.rounds)
    finally:
        cluster.down()
    save(RESULTS, results)
    print(json.dumps(results, indent=2))
    ok_overhead = results["unlimited_overhead"] <= 0.02
    print(f"unlimited class overhead on 4 KiB direct writes: {results['unlimited_overhead']:.1%}"
          f" (target <= 2%: {'met' if ok_overhead else 'NOT met'})")  # fmt: skip
    for limit, ratio in results["rate_over_limit"].items():
        met = 0.8 <= ratio <= 1.1
        print(f"write limit {limit}: measured / limit = {ratio:.3f} (target 0.8-1.1: "
              f"{'met' if met else 'NOT met'})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``make bench-kubelet``'s numbers: the summary of a phase's runs and the printed report (see
bench/kubelet_bench.py)."""

from __future__ import annotations

import statistics
from typing import Any

Obj = dict[str, Any]


def summary(runs: list[Obj]) -> Obj:
    """Median, minimum and maximum of the runs' total, and the median of each stage."""
    total = [r["total_s"] for r in runs]
    stages = {k: statistics.median(v) for k in ("bound_s", "scheduled_s", "published_s")
              if (v := [r[k] for r in runs if r[k] is not None])}  # fmt: skip
    return {"median_s": statistics.median(total), "min_s": min(total), "max_s": max(total),
            "stage_medians_s": stages, "runs": runs}  # fmt: skip


def report(res: Obj) -> None:
    print("\n=== kubelet bench ===\nnode start -> Node Ready (UML boot, vg1, containerd, kubelet, "
          "kube-proxy):")  # fmt: skip
    for n in res["nodes"]:
        print(f"  {n['node']:<10}{n['start_to_ready_s']:7.1f}s   (daemons started -> Ready "
              f"{n['daemons_to_ready_s']:.1f}s)")  # fmt: skip
    print(f"helm install -> the chart's pods Running: {res['chart_install_s']:.1f}s")
    print(f"\nPVC + pod created -> running, {res['runs']} runs, seconds since created:")
    heads = ("median", "min", "max", "bound", "sched.", "publ.")
    print(f"  {'':<38}" + "".join(f"{h:>8}" for h in heads))
    for label, key in (("real kubelet: container running", "real"),
                       ("stand-in: published, status Running", "standin")):  # fmt: skip
        s = res[key]
        cells = [s["median_s"], s["min_s"], s["max_s"]]
        cells += [s["stage_medians_s"].get(k, float("nan")) for k in
                  ("bound_s", "scheduled_s", "published_s")]  # fmt: skip
        print(f"  {label:<38}" + "".join(f"{c:8.2f}" for c in cells))
        each = ", ".join(f"{r['total_s']:.2f}" for r in s["runs"])
        print(f"  {'':<38}each: {each}")
    print(f"  ratio real / stand-in (medians): {res['ratio_real_to_standin']:.2f}")
    print("\nmemory per real-kubelet node, idle with the chart's pods running, MiB (RSS counts "
          "shared pages too):")  # fmt: skip
    cols = ("kubelet", "containerd", "kube-proxy", "topolvm-node")
    extra = ("containerd-shim", "pause", "controller-pod", "agent", "other")
    print(f"  {'node':<10}{'used/total':>11}" + "".join(f"{c:>13}" for c in cols)
          + f"   ({', '.join(extra)})")  # fmt: skip
    for m in res["memory"]:
        rss = m["rss_mib"]
        print(f"  {m['node']:<10}{m['used_mib']:>5}/{m['total_mib']:<5}"
              + "".join(f"{rss.get(c, 0):13.0f}" for c in cols)
              + f"   ({', '.join(f'{rss.get(c, 0):.0f}' for c in extra)})")  # fmt: skip
    t = res["timing"]
    print(f"\nwall time {t['total_s']:.0f}s (stand-in phase {t['standin_s']:.0f}s, kubelet phase "
          f"{t['kubelet_s']:.0f}s); load average at the end {res['loadavg']}")  # fmt: skip

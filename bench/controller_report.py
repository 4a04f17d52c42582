"""``make bench``'s controller numbers: summaries of timings and the printed report with its
targets (see bench/controller_bench.py)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

LATENCY_TARGET = 1.3  # median CreateVolume / median lvcreate, at most
THROUGHPUT_TARGET = 0.9  # CreateVolume volumes/s / lvcreate volumes/s, at least


def pct(values: list[float], q: int) -> float:
    """The ``q``-th percentile (linear interpolation between the closest ranks)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "median_ms": statistics.median(values) * 1e3,
            "p90_ms": pct(values, 90) * 1e3, "min_ms": min(values) * 1e3,
            "max_ms": max(values) * 1e3}  # fmt: skip


def report(
    results: dict[str, Any], args: argparse.Namespace, timing: dict[str, float],
    *, size: int, saved_to: Path,
) -> None:  # fmt: skip
    lat = results["latency"]
    ratio_med = lat["CreateVolume"]["median_ms"] / lat["lvcreate"]["median_ms"]
    ratio_p90 = lat["CreateVolume"]["p90_ms"] / lat["lvcreate"]["p90_ms"]
    del_med = lat["DeleteVolume"]["median_ms"] / lat["lvremove"]["median_ms"]
    del_p90 = lat["DeleteVolume"]["p90_ms"] / lat["lvremove"]["p90_ms"]
    rounds = results["throughput_rounds"]
    n = args.tput_count

    def rate(side: str, key: str) -> float:
        secs = sum(r[key] for r in rounds if r["side"] == side)
        return float(n * sum(1 for r in rounds if r["side"] == side) / secs)

    ctl_rate, bare_rate = rate("ctl", "create_s"), rate("bare", "create_s")
    del_rate, rm_rate = rate("ctl", "delete_s"), rate("bare", "delete_s")
    tput_ratio = ctl_rate / bare_rate
    lat_ok = ratio_med <= LATENCY_TARGET
    tput_ok = tput_ratio >= THROUGHPUT_TARGET
    results["ratios"] = {
        "create_latency_median": ratio_med, "create_latency_p90": ratio_p90,
        "delete_latency_median": del_med, "delete_latency_p90": del_p90,
        "create_throughput": tput_ratio, "delete_throughput": del_rate / rm_rate,
    }  # fmt: skip
    results["throughput"] = {"CreateVolume_per_s": ctl_rate, "lvcreate_per_s": bare_rate,
                             "DeleteVolume_per_s": del_rate, "lvremove_per_s": rm_rate}  # fmt: skip
    results["targets"] = {
        "create_latency_median_max": LATENCY_TARGET, "create_latency_met": lat_ok,
        "create_throughput_min": THROUGHPUT_TARGET, "create_throughput_met": tput_ok,
    }  # fmt: skip

    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    print()
    print(f"topolvm-controller vs bare LVM: 1 UML node, thick class, {size >> 20} MiB volumes")
    print("baseline: lvcreate/lvremove (argv as lvmd's) in ONE bash loop inside the guest, each")
    print("timed there with $EPOCHREALTIME: the guest agent's round trip is not in the baseline")
    print(f"\nlatency at concurrency 1 ({args.count} volumes per side, blocks of {args.block}, "
          "ABBA order)")  # fmt: skip
    print(f"{'':<28}{'median ms':>11}{'p90 ms':>10}{'min ms':>10}{'max ms':>10}")
    for key in ("CreateVolume", "lvcreate", "DeleteVolume", "lvremove"):
        s = lat[key]
        print(f"{key:<28}{s['median_ms']:>11.1f}{s['p90_ms']:>10.1f}"
              f"{s['min_ms']:>10.1f}{s['max_ms']:>10.1f}")  # fmt: skip
    print(f"{'CreateVolume / lvcreate':<28}{ratio_med:>11.2f}{ratio_p90:>10.2f}"
          f"   target median <= {LATENCY_TARGET}: {met(lat_ok)}")  # fmt: skip
    print(f"{'DeleteVolume / lvremove':<28}{del_med:>11.2f}{del_p90:>10.2f}   (info)")
    print(f"\nthroughput: {n} volumes, {args.concurrency} CreateVolume in flight vs {n} lvcreate "
          f"one after another ({args.tput_rounds} rounds per side)")  # fmt: skip
    print(f"{'':<28}{'volumes/s':>11}")
    print(f"{'CreateVolume (c=' + str(args.concurrency) + ')':<28}{ctl_rate:>11.2f}")
    print(f"{'lvcreate (serial)':<28}{bare_rate:>11.2f}")
    print(f"{'ratio':<28}{tput_ratio:>11.2f}   target >= {THROUGHPUT_TARGET}: {met(tput_ok)}")
    print(f"{'DeleteVolume (c=' + str(args.concurrency) + ')':<28}{del_rate:>11.2f}")
    print(f"{'lvremove (serial)':<28}{rm_rate:>11.2f}")
    print(f"{'ratio':<28}{del_rate / rm_rate:>11.2f}   (info)")
    labels = {
        "rpc_to_object_seen": "RPC sent -> LogicalVolume in a watch",
        "object_seen_to_lv_created": "-> topolvm-node logged 'created LV'",
        "lv_created_to_status_seen": "-> status.volumeID in a watch",
        "status_seen_to_rpc_return": "-> CreateVolume returned",
    }
    bd = results["breakdown"]
    c1, cn = bd["c1"], bd[f"c{args.concurrency}"]
    print("\nwhere a CreateVolume's time goes (ms; host clock, which the guest shares):")
    print(f"{'':<42}{'c=1 median':>11}{'max':>8}{'c=' + str(args.concurrency) + ' median':>13}"
          f"{'max':>8}")  # fmt: skip
    for key, label in labels.items():
        cells = "".join(
            f"{b[key]['median_ms']:>{w}.1f}{b[key]['max_ms']:>8.1f}" if key in b else " " * (w + 8)
            for b, w in ((c1, 11), (cn, 13))
        )
        print(f"  {label:<40}{cells}")
    print(f"  for reference: lvmd's 'lvm fullreport' alone in the guest, median "
          f"{results['fullreport_ms']:.1f} ms; after plain thick changes the\n  Watch report "
          "comes from lvmd's model and runs none")  # fmt: skip
    load = os.getloadavg()
    print(f"\nset-up {timing['setup_s']:.0f} s, measuring {timing['measure_s']:.0f} s, "
          f"total {timing['total_s']:.0f} s; load average {load[0]:.2f} {load[1]:.2f}")  # fmt: skip
    print(f"results: {saved_to}")
    sys.stdout.flush()

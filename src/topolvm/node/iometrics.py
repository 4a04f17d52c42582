"""What topolvm-node exports of IO limits (docs/qos.md), read at each scrape: per volume, the
limits in force (``topolvm_volume_io_limit``, one series per io.max key with a limit), and
what each pod that mounts it did on its device, from the pod's ``io.stat``
(``topolvm_volume_io_total``: ``kind`` rbytes, wbytes, rios, wios, and whatever else the
kernel counts there), and how long the pod's tasks were stalled on IO, from its
``io.pressure`` (``topolvm_volume_io_stalled_seconds_total``, ``kind`` some or full). Linux's
block throttling keeps no per-device count of the time it held IO back: the stall time is the
pod's, on all its devices, which a throttled limit drives up."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from topolvm.node import podcgroup


@dataclass(frozen=True)
class InForce:
    """A volume's limits as last written, and the pods' cgroup folders they were written in."""

    major: int
    minor: int
    values: Mapping[str, int | None]  # io.max key -> limit (None: max)
    pods: Mapping[str, Path] = field(default_factory=dict)  # pod UID -> cgroup folder


class IoLimitCollector(Collector):
    def __init__(self, node: str, in_force: Callable[[], Mapping[str, InForce]]) -> None:
        self.node = node
        self.in_force = in_force

    def collect(self) -> Iterator[Metric]:
        limit = GaugeMetricFamily(
            "topolvm_volume_io_limit",
            "An IO limit in force for the pods that mount the volume (io.max; bytes or "
            "operations per second)",
            labels=["node", "volume", "key"],
        )
        done = CounterMetricFamily(
            "topolvm_volume_io",
            "What a pod did on the volume's device, from its cgroup's io.stat (bytes, operations)",
            labels=["node", "volume", "pod", "kind"],
        )
        stalled = CounterMetricFamily(
            "topolvm_volume_io_stalled_seconds",
            "Time the pod's tasks were stalled on IO (its cgroup's io.pressure, all its devices: "
            "a limit that holds IO back shows here)",
            labels=["node", "volume", "pod", "kind"],
        )
        for name, state in sorted(self.in_force().items()):
            for key, value in state.values.items():
                if value is not None:
                    limit.add_metric([self.node, name, key], value)
            for uid, folder in sorted(state.pods.items()):
                try:
                    text = (folder / "io.stat").read_text()
                except OSError:
                    continue  # the pod went
                counters = podcgroup.io_counters(text, state.major, state.minor)
                for kind, count in sorted(counters.items()):
                    done.add_metric([self.node, name, uid, kind], count)
                try:
                    pressure = podcgroup.stalled_seconds((folder / "io.pressure").read_text())
                except OSError:
                    continue  # a kernel without PSI, or the pod went
                for kind, seconds in sorted(pressure.items()):
                    stalled.add_metric([self.node, name, uid, kind], seconds)
        yield limit
        yield done
        yield stalled

    def describe(self) -> Iterator[Metric]:
        return iter(())

"""topolvm-scheduler's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Metrics:
    """The extender's Prometheus metrics, in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "topolvm_scheduler_requests",
            "HTTP requests received by the scheduler extender, by path and status code",
            ["path", "code"],
            registry=registry,
        )
        self.latency = Histogram(
            "topolvm_scheduler_request_duration_seconds",
            "Time to answer an HTTP request, by path",
            ["path"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.last_request = Gauge(
            "topolvm_scheduler_last_request_timestamp_seconds",
            "Unix time of the last /predicate or /prioritize call (from kube-scheduler); "
            "0 if there was none since start",
            registry=registry,
        )
        self.mode = Gauge(
            "topolvm_scheduler_mode_info",
            "Always 1; the labels say how the extender must be wired into kube-scheduler",
            ["mode", "managed_resource", "node_cache_capable"],
            registry=registry,
        )
        self.cache_nodes = Gauge(
            "topolvm_scheduler_node_cache_nodes",
            "Nodes in the extender's node cache (nodeCacheCapable mode)",
            registry=registry,
        )
        self.cache_synced = Gauge(
            "topolvm_scheduler_node_cache_synced",
            "1 if the node cache is synced with the API server (nodeCacheCapable mode)",
            registry=registry,
        )

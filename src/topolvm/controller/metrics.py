"""Prometheus metrics of topolvm-controller (besides the CSI call metrics of ``rpc.status``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry):
        def counter(name: str, doc: str, labels: list[str]) -> Counter:
            return Counter(name, doc, labels, namespace="topolvm_controller", registry=registry)

        self.webhook_decisions = counter(
            "webhook_decisions",
            "Pod webhook answers: mutated, allowed (nothing to do), denied, errored.",
            ["decision"],
        )
        self.reconciles = counter(
            "reconciles",
            "Reconciles by controller and result (ok, requeue, error).",
            ["controller", "result"],
        )
        self.capacity_rejections = counter(
            "capacity_rejections",
            "CreateVolume calls answered ResourceExhausted before any LogicalVolume was written "
            "(the node's free space minus volumes in flight was too small).",
            ["device_class"],
        )
        self.gc_candidates = Gauge(
            "gc_orphan_logicalvolumes",
            "LogicalVolumes no PersistentVolume references, past the grace period.",
            namespace="topolvm_controller",
            registry=registry,
        )
        self.gc_deleted = counter(
            "gc_deleted_logicalvolumes", "LogicalVolumes deleted by the garbage collector.", []
        )
        self.leader = Gauge(
            "leader",
            "1 while this replica holds the controllers' Lease.",
            namespace="topolvm_controller",
            registry=registry,
        )
        self.in_flight_bytes = Gauge(
            "in_flight_bytes",
            "Bytes of volumes created or being created that the node's capacity annotation "
            "does not show yet, by node and device class.",
            ["node", "device_class"],
            namespace="topolvm_controller",
            registry=registry,
        )
        self.cert_expiry = Gauge(
            "webhook_certificate_expiry_timestamp_seconds",
            "Expiry (Unix time) of the webhook serving certificate in use.",
            namespace="topolvm_controller",
            registry=registry,
        )

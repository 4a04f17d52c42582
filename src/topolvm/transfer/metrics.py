"""The transfer's Prometheus metrics, on topolvm-node's ``/metrics`` (docs/mobility.md)."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge


class TransferMetrics:
    def __init__(self, registry: CollectorRegistry | None, node: str) -> None:
        self.node = node
        self.data_bytes = Counter(
            "topolvm_transfer_data_bytes",
            "Bytes of volume data that travelled in DATA records.",
            ["node", "role"],
            registry=registry,
        )
        self.zero_bytes = Counter(
            "topolvm_transfer_zero_bytes",
            "Bytes of volume covered by ZERO records (zeros, or a thin volume's unmapped "
            "blocks): not read, not sent.",
            ["node", "role"],
            registry=registry,
        )
        self.keep_bytes = Counter(
            "topolvm_transfer_keep_bytes",
            "Bytes of volume covered by KEEP records (a delta copy's ranges the target holds "
            "already): not sent, not written.",
            ["node", "role"],
            registry=registry,
        )
        self.wire_bytes = Counter(
            "topolvm_transfer_wire_bytes",
            "Bytes of DATA and ZDATA payload on the wire: below topolvm_transfer_data_bytes by "
            "what compression saved.",
            ["node", "role"],
            registry=registry,
        )
        self.cpu_seconds = Counter(
            "topolvm_transfer_cpu_seconds",
            "CPU time of the copies' streams (reading, hashing, TLS, compression, writing); "
            "divided by topolvm_transfer_data_bytes, the CPU a GiB costs.",
            ["node", "role"],
            registry=registry,
        )
        self.active = Gauge(
            "topolvm_transfer_copies_active",
            "Copies running now.",
            ["node", "role"],
            registry=registry,
        )
        self.finished = Counter(
            "topolvm_transfer_copies",
            "Copies (connections, for the sender) that ended.",
            ["node", "role", "result"],
            registry=registry,
        )
        self.refusals = Counter(
            "topolvm_transfer_refusals",
            "Connections the sender refused, by reason.",
            ["node", "reason"],
            registry=registry,
        )
        self.dropped = Counter(
            "topolvm_transfer_connections_dropped",
            "Connections to the transfer port closed before they were authorised, by reason: "
            "rate (its address connected too often: closed at accept, before TLS), deadline "
            "(no HELLO in time from accept), handshake (not TLS, TLS or HELLO malformed), "
            "peer-limit (its address had too many pending: its oldest went), evicted (the "
            "port's pending connections were full: the oldest of an address holding most went).",
            ["node", "reason"],
            registry=registry,
        )
        self.pending = Gauge(
            "topolvm_transfer_pending_connections",
            "Connections to the transfer port not yet authorised.",
            ["node"],
            registry=registry,
        )
        self.token_reviews = Counter(
            "topolvm_transfer_token_reviews",
            "TokenReviews the sender made, by result (authenticated, refused, failed); cached "
            "answers, tokens refused without one and HELLOs of an address backed off after a "
            "refusal are not counted.",
            ["node", "result"],
            registry=registry,
        )
        self.progress = Gauge(
            "topolvm_transfer_copy_done_bytes",
            "How far a copy this node receives has come.",
            ["node", "logicalvolume"],
            registry=registry,
        )
        self.total = Gauge(
            "topolvm_transfer_copy_total_bytes",
            "The size of a copy this node receives.",
            ["node", "logicalvolume"],
            registry=registry,
        )
        self.rate = Gauge(
            "topolvm_transfer_copy_rate_bytes_per_second",
            "A copy's recent rate through the volume.",
            ["node", "logicalvolume"],
            registry=registry,
        )

    def moved(self, role: str, data: int, zero: int, keep: int = 0, wire: int = -1) -> None:
        """Volume bytes covered; ``wire``: the DATA payload's bytes on the wire (-1: ``data``,
        uncompressed)."""
        if data:
            self.data_bytes.labels(self.node, role).inc(data)
        if data or wire > 0:
            self.wire_bytes.labels(self.node, role).inc(data if wire < 0 else wire)
        if zero:
            self.zero_bytes.labels(self.node, role).inc(zero)
        if keep:
            self.keep_bytes.labels(self.node, role).inc(keep)

    def cpu(self, role: str, seconds: float) -> None:
        if seconds > 0:
            self.cpu_seconds.labels(self.node, role).inc(seconds)

    def job(self, lv: str, done: int, total: int, rate: float) -> None:
        self.progress.labels(self.node, lv).set(done)
        self.total.labels(self.node, lv).set(total)
        self.rate.labels(self.node, lv).set(rate)

    def job_ended(self, lv: str) -> None:
        for gauge in (self.progress, self.total, self.rate):
            with contextlib.suppress(KeyError):
                gauge.remove(self.node, lv)

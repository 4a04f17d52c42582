"""topolvm-controller's options (from its command line)."""

from __future__ import annotations

from dataclasses import dataclass, field

from topolvm.constants import Names
from topolvm.controller.sizing import MinimumAllocations


@dataclass(frozen=True)
class LeaderOptions:
    name: str = "topolvm"
    namespace: str = "default"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


@dataclass
class ControllerOptions:
    names: Names
    csi_socket: str
    namespace: str = ""
    metrics_address: tuple[str, int] | None = ("0.0.0.0", 8080)
    health_address: tuple[str, int] | None = ("0.0.0.0", 8081)
    webhook_address: tuple[str, int] | None = None
    cert_dir: str = ""
    pod_webhook_marker: bool = False
    webhook_secret_name: str = "topolvm-webhook-cert"
    webhook_configuration_name: str = "topolvm-hook"
    webhook_service_name: str = "topolvm-controller"
    webhook_extra_sans: tuple[str, ...] = ()
    leader: LeaderOptions | None = field(default_factory=LeaderOptions)
    skip_node_finalize: bool = False
    minimums: MinimumAllocations = field(default_factory=MinimumAllocations)
    lv_gc: str = "off"
    lv_gc_grace: float = 3600.0
    lv_gc_interval: float = 600.0
    probe_interval: float = 60.0
    resync: float = 600.0

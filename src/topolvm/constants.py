"""Names shared by every component, in normal and legacy (``USE_LEGACY``) mode (spec §0)."""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_DEVICE_CLASS_KEY = "00default"
"""Annotation suffix used for the default device class (whose name in requests is "")."""

DEFAULT_SIZE = 1 << 30
"""Size given to a volume whose request is missing or zero."""

SIZE_ALIGNMENT = 4096
"""Volume sizes are multiples of this: the controller rounds a request up to it, lvmd refuses a
thick volume that is not (as upstream)."""

CREATED_BY_LABEL = ("app.kubernetes.io/created-by", "topolvm-controller")
RESIZEFS_REQUESTED_AT = "topolvm.io/last-resizefs-requested-at"  # always topolvm.io
LEGACY_DEVICE_DIR = "/dev/topolvm"
DEFAULT_CSI_SOCKET = "/run/topolvm/csi-topolvm.sock"
DEFAULT_LVMD_SOCKET = "/run/topolvm/lvmd.sock"
DEFAULT_TRANSFER_PORT = 9850
DEFAULT_TRANSFER_TOKEN = "/var/run/secrets/topolvm.io/transfer/token"
"""Where the chart mounts topolvm-node's projected token for the transfer audience."""
DEFAULT_REGISTRATION_DIR = "/var/lib/kubelet/plugins_registry"
"""The kubelet's plugin registration folder (its plugin watcher looks for sockets there)."""


@dataclass(frozen=True)
class Names:
    """Every name that changes between normal and legacy mode."""

    legacy: bool
    plugin: str

    @property
    def group(self) -> str:
        """LogicalVolume CRD API group."""
        return self.plugin

    @property
    def capacity_prefix(self) -> str:
        """Prefix of node (and pod) capacity annotations: ``capacity.topolvm.io/``."""
        return f"capacity.{self.plugin}/"

    @property
    def capacity_resource(self) -> str:
        """Extended resource the pod webhook puts on pods: ``topolvm.io/capacity``."""
        return f"{self.plugin}/capacity"

    @property
    def topology_key(self) -> str:
        return f"topology.{self.plugin}/node"

    @property
    def device_class_param(self) -> str:
        return f"{self.plugin}/device-class"

    @property
    def lvcreate_option_class_param(self) -> str:
        return f"{self.plugin}/lvcreate-option-class"

    @property
    def resize_requested_at(self) -> str:
        return f"{self.plugin}/resize-requested-at"

    @property
    def pending_deletion(self) -> str:
        return f"{self.plugin}/pendingdeletion"

    @property
    def lv_finalizer(self) -> str:
        return f"{self.plugin}/logicalvolume"

    @property
    def node_finalizer(self) -> str:
        return f"{self.plugin}/node"

    @property
    def webhook_ignore_label(self) -> str:
        return f"{self.plugin}/webhook"

    # -- the node-to-node copy (docs/mobility.md) -----------------------------------------

    @property
    def claim_annotation(self) -> str:
        """On a LogicalVolume filled by a copy: ``<namespace>/<name>`` of the claim that waits
        for it (its Events go there)."""
        return f"{self.plugin}/claim"

    @property
    def snapshot_annotation(self) -> str:
        """On a snapshot's LogicalVolume filled by a copy: ``<namespace>/<name>`` of its
        VolumeSnapshot."""
        return f"{self.plugin}/volumesnapshot"

    @property
    def transfer_endpoint_annotation(self) -> str:
        """On a Node: ``<address>:<port>`` of its topolvm-node's transfer port."""
        return f"{self.plugin}/transfer-endpoint"

    @property
    def transfer_cert_annotation(self) -> str:
        """On a Node: the SHA-256 of its transfer port's certificate (receivers pin it)."""
        return f"{self.plugin}/transfer-cert-sha256"

    @property
    def transfer_features_annotation(self) -> str:
        """On a Node: the HELLO features its transfer port honours, after the first 16 hex
        digits of its certificate's fingerprint: ``<fp16>:sender-cpu,zstd`` (``zstd`` when it
        compresses). Absent on a release that reads none; one left by an earlier start of
        another release names an old fingerprint and is ignored (``transfer.features``)."""
        return f"{self.plugin}/transfer-features"

    @property
    def snapshot_placement_param(self) -> str:
        """VolumeSnapshotClass parameter: ``source-node`` (the default) or ``other-node``."""
        return f"{self.plugin}/snapshot-placement"

    @property
    def snapshot_node_selector_param(self) -> str:
        """VolumeSnapshotClass parameter: a label selector for the node that keeps the
        snapshot (implies ``other-node``)."""
        return f"{self.plugin}/snapshot-node-selector"

    @property
    def restore_placement_param(self) -> str:
        """StorageClass or VolumeSnapshotClass parameter: ``source-node`` (the default: a
        restore's or clone's pod prefers its source's node) or ``anywhere``."""
        return f"{self.plugin}/restore-placement"

    def capacity_annotation(self, device_class: str) -> str:
        """Node/pod annotation key for a device class ("" is the default class)."""
        return self.capacity_prefix + (device_class or DEFAULT_DEVICE_CLASS_KEY)


NORMAL = Names(legacy=False, plugin="topolvm.io")
LEGACY = Names(legacy=True, plugin="topolvm.cybozu.com")


def legacy_from_env() -> bool:
    """Upstream switches to legacy names when ``USE_LEGACY`` is set to any non-empty value."""
    return bool(os.environ.get("USE_LEGACY"))


def names(legacy: bool | None = None) -> Names:
    """The names for ``legacy`` mode; ``None`` reads ``USE_LEGACY`` from the environment."""
    if legacy is None:
        legacy = legacy_from_env()
    return LEGACY if legacy else NORMAL

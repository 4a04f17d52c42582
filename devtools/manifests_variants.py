"""What devtools.manifests generates: the kustomizations under deploy/manifests (a base, overlays
and components, each with the chart values it adds to what it is applied to) and the
kube-scheduler configurations in deploy/scheduler-config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "topolvm"
MANIFESTS = ROOT / "deploy" / "manifests"
SCHEDULER_CONFIG = ROOT / "deploy" / "scheduler-config"
RELEASE = "topolvm"
NAMESPACE = "topolvm-system"
HAND_WRITTEN = frozenset({"README.md"})

# Upstream's extender mode (charts/topolvm/README.md, "Scheduling modes"): the pod webhook adds the
# capacity annotations the extender filters on, and Storage Capacity Tracking is off. The webhook's
# certificate is self-managed by topolvm-controller, so nothing else (cert-manager) is needed and
# nothing random is rendered: the controller creates the CA and writes the caBundle at run time.
EXTENDER = (
    "scheduler.enabled=true",
    "webhook.podMutatingWebhook.enabled=true",
    "webhook.certManager=false",
    "controller.storageCapacityTracking.enabled=false",
)


@dataclass(frozen=True)
class Variant:
    """One kustomization under deploy/manifests: its folder, the chart values it adds to those of
    what it is applied to (``parents``), and a line for its kustomization.yaml."""

    name: str
    sets: tuple[str, ...]
    parents: tuple[str, ...]
    about: str

    @property
    def component(self) -> bool:
        return self.name.startswith("components/")


BASE = "base"
DAEMONSET = "overlays/daemonset-scheduler"
DEPLOYMENT = "overlays/deployment-scheduler"
OVERLAYS = (DAEMONSET, DEPLOYMENT)

VARIANTS: tuple[Variant, ...] = (
    Variant(BASE, (), (), "the chart's defaults: Storage Capacity Tracking, lvmd as a DaemonSet"),
    Variant(
        DAEMONSET,
        (*EXTENDER, "scheduler.type=daemonset"),
        (BASE,),
        "scheduler extender as a DaemonSet on the control plane nodes (host network, "
        "127.0.0.1:9251), pod webhook with self-managed certificates, no Storage Capacity Tracking",
    ),
    Variant(
        DEPLOYMENT,
        (*EXTENDER, "scheduler.type=deployment"),
        (BASE,),
        "scheduler extender as a Deployment behind a LoadBalancer Service (port 9251), pod webhook "
        "with self-managed certificates, no Storage Capacity Tracking",
    ),
    Variant(
        "components/marker",
        ("webhook.podMutatingWebhook.marker=true",),
        OVERLAYS,
        "marker-resource mode on top of a scheduler overlay: the webhook adds topolvm.io/capacity, "
        "the extender runs with --managed-resource (kube-scheduler needs managedResources)",
    ),
    Variant(
        "components/systemd-lvmd",
        ("lvmd.managed=false",),
        (BASE, *OVERLAYS),
        "lvmd runs as a systemd service on every node (deploy/systemd): no lvmd DaemonSet",
    ),
)
BY_NAME = {v.name: v for v in VARIANTS}


def full_sets(name: str) -> tuple[str, ...]:
    """The values of a base or overlay (a component has one set per parent: parent + its own)."""
    v = BY_NAME[name]
    if v.component:
        raise ValueError(f"{name} is a component; its values depend on what it is applied to")
    return (*(full_sets(v.parents[0]) if v.parents else ()), *v.sets)


# kube-scheduler configurations: file -> (print-config arguments, USE_LEGACY, what it is for).
SCHEDULER_CONFIGS: dict[str, tuple[tuple[str, ...], bool, str]] = {
    "scheduler-config.yaml": (
        (),
        False,
        "Default mode: kube-scheduler sends every pod to the extender (the overlays as generated).",
    ),
    "scheduler-config-managed-resource.yaml": (
        ("--managed-resource",),
        False,
        "Marker-resource mode (deploy/manifests/components/marker, or the chart's "
        "webhook.podMutatingWebhook.marker).",
    ),
    "scheduler-config-legacy.yaml": (
        ("--managed-resource",),
        True,
        "Legacy names (USE_LEGACY, the chart's useLegacy) in marker-resource mode, as upstream's "
        "legacy file; legacy without the marker uses scheduler-config.yaml.",
    ),
}

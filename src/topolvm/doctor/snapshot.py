"""The cluster as read by ``topolvm doctor``: plain JSON objects by kind, what could not be read,
and the lookups the checks share (pure: no I/O here, see collect.py)."""

from __future__ import annotations

import datetime
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from topolvm.capacity_annotations import class_key, decode_node, parse_node_value
from topolvm.constants import LEGACY, NORMAL, Names
from topolvm.k8s.lvobject import InvalidQuantity, parse_quantity

Obj = dict[str, Any]
BOTH = (NORMAL, LEGACY)
POD_HOOK_PATHS = ("/pod/mutate",)
TOPOLVM_NODE_CONTAINER = "topolvm-node"  # ours and upstream's DaemonSet


def meta(obj: Obj) -> Obj:
    m: Obj = obj.get("metadata") or {}
    return m


def name_of(obj: Obj) -> str:
    return str(meta(obj).get("name", ""))


def ns_of(obj: Obj) -> str:
    return str(meta(obj).get("namespace", ""))


def annotations_of(obj: Obj) -> dict[str, str]:
    return dict(meta(obj).get("annotations") or {})


def uid_of(obj: Obj) -> str:
    return str(meta(obj).get("uid") or "")


def parse_time(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def names_for(plugin: str) -> Names | None:
    """The TopoLVM names of a provisioner or driver name, or None if it is not TopoLVM's."""
    return next((n for n in BOTH if n.plugin == plugin), None)


def marker_of(pod: Obj) -> str | None:
    """The ``<plugin>/capacity`` marker resource a pod's containers request, if any."""
    spec = pod.get("spec") or {}
    markers = {n.capacity_resource for n in BOTH}
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = c.get("resources") or {}
        for part in ("requests", "limits"):
            for key in res.get(part) or {}:
                if key in markers:
                    return str(key)
    return None


def claims_of(pod: Obj) -> list[str]:
    """Names of the PVCs a pod uses, generic ephemeral volumes included."""
    out = []
    for v in (pod.get("spec") or {}).get("volumes") or []:
        if "persistentVolumeClaim" in v:
            out.append(str(v["persistentVolumeClaim"].get("claimName", "")))
        elif "ephemeral" in v:
            out.append(f"{name_of(pod)}-{v.get('name', '')}")
    return out


def unscheduled(pod: Obj) -> bool:
    return (
        not (pod.get("spec") or {}).get("nodeName")
        and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
        and not meta(pod).get("deletionTimestamp")
    )


def scheduling_message(pod: Obj) -> str:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message") or "")
    return ""


def container_of(pod: Obj, name: str) -> Obj | None:
    """The pod's container called ``name``."""
    containers = (pod.get("spec") or {}).get("containers") or []
    return next((c for c in containers if c.get("name") == name), None)


def owner(obj: Obj) -> Obj | None:
    for ref in meta(obj).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def last_write(obj: Obj) -> str:
    """When the object was last written: the newest managedFields time, else its creation."""
    times = [str(m.get("time")) for m in meta(obj).get("managedFields") or [] if m.get("time")]
    return max(times, default=str(meta(obj).get("creationTimestamp") or ""))


def human_age(td: datetime.timedelta) -> str:
    """``3d4h``, ``1h0m``, ``5m3s``, ``12s``."""
    secs = max(int(td.total_seconds()), 0)
    days, rest = divmod(secs, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


def quantity_bytes(value: object) -> int | None:
    """A Kubernetes quantity as bytes; None when it is not one."""
    try:
        return parse_quantity(value)
    except InvalidQuantity:
        return None


@dataclass(frozen=True)
class Settings:
    """Thresholds (``topolvm doctor`` flags)."""

    stale_after: datetime.timedelta = datetime.timedelta(minutes=10)
    """A CSIStorageCapacity that disagrees with its node's annotation for longer is stale."""
    stuck_after: datetime.timedelta = datetime.timedelta(minutes=5)
    """A LogicalVolume being deleted for longer is stuck."""
    thin_data_percent: float = 80.0
    thin_metadata_percent: float = 80.0


@dataclass
class Snapshot:
    """Objects by kind (``nodes``, ``pods``, ... see collect.KINDS); ``unreadable`` maps a kind
    to why it could not be read (RBAC, API error). ``now`` is when it was read."""

    objects: dict[str, list[Obj]]
    unreadable: dict[str, str] = field(default_factory=dict)
    settings: Settings = field(default_factory=Settings)
    now: datetime.datetime = field(default_factory=lambda: datetime.datetime.now(datetime.UTC))

    def __getitem__(self, kind: str) -> list[Obj]:
        return self.objects.get(kind, [])

    def age(self, timestamp: str | None) -> datetime.timedelta | None:
        t = parse_time(timestamp)
        return None if t is None else self.now - t

    # --- lookups -----------------------------------------------------------------------

    @cached_property
    def _by_name(self) -> dict[str, dict[tuple[str, str], Obj]]:
        out: dict[str, dict[tuple[str, str], Obj]] = {}
        for kind, items in self.objects.items():
            out[kind] = {(ns_of(o), name_of(o)): o for o in items}
        return out

    def get(self, kind: str, name: str, namespace: str = "") -> Obj | None:
        return self._by_name.get(kind, {}).get((namespace, name))

    @cached_property
    def _events(self) -> dict[tuple[str, str, str], list[Obj]]:
        out: dict[tuple[str, str, str], list[Obj]] = defaultdict(list)
        for e in self["events"]:
            inv = e.get("involvedObject") or {}
            key = (str(inv.get("kind", "")), str(inv.get("namespace", "")), str(inv.get("name")))
            out[key].append(e)
        for items in out.values():
            items.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        return out

    def events(
        self, kind: str, namespace: str, name: str, reason: str = "", uid: str = ""
    ) -> list[Obj]:
        """Events about the object, oldest first (only the reasons collect.py reads); with
        ``uid``, not those of an earlier object of the same name (a recreated pod)."""
        items = self._events.get((kind, namespace, name), [])
        return [
            e for e in items
            if (not reason or e.get("reason") == reason)
            and (not uid or (e.get("involvedObject") or {}).get("uid", uid) == uid)
        ]  # fmt: skip

    def topolvm_class_of(self, pvc: Obj) -> tuple[Obj, Names] | None:
        """The PVC's StorageClass and its TopoLVM names, if TopoLVM provisions it."""
        sc = self.storage_class_of(pvc)
        n = names_for(str(sc.get("provisioner", ""))) if sc is not None else None
        return None if sc is None or n is None else (sc, n)

    def storage_class_of(self, pvc: Obj) -> Obj | None:
        sc = (pvc.get("spec") or {}).get("storageClassName")
        return self.get("storageclasses", str(sc)) if sc else None

    def topolvm_classes(self) -> Iterator[tuple[Obj, Names]]:
        for sc in self["storageclasses"]:
            n = names_for(str(sc.get("provisioner", "")))
            if n is not None:
                yield sc, n

    def advertising(self, resource: str) -> list[str]:
        """Names of the Nodes with ``resource`` (the marker) in ``status.allocatable``."""
        return [
            name_of(n) for n in self["nodes"]
            if resource in ((n.get("status") or {}).get("allocatable") or {})
        ]  # fmt: skip

    def node_capacities(self, node: Obj, names: Names) -> dict[str, int | None]:
        """The node's ``capacity.<plugin>/<class>`` annotations: class key -> bytes (None if
        the value is not a number)."""
        return {k: v for k, (v, _) in decode_node(names, annotations_of(node)).items()}

    def node_free(self, node: Obj, names: Names, device_class: str) -> int | None:
        raw = annotations_of(node).get(names.capacity_prefix + class_key(device_class))
        return None if raw is None else parse_node_value(raw)

    def pod_webhooks(self) -> list[tuple[Obj, Obj, Names]]:
        """(configuration, webhook, names) of every TopoLVM pod hook: named
        ``pod-hook.<plugin>`` as upstream's chart does, or served at ``/pod/mutate``."""
        out = []
        for conf in self["webhooks"]:
            for hook in conf.get("webhooks") or []:
                n = _hook_names(hook)
                if n is not None and _mutates_pods(hook):
                    out.append((conf, hook, n))
        return out

    def logs_command(self, container: str, node: str = "") -> str:
        """``kubectl logs`` for the (first) pod running ``container`` (on ``node``, if given);
        placeholders when no such pod is visible (TopoLVM runs elsewhere)."""
        for p in self["pods"]:
            on = (p.get("spec") or {}).get("nodeName")
            if container_of(p, container) is not None and (not node or on == node):
                return f"kubectl logs -n {ns_of(p)} {name_of(p)} -c {container}"
        if node:
            return f"kubectl get pods -A -o wide --field-selector spec.nodeName={node}"
        return f"kubectl logs -n <namespace> deploy/<release>-controller -c {container}"

    def topolvm_node_pod(self, node: str) -> Obj | None:
        return self._node_pods.get(node)

    def topolvm_node_pods(self) -> list[Obj]:
        """One topolvm-node pod per node (see :meth:`topolvm_node_pod`), by node name."""
        return [self._node_pods[n] for n in sorted(self._node_pods)]

    @cached_property
    def _node_pods(self) -> dict[str, Obj]:
        """The topolvm-node pod of each node; during a rollout, the running one."""

        def rank(p: Obj) -> tuple[bool, bool]:
            running = (p.get("status") or {}).get("phase") == "Running"
            return (running, not meta(p).get("deletionTimestamp"))

        out: dict[str, Obj] = {}
        for p in self["pods"]:
            node = str((p.get("spec") or {}).get("nodeName") or "")
            if (container_of(p, TOPOLVM_NODE_CONTAINER) is not None and node
                    and (node not in out or rank(p) > rank(out[node]))):  # fmt: skip
                out[node] = p
        return out

    def csi_nodes_with(self, driver: str) -> set[str]:
        out = set()
        for cn in self["csinodes"]:
            drivers = (cn.get("spec") or {}).get("drivers") or []
            if any(d.get("name") == driver for d in drivers):
                out.add(name_of(cn))
        return out


def _hook_names(hook: Obj) -> Names | None:
    name = str(hook.get("name", ""))
    for n in BOTH:
        if name.endswith("." + n.plugin):
            return n
    svc = (hook.get("clientConfig") or {}).get("service") or {}
    url = str((hook.get("clientConfig") or {}).get("url") or "")
    if svc.get("path") in POD_HOOK_PATHS or any(url.endswith(p) for p in POD_HOOK_PATHS):
        return NORMAL
    return None


def _mutates_pods(hook: Obj) -> bool:
    return any("pods" in (r.get("resources") or []) for r in hook.get("rules") or [])


def first(items: Iterable[Obj]) -> Obj | None:
    return next(iter(items), None)


def event_line(e: Obj) -> str:
    """``FailedScheduling (x12, last 2m ago): <message>`` for evidence lists."""
    count = e.get("count") or (e.get("series") or {}).get("count") or 1
    message = " ".join(str(e.get("message", "")).split())
    return f"{e.get('reason')} (x{count}): {message}"


def pod_label(pod: Obj) -> str:
    return f"pod {ns_of(pod)}/{name_of(pod)}"

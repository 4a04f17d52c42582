"""CSIStorageCapacity objects, which kube-scheduler reads when the CSIDriver has
``storageCapacity`` on: one per TopoLVM StorageClass and node is expected, matching the free
bytes the node's ``capacity.<plugin>/<class>`` annotation reports. Missing ones make
kube-scheduler reject the node ("did not have enough free storage"); stale ones mislead it."""

from __future__ import annotations

from topolvm.capacity_annotations import class_key
from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import (
    Obj,
    Snapshot,
    human_age,
    last_write,
    meta,
    name_of,
    ns_of,
    quantity_bytes,
)
from topolvm.units import human

ID = "capacity-objects"
GiB = 1 << 30


def settled(snap: Snapshot, obj: Obj) -> bool:
    """Older than --stale-after (or of unknown age)."""
    age = snap.age(meta(obj).get("creationTimestamp"))
    return age is None or age >= snap.settings.stale_after


def annotation_written(node: Obj, key: str) -> str:
    """When the annotation ``key`` was last written (its managedFields entry), or ""."""
    times = [
        str(m.get("time"))
        for m in meta(node).get("managedFields") or []
        if m.get("time")
        and f"f:{key}" in (((m.get("fieldsV1") or {}).get("f:metadata") or {})
                           .get("f:annotations") or {})
    ]  # fmt: skip
    return max(times, default="")


def run(snap: Snapshot) -> list[Finding]:
    findings = []
    published: dict[tuple[str, str], Obj] = {}
    for cap in snap["csistoragecapacities"]:
        labels = ((cap.get("nodeTopology") or {}).get("matchLabels")) or {}
        for key, node in labels.items():
            if key.startswith("topology.") and key.endswith("/node"):
                published[(str(cap.get("storageClassName")), str(node))] = cap
    for sc, names in snap.topolvm_classes():
        driver = snap.get("csidrivers", names.plugin)
        if driver is None or not (driver.get("spec") or {}).get("storageCapacity"):
            continue  # the csidriver check reports it
        if sc.get("volumeBindingMode") != "WaitForFirstConsumer":
            continue
        dc = str((sc.get("parameters") or {}).get(names.device_class_param, ""))
        nodes = snap.csi_nodes_with(names.plugin)
        missing: list[str] = []
        stale: list[str] = []
        key = names.capacity_prefix + class_key(dc)
        for node in snap["nodes"]:
            free = snap.node_free(node, names, dc)
            if free is None or name_of(node) not in nodes:
                continue
            found = published.get((name_of(sc), name_of(node)))
            if found is None:
                # csi-provisioner publishes within its poll interval: new nodes and classes
                # get --stale-after before they count as missing.
                if settled(snap, sc) and settled(snap, node):
                    missing.append(name_of(node))
                continue
            if "capacity" not in found:
                continue
            value = quantity_bytes(found["capacity"])
            age = snap.age(last_write(found))
            changed = snap.age(annotation_written(node, key))
            if (
                value is not None
                and abs(value - free) > max(GiB, free // 10)
                and (age is None or age >= snap.settings.stale_after)
                and (changed is None or changed >= snap.settings.stale_after)
            ):
                stale.append(
                    f"CSIStorageCapacity {ns_of(found)}/{name_of(found)} says {human(value)} "
                    f"for node {name_of(node)}, whose annotation says {human(free)}; "
                    f"last written {human_age(age) if age else '?'} ago"
                )
        fix = Fix(
            "csi-provisioner publishes these: check that it runs with --enable-capacity and "
            "can reach the controller (its logs name the error).",
            (snap.logs_command("csi-provisioner"),),
        )
        subject = (Ref("StorageClass", name_of(sc)),)
        if missing:
            findings.append(Finding(
                ID, Severity.ERROR,
                f"StorageClass {name_of(sc)}: no CSIStorageCapacity for {len(missing)} node(s)",
                "kube-scheduler treats a node without a capacity object as full, so pods "
                "needing this class never go there",
                tuple(f"node {n} has free space for class {dc or '(default)'} but no "
                      f"CSIStorageCapacity for {name_of(sc)}" for n in missing[:10]),
                (fix,), subject + tuple(Ref("Node", n) for n in missing),
            ))  # fmt: skip
        if stale:
            findings.append(Finding(
                ID, Severity.WARNING,
                f"StorageClass {name_of(sc)}: {len(stale)} stale CSIStorageCapacity object(s)",
                "csi-provisioner stopped refreshing them, so kube-scheduler places pods by "
                "old free-space numbers",
                tuple(stale[:10]), (fix,), subject,
            ))  # fmt: skip
    return findings


CHECK = Check(
    ID, 4, ("storageclasses", "csidrivers", "csistoragecapacities", "nodes", "csinodes"), run,
    "CSIStorageCapacity objects missing or stale compared with the Node annotations",
)  # fmt: skip

"""TopoLVM StorageClasses that cannot work: Immediate binding (the volume is made before the pod
is placed, on a node kube-scheduler did not choose), a device class no node has, a provisioner
of the other API group than the driver that runs, a parameter key of the other group, or a
restore placement that is neither choice."""

from __future__ import annotations

from topolvm.capacity_annotations import class_key
from topolvm.doctor.model import Check, Finding, Fix, Ref, Severity
from topolvm.doctor.snapshot import BOTH, Snapshot, name_of
from topolvm.placement import ANYWHERE, SOURCE_NODE, placement_error

ID = "storageclass"
WFFC = "WaitForFirstConsumer"


def run(snap: Snapshot) -> list[Finding]:
    findings = []
    drivers = {name_of(d) for d in snap["csidrivers"]}
    for sc, names in snap.topolvm_classes():
        sc_name = name_of(sc)
        subject = (Ref("StorageClass", sc_name),)
        params = dict(sc.get("parameters") or {})

        def add(
            severity: Severity, title: str, cause: str, evidence: list[str], fix: Fix,
            sc_name: str = sc_name, subject: tuple[Ref, ...] = subject,
        ) -> None:  # fmt: skip
            findings.append(Finding(ID, severity, f"StorageClass {sc_name}: {title}", cause,
                                    tuple(evidence), (fix,), subject))  # fmt: skip

        if sc.get("volumeBindingMode", "Immediate") != "WaitForFirstConsumer":
            add(Severity.WARNING, "volumeBindingMode is Immediate",
                "the volume is created before the pod is scheduled, on a node chosen without "
                "the pod, which then cannot run anywhere else",
                [f"StorageClass {sc_name}: volumeBindingMode "
                 f"{sc.get('volumeBindingMode', 'Immediate (default)')}"],
                Fix("The field is immutable: re-create the StorageClass with "
                    "volumeBindingMode: WaitForFirstConsumer (existing PVs keep working; Helm: "
                    "storageClasses[].storageClass.volumeBindingMode).",
                    recreate("storageclass", sc_name, f"volumeBindingMode: {WFFC}")))  # fmt: skip
        if names.plugin not in drivers and (other := _running_other(names.plugin, drivers)):
            add(Severity.ERROR, f"provisioner {names.plugin}, but the driver runs as {other}",
                f"no CSI driver named {names.plugin} runs, so its PVCs wait forever for an "
                "external provisioner",
                [f"StorageClass {sc_name}: provisioner {names.plugin}",
                 f"CSIDriver objects: {', '.join(sorted(drivers)) or 'none'}"],
                Fix(f"Re-create the StorageClass with provisioner {other} (and parameters "
                    f"{other}/...), or run TopoLVM in "
                    + ("legacy mode (USE_LEGACY)." if names.legacy else "new-group mode."),
                    recreate("storageclass", sc_name, f"provisioner: {other}")))  # fmt: skip
        for n in BOTH:
            key = n.device_class_param
            if n is not names and key in params:
                add(Severity.WARNING, f"parameter {key} belongs to the other API group",
                    f"the provisioner {names.plugin} reads {names.device_class_param} only, so "
                    "this class provisions from the default device class",
                    [f"StorageClass {sc_name}: parameters {key}={params[key]}"],
                    Fix(f"Re-create it with {names.device_class_param}."))  # fmt: skip
        if why := placement_error(params, names, f"StorageClass {sc_name}"):
            add(Severity.ERROR, f"parameter {names.restore_placement_param} is not valid",
                "CreateVolume refuses every claim of this class (INVALID_ARGUMENT), so they stay "
                "Pending",
                [why],
                Fix(f"Re-create the StorageClass with {names.restore_placement_param}: "
                    f"{SOURCE_NODE} (the default) or {ANYWHERE}.",
                    recreate("storageclass", sc_name,
                             f"{names.restore_placement_param}: {SOURCE_NODE}")))  # fmt: skip
        dc = params.get(names.device_class_param, "")
        reported = [c for nd in snap["nodes"] if (c := snap.node_capacities(nd, names))]
        if reported and not any(class_key(dc) in c for c in reported):
            known = sorted({k for c in reported for k in c})
            add(Severity.ERROR, f"device class {dc or '(default)'} exists on no node",
                "no lvmd has this device class, so every CreateVolume fails and its PVCs stay "
                "Pending",
                [f"StorageClass {sc_name}: {names.device_class_param}={dc or '(unset)'}",
                 f"{len(reported)} node(s) report classes: {', '.join(known)}"],
                Fix("Use one of the node's device classes in the StorageClass, or add the "
                    "class to lvmd's device-classes (Helm: lvmd.deviceClasses).",))  # fmt: skip
    return findings


def recreate(kind: str, name: str, change: str) -> tuple[str, ...]:
    """Commands that re-create an object whose field is immutable, after an edit by hand."""
    return (
        f"kubectl get {kind} {name} -o yaml > {name}.yaml",
        f"# edit {name}.yaml: set {change}; remove metadata.uid, resourceVersion, "
        "creationTimestamp and managedFields",
        f"kubectl replace --force -f {name}.yaml",
    )


def _running_other(plugin: str, drivers: set[str]) -> str | None:
    return next((n.plugin for n in BOTH if n.plugin != plugin and n.plugin in drivers), None)


CHECK = Check(
    ID, 5, ("storageclasses", "csidrivers", "nodes"), run,
    "StorageClasses with Immediate binding, an unknown device class or the other API group",
)  # fmt: skip

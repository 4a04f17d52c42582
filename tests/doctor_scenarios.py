"""Small clusters as ``topolvm doctor`` reads them (plain JSON objects), one broken and one
healthy per check, for the pure tests of each check (test_unit_doctor_checks.py). The same states
are built for real on the control plane in test_cluster_doctor.py."""

from __future__ import annotations

import base64
import datetime
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from topolvm.controller.webhookcerts import new_bundle, new_ca
from topolvm.doctor.snapshot import Snapshot

Obj = dict[str, Any]
GiB = 1 << 30
NOW = datetime.datetime(2026, 11, 24, 12, 0, tzinfo=datetime.UTC)
OLD = "2026-11-24T11:00:00Z"
MARKER = {"topolvm.io/capacity": "1"}


def snapshot(*objs: tuple[str, Obj]) -> Snapshot:
    """A snapshot of (kind, object) pairs; every kind the checks read is present."""
    kinds = (
        "nodes",
        "pods",
        "pvcs",
        "pvs",
        "services",
        "csinodes",
        "storageclasses",
        "csidrivers",
        "csistoragecapacities",
        "webhooks",
        "endpointslices",
        "logicalvolumes",
        "legacy-logicalvolumes",
        "volumemoves",
        "legacy-volumemoves",
        "events",
        "secrets",
        "served-certificates",
        "node-metrics",
        "scheduler-status",
    )
    out: dict[str, list[Obj]] = {k: [] for k in kinds}
    for kind, obj in objs:
        out[kind].append(obj)
    return Snapshot(out, now=NOW)


def node(name: str, free: int | None = 240 * GiB, csi: bool = True) -> list[tuple[str, Obj]]:
    ann = {} if free is None else {"capacity.topolvm.io/ssd": str(free)}
    out = [
        (
            "nodes",
            {
                "metadata": {"name": name, "annotations": ann},
                "status": {"allocatable": {"cpu": "8"}},
            },
        )
    ]
    if csi:
        out.append(
            (
                "csinodes",
                {"metadata": {"name": name}, "spec": {"drivers": [{"name": "topolvm.io"}]}},
            )
        )
    return out


def csidriver(
    name: str = "topolvm.io", capacity: bool = True, attach: bool = False
) -> tuple[str, Obj]:
    return (
        "csidrivers",
        {
            "metadata": {"name": name},
            "spec": {"storageCapacity": capacity, "attachRequired": attach},
        },
    )


def sc(
    name: str = "topolvm-provisioner",
    provisioner: str = "topolvm.io",
    dc: str | None = "ssd",
    binding: str = "WaitForFirstConsumer",
    params: dict[str, str] | None = None,
) -> tuple[str, Obj]:
    p = dict(params or ({} if dc is None else {f"{provisioner}/device-class": dc}))
    return (
        "storageclasses",
        {
            "metadata": {"name": name},
            "provisioner": provisioner,
            "parameters": p,
            "volumeBindingMode": binding,
        },
    )


def pvc(
    name: str,
    ns: str = "app",
    sc_name: str = "topolvm-provisioner",
    phase: str = "Pending",
    size: str = "10Gi",
    annotations: dict[str, str] | None = None,
) -> tuple[str, Obj]:
    return (
        "pvcs",
        {
            "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
            "spec": {"storageClassName": sc_name, "resources": {"requests": {"storage": size}}},
            "status": {"phase": phase},
        },
    )


def pod(
    name: str,
    ns: str = "app",
    claims: tuple[str, ...] = (),
    marker: bool = False,
    node_name: str | None = None,
    message: str = "",
    phase: str = "Pending",
    owned: bool = True,
    container: str = "app",
    ready: bool = False,
) -> tuple[str, Obj]:
    c: Obj = {"name": container}
    if marker:
        c["resources"] = {"requests": MARKER, "limits": MARKER}
    spec: Obj = {
        "containers": [c],
        "volumes": [{"name": x, "persistentVolumeClaim": {"claimName": x}} for x in claims],
    }
    if node_name:
        spec["nodeName"] = node_name
    conditions = []
    if message:
        conditions.append({"type": "PodScheduled", "status": "False", "message": message})
    if ready:
        conditions.append({"type": "Ready", "status": "True"})
    meta: Obj = {"name": name, "namespace": ns}
    if owned:
        meta["ownerReferences"] = [{"kind": "StatefulSet", "name": "vault", "controller": True}]
    return (
        "pods",
        {"metadata": meta, "spec": spec, "status": {"phase": phase, "conditions": conditions}},
    )


def event(kind: str, name: str, reason: str, message: str, ns: str = "app") -> tuple[str, Obj]:
    return (
        "events",
        {
            "metadata": {"name": f"{name}.1", "namespace": ns},
            "reason": reason,
            "message": message,
            "count": 3,
            "lastTimestamp": OLD,
            "involvedObject": {"kind": kind, "name": name, "namespace": ns},
        },
    )


def hook(name: str = "topolvm-hook", ca: bytes = b"", service: bool = True) -> tuple[str, Obj]:
    config: Obj = {"caBundle": base64.b64encode(ca).decode()}
    if service:
        config["service"] = {
            "namespace": "topolvm-system",
            "name": "topolvm-controller",
            "path": "/pod/mutate",
        }
    else:
        config["url"] = "https://127.0.0.1:9443/pod/mutate"
    return (
        "webhooks",
        {
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "pod-hook.topolvm.io",
                    "clientConfig": config,
                    "failurePolicy": "Fail",
                    "rules": [{"resources": ["pods"]}],
                }
            ],
        },
    )


def endpoints(ready: bool = True) -> list[tuple[str, Obj]]:
    return [
        ("services", {"metadata": {"name": "topolvm-controller", "namespace": "topolvm-system"}}),
        (
            "endpointslices",
            {
                "metadata": {
                    "name": "topolvm-controller-x",
                    "namespace": "topolvm-system",
                    "labels": {"kubernetes.io/service-name": "topolvm-controller"},
                },
                "endpoints": [{"conditions": {"ready": ready}}],
            },
        ),
    ]


def tls_secret(dns: str = "topolvm-controller.topolvm-system.svc") -> tuple[bytes, tuple[str, Obj]]:
    """(CA certificate, Secret with a serving certificate it signed)."""
    bundle = new_bundle([dns], [], NOW - datetime.timedelta(hours=1))
    secret = {
        "metadata": {"name": "topolvm-webhook-tls", "namespace": "topolvm-system"},
        "type": "kubernetes.io/tls",
        "data": bundle.secret_data(),
    }
    return bundle.ca_crt, ("secrets", secret)


def other_ca() -> bytes:
    return new_ca(NOW)[0]


def capacity(sc_name: str, node_name: str, size: int, written: str = OLD) -> tuple[str, Obj]:
    return (
        "csistoragecapacities",
        {
            "metadata": {
                "name": f"csisc-{node_name}",
                "namespace": "topolvm-system",
                "managedFields": [{"manager": "csi-provisioner", "time": written}],
            },
            "storageClassName": sc_name,
            "capacity": str(size),
            "nodeTopology": {"matchLabels": {"topology.topolvm.io/node": node_name}},
        },
    )


def lv(
    name: str,
    node_name: str,
    code: int = 0,
    deleting: str | None = None,
    kind: str = "logicalvolumes",
) -> tuple[str, Obj]:
    meta: Obj = {"name": name, "finalizers": ["topolvm.io/logicalvolume"]}
    if deleting:
        meta["deletionTimestamp"] = deleting
    return (
        kind,
        {
            "metadata": meta,
            "spec": {"nodeName": node_name, "deviceClass": "ssd"},
            "status": {"code": code, "message": "no enough space" if code else ""},
        },
    )


def metrics(node_name: str, dc: str, data: float, meta: float) -> tuple[str, Obj]:
    pool = {"device_class": dc, "data_percent": data, "metadata_percent": meta}
    return (
        "node-metrics",
        {
            "metadata": {"name": node_name},
            "pod": f"topolvm-system/node-{node_name}",
            "pools": [pool],
        },
    )


def intermediate(root_crt: bytes, root_key: bytes) -> tuple[bytes, bytes]:
    """An intermediate CA signed by the root (PEM certificate and key)."""
    root = x509.load_pem_x509_certificate(root_crt)
    signer = serialization.load_pem_private_key(root_key, password=None)
    assert isinstance(signer, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "intermediate")])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(root.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(signer, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())  # fmt: skip
    return cert.public_bytes(pem), key_pem


def volume_move(
    claim: str,
    phase: str,
    message: str = "",
    ns: str = "app",
    kind: str = "volumemoves",
    **status: Any,
) -> tuple[str, Obj]:
    """A VolumeMove of ``claim`` from w1 to w2 at ``phase``; ``status`` adds or overrides
    fields (camelCase, as the API has them)."""
    st: Obj = {
        "phase": phase,
        "message": message,
        "sourceNode": "w1",
        "targetNode": "w2",
        "sourceVolume": f"pvc-{claim}-old",
        "targetVolume": f"pvc-{claim}-new",
        "pod": f"{claim}-pod",
        "owner": "StatefulSet/vault",
        **status,
    }
    return (
        kind,
        {
            "metadata": {"name": claim, "namespace": ns, "uid": f"move-{claim}",
                         "creationTimestamp": OLD},
            "spec": {"claim": claim},
            "status": st,
        },
    )  # fmt: skip

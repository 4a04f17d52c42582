"""The pod webhook's decision (spec §7.1), without Kubernetes. Its HTTPS server is in
test_controller_webhook.py, its certificates in test_unit_webhookcerts.py; the API server side
is in test_cluster_webhook_pods.py."""

from __future__ import annotations

import jsonpatch
import pytest

from tests.podmutate_helpers import GiB, Obj, Reader, capacity, claim, ephemeral, pod, pvc
from topolvm.constants import LEGACY, NORMAL
from topolvm.controller.podmutate import Decision, decide, marker_warnings


def applied(original: Obj, decision: Decision) -> Obj:
    patched: Obj = jsonpatch.apply_patch(original, decision.patch)
    return patched


async def test_a_pod_without_containers_is_denied_and_one_without_volumes_allowed() -> None:
    empty: list[Obj] = [pod(claim("data"), containers=0), {"metadata": {}, "spec": {}}]
    for p in empty:
        d = await decide(p, "app", Reader(), NORMAL)
        assert (d.kind, d.allowed, d.code, d.message) == (
            "denied", False, 403, "pod has no containers"
        )  # fmt: skip
    no_volumes: list[Obj] = [pod(), {"spec": {"containers": [{"name": "c"}], "volumes": []}}]
    for p in no_volumes:
        d = await decide(p, "app", Reader(), NORMAL)
        assert (d.kind, d.allowed, d.message, d.patch) == ("allowed", True, "no volumes", [])
    d = await decide("not a pod", "app", Reader(), NORMAL)
    assert (d.kind, d.code) == ("errored", 400)


async def test_pvcs_and_ephemeral_volumes_are_summed_per_device_class() -> None:
    reader = Reader({
        "app/a": pvc("ssd", "3Gi"), "app/b": pvc("ssd", "1.5Gi"), "app/c": pvc("plain", "100m"),
        "app/d": pvc("plain", None), "app/e": pvc("ssd", "0"),
    })  # fmt: skip
    p = pod(
        claim("a"), claim("b"), claim("c"), claim("d"), claim("e"),
        ephemeral("ssd", "2G", "e1"), ephemeral("plain", None, "e2"),
        {"name": "scratch", "emptyDir": {}},
    )  # fmt: skip
    d = await decide(p, "ignored", reader, NORMAL)
    assert d.kind == "mutated" and d.allowed
    # Bytes, not GiB; 100m rounds up to 1 byte; a missing or zero request counts 1 GiB.
    want = {"ssd": 3 * GiB + 1536 * (1 << 20) + GiB + 2 * 10**9, "00default": 1 + GiB + GiB}
    assert d.requested == want
    out = applied(p, d)
    assert capacity(out) == {f"capacity.topolvm.io/{k}": str(v) for k, v in want.items()}
    assert out["metadata"]["annotations"]["team"] == "a"
    assert d.warnings == []
    # The StorageClass cache: each class read once per request.
    assert sorted(r for r in reader.reads if r.startswith("sc")) == ["sc plain", "sc ssd"]


async def test_skipped_volumes_and_the_namespace_fallback() -> None:
    reader = Reader({
        "req-ns/foreign": pvc("nfs"), "req-ns/nosc": pvc(None), "req-ns/emptysc": pvc(""),
        "req-ns/unknown-sc": pvc("gone"), "req-ns/legacy": pvc("legacy-ssd"),
        "req-ns/mine": pvc("ssd", "5Gi"), "other/mine": pvc("ssd", "7Gi"),
        "req-ns/bound-nfs": pvc("nfs", phase="Bound"),
    })  # fmt: skip
    volumes = [
        claim("foreign"), claim("nosc"), claim("emptysc"), claim("unknown-sc"), claim("legacy"),
        claim("missing"), claim("bound-nfs"), claim("mine"), ephemeral(None, "9Gi", "e-nosc"),
        ephemeral("", "9Gi", "e-empty"), ephemeral("nfs", "9Gi", "e-nfs"), claim(""),
    ]  # fmt: skip
    # No namespace on the pod (a pod from a template): the request's namespace is used.
    d = await decide(pod(*volumes, namespace=None), "req-ns", reader, NORMAL)
    assert d.requested == {"ssd": 5 * GiB}
    assert "pvc req-ns/missing" in reader.reads  # a missing PVC is skipped, the pod admitted
    assert "pvc req-ns/" not in reader.reads and "sc " not in reader.reads  # no empty names
    d = await decide(pod(*volumes, namespace=""), "req-ns", reader, NORMAL)
    assert d.requested == {"ssd": 5 * GiB}
    d = await decide(pod(claim("mine"), namespace="other"), "req-ns", reader, NORMAL)
    assert d.requested == {"ssd": 7 * GiB}
    others = [v for v in volumes if v != claim("mine")]
    nothing = await decide(pod(*others, namespace=None), "req-ns", reader, NORMAL)
    assert (nothing.kind, nothing.message, nothing.patch) == (
        "allowed", "no request for TopoLVM", []
    )  # fmt: skip


@pytest.mark.parametrize("phase", ["Bound", "Lost"])
async def test_a_topolvm_pvc_that_is_not_pending_leaves_the_pod_alone(phase: str) -> None:
    reader = Reader({"app/new": pvc("ssd"), "app/old": pvc("plain", phase=phase)})
    for volumes in ([claim("new"), claim("old")], [claim("old"), ephemeral("ssd")]):
        d = await decide(pod(*volumes), "app", reader, NORMAL, marker=True)
        assert (d.kind, d.message, d.patch, d.warnings) == (
            "allowed", "no request for TopoLVM", [], []
        )  # fmt: skip


async def test_marker_mode_adds_the_resource_to_the_first_container_and_warns() -> None:
    reader = Reader({"app/a": pvc("ssd", "2Gi")})
    p = pod(claim("a"))
    p["spec"]["containers"][0]["resources"]["limits"] = {"memory": "1Gi"}
    p["metadata"]["annotations"]["capacity.topolvm.io/ssd"] = "1"  # overwritten
    plain = await decide(p, "app", reader, NORMAL)
    out = applied(p, plain)
    assert out["spec"] == p["spec"] and plain.warnings == []
    assert capacity(out) == {"capacity.topolvm.io/ssd": str(2 * GiB)}

    marked = await decide(p, "app", reader, NORMAL, marker=True)
    out = applied(p, marked)
    first, second = out["spec"]["containers"]
    assert first["resources"] == {
        "requests": {"cpu": "1", "topolvm.io/capacity": "1"},
        "limits": {"memory": "1Gi", "topolvm.io/capacity": "1"},
    }
    assert second == p["spec"]["containers"][1]
    assert capacity(out) == {"capacity.topolvm.io/ssd": str(2 * GiB)}
    assert marked.warnings == marker_warnings(NORMAL)
    text = " ".join(marked.warnings)
    for words in ("topolvm-scheduler", "kube-scheduler extender", "topolvm-node advertises"):
        assert words in text
    assert all(len(w) <= 120 for w in marked.warnings)
    # JSON pointers escape the "/" of annotation and resource names.
    paths = {op["path"] for op in marked.patch}
    assert "/metadata/annotations/capacity.topolvm.io~1ssd" in paths
    assert "/spec/containers/0/resources/requests/topolvm.io~1capacity" in paths
    # A container without resources at all gets whole maps (adding into a missing map fails).
    bare = pod(claim("a"), containers=1)
    del bare["spec"]["containers"][0]["resources"], bare["metadata"]["annotations"]
    out = applied(bare, await decide(bare, "app", reader, NORMAL, marker=True))
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"topolvm.io/capacity": "1"}
    assert capacity(out) == {"capacity.topolvm.io/ssd": str(2 * GiB)}


async def test_legacy_names() -> None:
    reader = Reader({"app/a": pvc("legacy-ssd", "1Gi"), "app/b": pvc("ssd")})
    d = await decide(pod(claim("a"), claim("b")), "app", reader, LEGACY, marker=True)
    out = applied(pod(claim("a"), claim("b")), d)
    assert capacity(out, LEGACY) == {"capacity.topolvm.cybozu.com/ssd": str(GiB)}
    assert out["spec"]["containers"][0]["resources"]["limits"] == {
        "topolvm.cybozu.com/capacity": "1"
    }


async def test_read_errors_and_bad_quantities_are_errors() -> None:
    p = pod(claim("a"), ephemeral("ssd"))
    d = await decide(p, "app", Reader({"app/a": pvc("ssd")}, fail="pvc"), NORMAL)
    assert (d.kind, d.allowed, d.code) == ("errored", False, 500)
    assert (
        d.message == "cannot get PersistentVolumeClaim app/a: 503 ServiceUnavailable: etcd is down"
    )
    d = await decide(p, "app", Reader({"app/a": pvc("ssd")}, fail="sc"), NORMAL)
    assert (d.code, d.message) == (
        500, "cannot get StorageClass ssd: 503 ServiceUnavailable: etcd is down"
    )  # fmt: skip
    d = await decide(pod(ephemeral("ssd", "lots")), "app", Reader(), NORMAL)
    assert (d.kind, d.code) == ("errored", 400)
    assert "ephemeral volume eph: resources.requests.storage" in d.message

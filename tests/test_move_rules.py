"""The refusal checks and the target choice of a move (src/topolvm/move/rules.py)."""

from __future__ import annotations

from typing import Any

import pytest

from topolvm.move import rules
from topolvm.move.rules import Refused
from topolvm.units import apart

Obj = dict[str, Any]
DRIVER = "topolvm.io"
KEY = "topology.topolvm.io/node"
GIB = 1 << 30


def pvc(phase: str = "Bound", modes: tuple[str, ...] = ("ReadWriteOnce",), **meta: Any) -> Obj:
    return {
        "metadata": {"name": "data", "namespace": "ns", **meta},
        "spec": {"accessModes": list(modes), "volumeName": "pv-1"},
        "status": {"phase": phase},
    }


def pv(driver: str | None = DRIVER, node: str = "n1") -> Obj:
    spec: Obj = {
        "nodeAffinity": {"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": KEY, "operator": "In", "values": [node]}]}
        ]}},
    }  # fmt: skip
    if driver is not None:
        spec["csi"] = {"driver": driver, "volumeHandle": "vol-1"}
    return {"metadata": {"name": "pv-1"}, "spec": spec}


def pod(
    name: str = "web-0", claim: str = "data", phase: str = "Running",
    owner: tuple[str, str] | None = ("StatefulSet", "web"), deleting: bool = False,
) -> Obj:  # fmt: skip
    meta: Obj = {"name": name, "namespace": "ns"}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": "n1", "volumes": [{"name": "v", "persistentVolumeClaim":
                                                  {"claimName": claim}}]},
        "status": {"phase": phase},
    }  # fmt: skip


def refused(call: Any, *args: Any, **kw: Any) -> Refused:
    with pytest.raises(Refused) as info:
        call(*args, **kw)
    return info.value


# -- check_claim --------------------------------------------------------------------------


def test_a_bound_topolvm_claim_passes() -> None:
    rules.check_claim("data", pvc(), pv(), DRIVER)


@pytest.mark.parametrize(
    ("claim", "volume", "reason", "words"),
    [
        (None, None, "ClaimNotFound", "claim data does not exist"),
        (pvc(deletionTimestamp="2024-01-01T00:00:00Z"), pv(), "ClaimDeleting", "being deleted"),
        (pvc(phase="Pending"), None, "ClaimNotBound", "not bound to a volume"),
        (pvc(), None, "ClaimNotBound", "nothing to move"),
        (pvc(), pv(driver="ebs.csi.aws.com"), "NotTopoLVM", "provisioned by ebs.csi.aws.com"),
        (pvc(), pv(driver=None), "NotTopoLVM", "provisioned by no CSI driver, not topolvm.io"),
        (pvc(modes=("ReadWriteMany",)), pv(), "SharedAccess", "is ReadWriteMany"),
        (pvc(modes=("ReadOnlyMany", "ReadWriteOnce")), pv(), "SharedAccess", "ReadOnlyMany"),
    ],
)
def test_check_claim_refusals(
    claim: Obj | None, volume: Obj | None, reason: str, words: str
) -> None:
    e = refused(rules.check_claim, "data", claim, volume, DRIVER)
    assert e.reason == reason
    assert words in e.message and str(e) == e.message


def test_source_node_reads_the_node_affinity() -> None:
    assert rules.source_node(pv(node="n7"), KEY) == "n7"
    assert rules.source_node(pv(), "topology.topolvm.cybozu.com/node") == ""
    assert rules.source_node({"spec": {}}, KEY) == ""


# -- workload -----------------------------------------------------------------------------


def test_the_pod_of_a_statefulset_is_the_workload() -> None:
    others = [pod("other", claim="logs"), pod("old", phase="Succeeded")]
    w = rules.workload("data", [*others, pod()], {})
    assert w == rules.Workload("web-0", "n1", "StatefulSet", "web")


def test_a_one_replica_deployment_is_the_workload() -> None:
    p = pod("app-1", owner=("ReplicaSet", "app-5d8"))
    w = rules.workload("data", [p], {"app-5d8": ("Deployment", "app", 1)})
    assert (w.owner_kind, w.owner) == ("Deployment", "app")


@pytest.mark.parametrize(
    ("pods", "owners", "reason", "words"),
    [
        ([], {}, "NoRunningPod", "no running pod uses claim data"),
        ([pod(phase="Failed")], {}, "NoRunningPod", "start its workload first"),
        ([pod("a"), pod("b")], {}, "SharedClaim", "used by several pods (a, b)"),
        ([pod(phase="Pending")], {}, "PodNotRunning", "is not running (phase Pending)"),
        ([pod(deleting=True)], {}, "PodNotRunning", "pod web-0, which uses claim data"),
        ([pod(owner=None)], {}, "NoController", "has no controller (a bare pod)"),
        ([pod(owner=("DaemonSet", "ds"))], {}, "NoController", "is owned by DaemonSet ds"),
        ([pod(owner=("ReplicaSet", "rs"))], {}, "NoController", "owned by ReplicaSet rs"),
        (
            [pod(owner=("ReplicaSet", "rs"))], {"rs": ("Deployment", "app", 3)},
            "ManyReplicas", "Deployment app with 3 replicas",
        ),
    ],
)  # fmt: skip
def test_workload_refusals(
    pods: list[Obj], owners: dict[str, tuple[str, str, int]], reason: str, words: str
) -> None:
    e = refused(rules.workload, "data", pods, owners)
    assert e.reason == reason
    assert words in e.message


# -- target_node --------------------------------------------------------------------------

FREE = {"n1": 50 * GIB, "n2": 20 * GIB, "n3": 30 * GIB, "n4": 90 * GIB}
OK = {"n1", "n2", "n3"}  # n4 is cordoned


def test_the_target_is_the_schedulable_node_with_most_free_bytes() -> None:
    assert rules.target_node("n1", 10 * GIB, FREE, OK) == "n3"
    assert rules.target_node("n1", 25 * GIB, FREE, OK) == "n3"
    assert rules.target_node("n3", 10 * GIB, FREE, OK) == "n1"


def test_ties_go_to_the_first_name() -> None:
    assert rules.target_node("n1", GIB, {"b": GIB, "a": GIB, "n1": 0}, {"a", "b"}) == "a"


def test_a_requested_node_that_fits_is_the_target() -> None:
    assert rules.target_node("n1", 10 * GIB, FREE, OK, requested="n2") == "n2"


@pytest.mark.parametrize(
    ("requested", "size", "reason", "words"),
    [
        ("n1", GIB, "SameNode", "the claim is on node n1 already"),
        ("n9", GIB, "UnknownNode", "node n9 runs no TopoLVM node for the default device class"),
        ("n4", GIB, "Unschedulable", "node n4 is cordoned or not ready"),
        ("n2", 25 * GIB, "NoRoom", "node n2 has 20.0 GiB free in the default device class; "
                                   "the volume needs 25.0 GiB"),
    ],
)  # fmt: skip
def test_requested_target_refusals(requested: str, size: int, reason: str, words: str) -> None:
    e = refused(rules.target_node, "n1", size, FREE, OK, requested=requested)
    assert e.reason == reason
    assert words in e.message


def test_no_room_names_the_most_a_schedulable_node_has() -> None:
    """The cordoned n4's 90 GiB is no help and is not quoted."""
    e = refused(rules.target_node, "n1", 40 * GIB, FREE, OK, device_class="ssd")
    assert e.reason == "NoRoom"
    assert e.message == (
        "no other schedulable node has 40.0 GiB free in ssd (the most is 30.0 GiB)"
    )


def test_no_room_tells_close_figures_apart() -> None:
    """The demo's refusal once read "has 17.0 GiB free ...; the volume needs 17.0 GiB": the
    figures get the decimals that tell them apart, or their exact bytes."""
    free = {"n1": 0, "n2": 17 * GIB - 300 * (1 << 20)}
    e = refused(rules.target_node, "n1", 17 * GIB, free, {"n1", "n2"}, requested="n2")
    assert e.message.endswith("has 16.7 GiB free in the default device class; the volume "
                              "needs 17.0 GiB")  # fmt: skip
    free["n2"] = 17 * GIB - 512
    e = refused(rules.target_node, "n1", 17 * GIB, free, {"n1", "n2"}, requested="n2")
    assert f"has 17.000 GiB ({17 * GIB - 512} bytes) free" in e.message
    assert f"needs 17.000 GiB ({17 * GIB} bytes)" in e.message
    e = refused(rules.target_node, "n1", 17 * GIB, free, {"n1", "n2"})
    assert e.message == (
        f"no other schedulable node has 17.000 GiB ({17 * GIB} bytes) free in the default "
        f"device class (the most is 17.000 GiB ({17 * GIB - 512} bytes))"
    )


@pytest.mark.parametrize(
    ("have", "need", "shown"),
    [
        (20 * GIB, 25 * GIB, ("20.0 GiB", "25.0 GiB")),
        (5 * GIB, 5 * GIB, ("5.0 GiB", "5.0 GiB")),  # equal: no more digits than it takes
        (GIB + 10 * (1 << 20), GIB + 20 * (1 << 20), ("1.01 GiB", "1.02 GiB")),
        (300 << 20, 2 * GIB, ("0.3 GiB", "2.0 GiB")),  # one unit: the larger figure's
        (20, 25, ("20 B", "25 B")),
    ],
)  # fmt: skip
def test_apart(have: int, need: int, shown: tuple[str, str]) -> None:
    assert apart(have, need) == shown


def test_no_room_when_no_other_node_is_schedulable() -> None:
    e = refused(rules.target_node, "n1", GIB, FREE, {"n1"})
    assert e.reason == "NoRoom"
    assert "no other schedulable node (uncordoned, Ready, one the pod may run on) runs " \
        "TopoLVM" in e.message  # fmt: skip


# -- estimate -----------------------------------------------------------------------------


def test_estimate_with_an_assumed_rate() -> None:
    est = rules.estimate(10 * GIB, [])
    assert not est.measured and est.rate == rules.ASSUMED_RATE
    assert est.precopy_bytes == 10 * GIB and est.delta_bytes == GIB
    assert est.downtime_seconds == pytest.approx(rules.RESTART_SECONDS + GIB / (100 << 20))


def test_estimate_takes_the_median_of_measured_rates() -> None:
    est = rules.estimate(GIB, [0, 300, 100, 200, -5])
    assert est.measured and est.rate == 200


def test_estimate_takes_the_stop_and_start_from_finished_moves() -> None:
    """A cluster whose moves took 20-40 s down (their final copies' share at the estimate's
    rate taken off) expects the median of those, not the assumed 10 s."""
    rate = 100 << 20
    past = [(40.0, 0), (25.0, 5 * rate), (30.0, 0), (0.0, 0), (3.0, 10 * rate)]
    est = rules.estimate(GIB, [rate], past)
    # shares: 40, 20, 30, 1 (3 s for 10 s of copy: at least LEAST_RESTART); 0 s: not measured
    assert est.restarts_measured == 4 and est.restart_seconds == 30.0
    assert est.downtime_seconds == pytest.approx(30.0 + (GIB // 10) / rate)
    assumed = rules.estimate(GIB, [rate])
    assert assumed.restarts_measured == 0 and assumed.restart_seconds == rules.RESTART_SECONDS


def test_a_pods_node_local_claims_move_together() -> None:
    pod = {"spec": {"volumes": [
        {"name": "d", "persistentVolumeClaim": {"claimName": "data-vault-0"}},
        {"name": "a", "persistentVolumeClaim": {"claimName": "audit-vault-0"}},
        {"name": "c", "configMap": {"name": "cfg"}},
    ]}}  # fmt: skip
    assert rules.claims_of(pod) == ["data-vault-0", "audit-vault-0"]
    local = {"audit-vault-0": "topolvm.io"}
    rules.together("vault-0", "data-vault-0", {}, [])  # no other node-local claim: fine
    rules.together("vault-0", "data-vault-0", local, ["audit-vault-0"])  # moved with it: fine
    with pytest.raises(rules.Refused) as e:
        rules.together("vault-0", "data-vault-0", local, [])
    assert e.value.reason == "OtherLocalClaims"
    assert e.value.message.startswith(
        "pod vault-0 also uses audit-vault-0, node-local too: they must move with data-vault-0"
    )
    with pytest.raises(rules.Refused) as e:
        rules.together("vault-0", "data-vault-0", local, ["audit-vault-0", "logs-vault-0"])
    assert e.value.reason == "NotTogether"
    assert e.value.message == (
        "logs-vault-0 listed to move with data-vault-0 is not a node-local claim of pod vault-0"
    )


def test_claims_moving_together_go_to_a_node_with_room_for_all() -> None:
    free = {"ssd": {"a": 100, "b": 30, "c": 60}, "thin": {"a": 100, "b": 90, "c": 20}}
    sched = ["a", "b", "c"]
    # b has the most of "thin" and c the most of "ssd", but only b has room for both
    assert rules.group_target("a", {"ssd": 25, "thin": 50}, free, sched) == "b"
    # both fit: the most free bytes over the classes
    assert rules.group_target("a", {"ssd": 10, "thin": 10}, free, sched) == "b"
    assert rules.group_target("a", {"ssd": 10}, free, sched) == "c"  # one class: target_node
    with pytest.raises(rules.Refused) as e:
        rules.group_target("a", {"ssd": 50, "thin": 50}, free, sched)
    assert e.value.reason == "NoRoom"
    assert "room for all the claims that move together" in e.value.message
    with pytest.raises(rules.Refused) as e:
        rules.group_target("a", {"ssd": 25, "thin": 50}, free, sched, requested="c")
    assert e.value.reason == "NoRoom" and e.value.message.startswith("node c has 20 B free")
    assert rules.group_target("a", {"ssd": 25, "thin": 10}, free, sched, requested="c") == "c"

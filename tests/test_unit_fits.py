"""Whether a pod may run on a node by the node's rules (src/topolvm/move/fits.py): a move goes
only where its pod may run, and the image pre-pull pod is made only there, with the workload's
constraints and no more (docs/mobility.md)."""

from __future__ import annotations

from typing import Any

import pytest

from topolvm.move import fits, prepull
from topolvm.move.rules import Refused, target_node

Obj = dict[str, Any]


def _node(name: str, labels: Obj | None = None, taints: list[Obj] | None = None) -> Obj:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints or []}}


def _pod(**spec: Any) -> Obj:
    return {"metadata": {"name": "db-0"}, "spec": {"containers": [{"image": "db:1"}], **spec}}


GPU = {"key": "gpu", "value": "yes", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("pod", "node", "says"),
    [
        (_pod(), _node("n1"), ""),
        (_pod(), _node("n1", taints=[GPU]), "taint gpu=yes:NoSchedule"),
        (_pod(), _node("n1", taints=[{**GPU, "effect": "PreferNoSchedule"}]), ""),
        (_pod(tolerations=[{"key": "gpu", "operator": "Equal", "value": "yes"}]),
         _node("n1", taints=[GPU]), ""),
        (_pod(tolerations=[{"key": "gpu", "operator": "Equal", "value": "no"}]),
         _node("n1", taints=[GPU]), "does not tolerate"),
        (_pod(tolerations=[{"operator": "Exists", "effect": "NoExecute"}]),
         _node("n1", taints=[GPU]), "does not tolerate"),
        (_pod(tolerations=[{"operator": "Exists"}]), _node("n1", taints=[GPU]), ""),
        (_pod(nodeSelector={"disk": "ssd"}), _node("n1", {"disk": "ssd"}), ""),
        (_pod(nodeSelector={"disk": "ssd"}), _node("n1", {"disk": "hdd"}), "nodeSelector"),
        (_pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]},
            ]}}}), _node("n2", {"zone": "b"}), ""),
        (_pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                                      {"key": "cores", "operator": "Gt", "values": ["8"]}]},
            ]}}}), _node("n2", {"zone": "a", "cores": "4"}), "required node affinity"),
        (_pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{}]}}}), _node("n2"), "required node affinity"),
    ],
)  # fmt: skip
def test_taints_selectors_and_required_affinity(pod: Obj, node: Obj, says: str) -> None:
    why = fits.refusal(pod, node)
    assert (says in why and bool(why)) if says else why == ""


def test_a_move_goes_only_where_its_pod_may_run() -> None:
    free = {"n1": 100, "n2": 500, "n3": 200}
    unfit = {"n2": "node n2 has the taint gpu=yes:NoSchedule, which the pod does not tolerate"}
    assert target_node("n1", 50, free, {"n1", "n2", "n3"}, unfit=unfit) == "n3"
    with pytest.raises(Refused) as e:
        target_node("n1", 50, free, {"n1", "n2", "n3"}, "n2", unfit=unfit)
    assert e.value.reason == "PodNotAllowed" and "taint gpu=yes" in e.value.message


def test_the_pre_pull_pod_carries_the_workloads_constraints_and_no_more() -> None:
    workload = _pod(tolerations=[{"key": "gpu", "operator": "Exists"}],
                    nodeSelector={"disk": "ssd"}, runtimeClassName="kata", hostNetwork=True,
                    affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "zone", "operator": "In", "values": ["a"]}]}]}},
                        "podAntiAffinity": {"x": 1}})  # fmt: skip
    workload["metadata"]["namespace"] = "shop"
    spec = prepull.prepull_pod(workload, "n2", "p", {})["spec"]
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert spec["nodeSelector"] == {"disk": "ssd"} and spec["runtimeClassName"] == "kata"
    assert list(spec["affinity"]) == ["nodeAffinity"]
    assert "hostNetwork" not in spec and spec["activeDeadlineSeconds"] == prepull.DEADLINE
    assert spec["securityContext"]["runAsNonRoot"] is True
    [c] = spec["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["resources"]["limits"] == prepull.LIMITS

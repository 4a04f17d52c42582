"""Whether a pod may run on a node by the node's own rules (pure): its taints, and the pod's
node selector and required node affinity, as kube-scheduler's TaintToleration and NodeAffinity
filters read them. A move goes only to a node its pod may run on (the pod would stay Pending
there), and the image pre-pull pod, which the controller pins to the target, carries the
workload's constraints and is made only where they hold (docs/mobility.md).

Not looked at: resources, ports, pod (anti-)affinity and topology spread, which depend on
what else runs there and change by the minute; kube-scheduler checks those when the pod
starts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Obj = Mapping[str, Any]
BLOCKING = ("NoSchedule", "NoExecute")  # PreferNoSchedule only lowers a score


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list) else []


def tolerates(tolerations: Sequence[Any], taint: Obj) -> bool:
    for t in map(_map, tolerations):
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def _matches(requirement: Obj, values: Mapping[str, str]) -> bool:
    key, op = str(requirement.get("key") or ""), requirement.get("operator")
    wanted = [str(v) for v in _list(requirement.get("values"))]
    have = values.get(key)
    if op == "In":
        return have is not None and have in wanted
    if op == "NotIn":
        return have is None or have not in wanted
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and len(wanted) == 1:
        try:
            a, b = int(have), int(wanted[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def _term_matches(term: Obj, labels: Mapping[str, str], fields: Mapping[str, str]) -> bool:
    expressions = _list(term.get("matchExpressions"))
    by_field = _list(term.get("matchFields"))
    if not expressions and not by_field:
        return False  # an empty term matches no node
    return all(_matches(_map(r), labels) for r in expressions) and all(
        _matches(_map(r), fields) for r in by_field
    )


def refusal(pod: Obj, node: Obj) -> str:
    """Why ``pod`` may not run on ``node`` ("" when it may)."""
    spec, meta = _map(pod.get("spec")), _map(node.get("metadata"))
    name = str(meta.get("name") or "")
    labels = {str(k): str(v) for k, v in _map(meta.get("labels")).items()}
    tolerations = _list(spec.get("tolerations"))
    for taint in map(_map, _list(_map(node.get("spec")).get("taints"))):
        if taint.get("effect") in BLOCKING and not tolerates(tolerations, taint):
            shown = f"{taint.get('key')}={taint.get('value') or ''}:{taint.get('effect')}"
            return f"node {name} has the taint {shown}, which the pod does not tolerate"
    for key, value in _map(spec.get("nodeSelector")).items():
        if labels.get(str(key)) != str(value):
            return f"the pod's nodeSelector {key}={value} does not match node {name}"
    required = _map(_map(_map(spec.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"))  # fmt: skip
    if required:
        terms = [_map(t) for t in _list(required.get("nodeSelectorTerms"))]
        if not any(_term_matches(t, labels, {"metadata.name": name}) for t in terms):
            return f"the pod's required node affinity does not match node {name}"
    return ""

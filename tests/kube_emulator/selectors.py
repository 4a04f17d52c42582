"""Label and field selectors, parsed like the real API server (a 400 when they do not)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tests.kube_emulator.errors import ApiFailure
from tests.kube_emulator.objects import JSON, ResourceType

_LABEL_TERM = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9._/-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<val>[A-Za-z0-9._-]*)|\s+(?P<set>in|notin)\s*\((?P<vals>[^)]*)\))?\s*$"
)
_FIELD_TERM = re.compile(r"^\s*(?P<key>[A-Za-z0-9._-]+)\s*(?P<op>==|=|!=)\s*(?P<val>[^,]*?)\s*$")

Predicate = Callable[[JSON], bool]


def _split_terms(selector: str) -> list[str]:
    terms, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    return [t for t in terms if t.strip()]


def _label_ok(labels: dict[str, str], key: str, op: str, values: frozenset[str]) -> bool:
    if op == "!":
        return key not in labels
    if op == "exists":
        return key in labels
    if op in ("=", "==", "in"):
        return key in labels and labels[key] in values
    return labels.get(key) not in values  # "!=" and "notin": an absent label matches


def parse_label_selector(selector: str) -> Predicate:
    """Compile a label selector; raises :class:`ApiFailure` (400) when it does not parse."""
    reqs: list[tuple[str, str, frozenset[str]]] = []
    for term in _split_terms(selector):
        m = _LABEL_TERM.match(term)
        if m is None or (m["neg"] and (m["op"] or m["set"])):
            raise ApiFailure(400, f"unable to parse requirement: {term!r}")
        if m["neg"]:
            reqs.append((m["key"], "!", frozenset()))
        elif m["op"]:
            reqs.append((m["key"], m["op"], frozenset([m["val"]])))
        elif m["set"]:
            vals = frozenset(v.strip() for v in m["vals"].split(",") if v.strip())
            reqs.append((m["key"], m["set"], vals))
        else:
            reqs.append((m["key"], "exists", frozenset()))

    def match(obj: JSON) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(_label_ok(labels, k, op, vs) for k, op, vs in reqs)

    return match


def field_value(obj: JSON, path: str) -> str:
    """The string form of a field for field selectors ("" when absent)."""
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def parse_field_selector(selector: str, rtype: ResourceType) -> Predicate:
    """Compile a field selector; unsupported fields are a 400 like the real API."""
    allowed = {"metadata.name", "metadata.namespace", *rtype.selectable_fields}
    reqs: list[tuple[str, bool, str]] = []  # (field, must equal?, value)
    for term in _split_terms(selector):
        m = _FIELD_TERM.match(term)
        if m is None:
            raise ApiFailure(400, f"invalid selector: {selector!r}; can't understand {term!r}")
        if m["key"] not in allowed:
            raise ApiFailure(400, f"field label not supported: {m['key']}")
        reqs.append((m["key"], m["op"] != "!=", m["val"]))

    def match(obj: JSON) -> bool:
        return all((field_value(obj, k) == v) == eq for k, eq, v in reqs)

    return match

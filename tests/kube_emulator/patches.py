"""JSON merge patches (RFC 7386) and JSON patches (RFC 6902), failing like the real API."""

from __future__ import annotations

import copy
from typing import Any

from tests.kube_emulator.errors import ApiFailure


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise ApiFailure(422, f"invalid JSON pointer: {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def _walk(doc: Any, tokens: list[str]) -> Any:
    for tok in tokens:
        if isinstance(doc, dict) and tok in doc:
            doc = doc[tok]
        elif isinstance(doc, list) and tok.isdigit() and int(tok) < len(doc):
            doc = doc[int(tok)]
        else:
            raise ApiFailure(422, f"doc is missing path: /{'/'.join(tokens)}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    parent, last = _walk(doc, tokens[:-1]), tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise ApiFailure(422, f"unable to remove nonexistent key: {last}: missing value")


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent, last = _walk(doc, tokens[:-1]), tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list) and last == "-":
        parent.append(value)
    elif isinstance(parent, list) and last.isdigit() and int(last) <= len(parent):
        parent.insert(int(last), value)
    else:
        raise ApiFailure(422, f"add operation does not apply: doc is missing path: /{last}")
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test)."""
    if not isinstance(ops, list):
        raise ApiFailure(400, "json patch must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict):
            raise ApiFailure(400, "json patch operation must be an object")
        kind, tokens = op.get("op"), _pointer(op.get("path"))
        if kind == "add":
            doc = _add(doc, tokens, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, tokens)
        elif kind == "replace":
            if not tokens:
                doc = copy.deepcopy(op.get("value"))
                continue
            _remove(doc, tokens)
            doc = _add(doc, tokens, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            src = _pointer(op.get("from"))
            value = _remove(doc, src) if kind == "move" else copy.deepcopy(_walk(doc, src))
            doc = _add(doc, tokens, value)
        elif kind == "test":
            if _walk(doc, tokens) != op.get("value"):
                raise ApiFailure(422, f"testing value /{'/'.join(tokens)} failed: test failed")
        else:
            raise ApiFailure(422, f"unexpected kind: {kind!r}")
    return doc

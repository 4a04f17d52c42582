"""What goes into the generated files: objects as YAML in Kubernetes' usual style, grouped into
one file per chart folder, and what a variant changes relative to its parents (the objects it
adds, JSON patches for those it changes, delete patches for those it drops)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from devtools.manifests_render import Key, ManifestError, Obj, key, render
from devtools.manifests_variants import Variant, full_sets

# The order of kinds inside a file (the order kubectl applies a file in); others follow by name.
KIND_ORDER = (
    "Namespace",
    "CustomResourceDefinition",
    "PriorityClass",
    "ServiceAccount",
    "Secret",
    "ConfigMap",
    "StorageClass",
    "CSIDriver",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Service",
    "DaemonSet",
    "Deployment",
    "PodDisruptionBudget",
    "MutatingWebhookConfiguration",
    "Issuer",
    "Certificate",
    "PodMonitor",
)


# ------------------------------------------------------------------ YAML output


class _Dumper(yaml.SafeDumper):
    """Kubernetes' usual style: indented lists, multi-line strings as literal blocks."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _represent_str)


def dump(docs: Iterable[Any], header: str) -> str:
    text = yaml.dump_all(
        docs,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        explicit_start=True,
        width=100_000,
        allow_unicode=True,
    )
    comments = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return comments + text


def sort_key(obj: Obj) -> tuple[int, str, str, str]:
    kind = obj["kind"]
    rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
    meta = obj["metadata"]
    return (rank, kind, meta.get("namespace", ""), meta["name"])


def file_for(source: str) -> str:
    """An object's file: one per chart folder (templates/controller/x.yaml -> controller.yaml)."""
    parts = source.split("/")[1:]  # drop the chart name
    if parts[0] == "crds":
        return "crds.yaml"
    if parts[0] == "templates" and len(parts) > 2:
        return f"{parts[1]}.yaml"
    return parts[-1]


def grouped(pairs: Iterable[tuple[str, Obj]], header: str) -> dict[str, str]:
    files: dict[str, list[Obj]] = {}
    for source, obj in pairs:
        files.setdefault(file_for(source), []).append(obj)
    return {name: dump(sorted(objs, key=sort_key), header) for name, objs in sorted(files.items())}


# ------------------------------------------------------------------ patches


def _escape(token: object) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def json_patch(old: Any, new: Any, path: str = "") -> list[Obj]:
    """RFC 6902 operations turning ``old`` into ``new``: maps key by key, lists of equal length
    item by item, anything else (a list that grows or shrinks too) replaced whole."""
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[Obj] = [
            {"op": "remove", "path": f"{path}/{_escape(k)}"} for k in old if k not in new
        ]
        for k, v in new.items():
            sub = f"{path}/{_escape(k)}"
            ops += (
                json_patch(old[k], v, sub) if k in old else [{"op": "add", "path": sub, "value": v}]
            )
        return ops
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [
            op
            for i, (o, n) in enumerate(zip(old, new, strict=True))
            for op in json_patch(o, n, f"{path}/{i}")
        ]
    if type(old) is type(new) and old == new:
        return []
    return [{"op": "replace", "path": path, "value": new}]


def target(k: Key) -> Obj:
    api_version, kind, ns, name = k
    group, _, version = api_version.rpartition("/")
    out: Obj = {"group": group} if group else {}
    out |= {"version": version, "kind": kind, "name": name}
    if ns:
        out["namespace"] = ns
    return out


def delete_patch(k: Key) -> Obj:
    api_version, kind, ns, name = k
    meta = {"name": name, "namespace": ns} if ns else {"name": name}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "$patch": "delete"}


@dataclass
class Delta:
    """What a variant changes relative to one parent."""

    added: dict[Key, tuple[str, Obj]]
    changed: dict[Key, list[Obj]]
    removed: set[Key]


def delta(parent_sets: tuple[str, ...], sets: tuple[str, ...]) -> Delta:
    before = {key(o): o for _, o in render(parent_sets)}
    after = {key(o): (s, o) for s, o in render(sets)}
    changed = {}
    for k, (_, obj) in after.items():
        if k in before and (ops := json_patch(before[k], obj)):
            changed[k] = ops
    return Delta(
        added={k: v for k, v in after.items() if k not in before},
        changed=changed,
        removed={k for k in before if k not in after},
    )


def merged_delta(v: Variant) -> Delta:
    """A variant's changes; a component's must be the same on top of each of its parents."""
    out = Delta({}, {}, set())
    for parent in v.parents:
        parent_sets = full_sets(parent)
        d = delta(parent_sets, (*parent_sets, *v.sets))
        for k, added in d.added.items():
            if out.added.setdefault(k, added)[1] != added[1] or k in out.changed:
                raise ManifestError(f"{v.name}: {k} differs between its parents {v.parents}")
        for k, ops in d.changed.items():
            if out.changed.setdefault(k, ops) != ops or k in out.added:
                raise ManifestError(f"{v.name}: {k} changes differently on top of {v.parents}")
        out.removed |= d.removed
    return out

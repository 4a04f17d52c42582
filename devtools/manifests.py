"""Generated deployment files for users without Helm: deploy/manifests, deploy/scheduler-config.

``deploy/manifests/base`` is the chart with its defaults (Storage Capacity Tracking, lvmd as a
DaemonSet), rendered by ``helm template topolvm charts/topolvm -n topolvm-system --include-crds``
and split into one file per chart folder, plus the Namespace. Every overlay and component holds
only what its chart values change relative to what it is applied to: the objects they add (as
resources), JSON patches for the objects they change and delete patches for the objects they
drop, so ``kubectl kustomize`` of it gives exactly ``helm template`` with those values. Helm's own
labels (``helm.sh/chart``, ``app.kubernetes.io/managed-by``) are left out: Helm does not manage
these objects.

``deploy/scheduler-config`` holds ``topolvm scheduler print-config`` for the extender's modes.

Every file under deploy/manifests except the README.md files is generated, and every
``scheduler-config*.yaml`` in deploy/scheduler-config.

    python -m devtools.manifests          # regenerate (and delete what is no longer generated)
    python -m devtools.manifests --check  # exit 1 naming the files that differ from a fresh render
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devtools.helm import HelmUnavailable, helm

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "topolvm"
MANIFESTS = ROOT / "deploy" / "manifests"
SCHEDULER_CONFIG = ROOT / "deploy" / "scheduler-config"
RELEASE = "topolvm"
NAMESPACE = "topolvm-system"
HAND_WRITTEN = frozenset({"README.md"})

# Labels saying that Helm manages an object; these objects are applied with kubectl.
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")

# Upstream's extender mode (charts/topolvm/README.md, "Scheduling modes"): the pod webhook adds the
# capacity annotations the extender filters on, and Storage Capacity Tracking is off. The webhook's
# certificate is self-managed by topolvm-controller, so nothing else (cert-manager) is needed and
# nothing random is rendered: the controller creates the CA and writes the caBundle at run time.
EXTENDER = (
    "scheduler.enabled=true",
    "webhook.podMutatingWebhook.enabled=true",
    "webhook.certManager=false",
    "controller.storageCapacityTracking.enabled=false",
)


@dataclass(frozen=True)
class Variant:
    """One kustomization under deploy/manifests: its folder, the chart values it adds to those of
    what it is applied to (``parents``), and a line for its kustomization.yaml."""

    name: str
    sets: tuple[str, ...]
    parents: tuple[str, ...]
    about: str

    @property
    def component(self) -> bool:
        return self.name.startswith("components/")


BASE = "base"
DAEMONSET = "overlays/daemonset-scheduler"
DEPLOYMENT = "overlays/deployment-scheduler"
OVERLAYS = (DAEMONSET, DEPLOYMENT)

VARIANTS: tuple[Variant, ...] = (
    Variant(BASE, (), (), "the chart's defaults: Storage Capacity Tracking, lvmd as a DaemonSet"),
    Variant(
        DAEMONSET,
        (*EXTENDER, "scheduler.type=daemonset"),
        (BASE,),
        "scheduler extender as a DaemonSet on the control plane nodes (host network, "
        "127.0.0.1:9251), pod webhook with self-managed certificates, no Storage Capacity Tracking",
    ),
    Variant(
        DEPLOYMENT,
        (*EXTENDER, "scheduler.type=deployment"),
        (BASE,),
        "scheduler extender as a Deployment behind a LoadBalancer Service (port 9251), pod webhook "
        "with self-managed certificates, no Storage Capacity Tracking",
    ),
    Variant(
        "components/marker",
        ("webhook.podMutatingWebhook.marker=true",),
        OVERLAYS,
        "marker-resource mode on top of a scheduler overlay: the webhook adds topolvm.io/capacity, "
        "the extender runs with --managed-resource (kube-scheduler needs managedResources)",
    ),
    Variant(
        "components/systemd-lvmd",
        ("lvmd.managed=false",),
        (BASE, *OVERLAYS),
        "lvmd runs as a systemd service on every node (deploy/systemd): no lvmd DaemonSet",
    ),
)
BY_NAME = {v.name: v for v in VARIANTS}

# kube-scheduler configurations: file -> (print-config arguments, USE_LEGACY, what it is for).
SCHEDULER_CONFIGS: dict[str, tuple[tuple[str, ...], bool, str]] = {
    "scheduler-config.yaml": (
        (),
        False,
        "Default mode: kube-scheduler sends every pod to the extender (the overlays as generated).",
    ),
    "scheduler-config-managed-resource.yaml": (
        ("--managed-resource",),
        False,
        "Marker-resource mode (deploy/manifests/components/marker, or the chart's "
        "webhook.podMutatingWebhook.marker).",
    ),
    "scheduler-config-legacy.yaml": (
        ("--managed-resource",),
        True,
        "Legacy names (USE_LEGACY, the chart's useLegacy) in marker-resource mode, as upstream's "
        "legacy file; legacy without the marker uses scheduler-config.yaml.",
    ),
}

GENERATED = "Generated by `python -m devtools.manifests` from charts/topolvm; do not edit."

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

# Template functions whose output is not a pure function of the values (random data, the clock,
# the live cluster). A use the generator does not know to be harmless fails the render.
NONDETERMINISTIC = re.compile(
    r"\b(rand[A-Za-z]*|shuffle|genCA\w*|genSelfSignedCert\w*|genSignedCert\w*|genPrivateKey"
    r"|derivePassword|htpasswd|bcrypt|uuidv4|now|date\w*|unixEpoch|lookup|getHostByName)\b"
)
KNOWN_HARMLESS = {
    # Self-managed webhook certificates: keeps the caBundle the controller wrote across
    # `helm upgrade`; returns nothing in `helm template`, so the rendered object has no caBundle
    # and topolvm-controller writes it (kubectl apply leaves a field it never set alone).
    ("webhook/mutatingwebhookconfiguration.yaml", "lookup"),
}

Obj = dict[str, Any]
Key = tuple[str, str, str, str]  # apiVersion, kind, namespace, name


class ManifestError(RuntimeError):
    """The chart cannot be rendered into deterministic manifests."""


# ------------------------------------------------------------------ rendering


def check_deterministic(chart: Path = CHART) -> None:
    """Fail on a template function that would make the generated files differ between runs."""
    found = []
    for path in sorted((chart / "templates").rglob("*")):
        if path.suffix not in (".yaml", ".yml", ".tpl"):  # NOTES.txt is not rendered into files
            continue
        rel = path.relative_to(chart / "templates").as_posix()
        for action in re.findall(r"\{\{-?(.*?)-?\}\}", path.read_text(), flags=re.S):
            if action.strip().startswith("/*"):
                continue
            for m in NONDETERMINISTIC.finditer(action):
                if (rel, m.group(1)) not in KNOWN_HARMLESS:
                    found.append(f"{rel}: {m.group(1)}")
    if found:
        raise ManifestError(
            "the chart uses template functions whose output changes between renders; "
            "devtools/manifests.py must pin or strip what they produce: " + ", ".join(found)
        )


def helm_args(sets: Iterable[str]) -> list[str]:
    args = ["template", RELEASE, "charts/topolvm", "-n", NAMESPACE, "--include-crds"]
    return args + [a for s in sets for a in ("--set", s)]


def without_helm_labels(obj: Obj) -> Obj:
    """The object without Helm's labels, in its metadata and in a pod template's."""
    metas = [obj.get("metadata")]
    spec = obj.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("template"), dict):
        metas.append(spec["template"].get("metadata"))
    for meta in metas:
        labels = meta.get("labels") if isinstance(meta, dict) else None
        if isinstance(labels, dict):
            for label in HELM_LABELS:
                labels.pop(label, None)
    return obj


@functools.cache
def _render_text(sets: tuple[str, ...]) -> str:
    res = subprocess.run(
        [str(helm()), *helm_args(sets)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if res.returncode != 0:
        raise ManifestError(f"helm {' '.join(helm_args(sets))} failed:\n{res.stderr.strip()}")
    return res.stdout


def render(sets: Iterable[str] = ()) -> list[tuple[str, Obj]]:
    """``helm template`` with ``sets``: (chart file, object) pairs, Helm's labels removed."""
    check_deterministic()
    out: list[tuple[str, Obj]] = []
    source = ""
    for chunk in re.split(r"^---[ \t]*$", _render_text(tuple(sets)), flags=re.M):
        m = re.search(r"^# Source: (\S+)", chunk, flags=re.M)
        if m:
            source = m.group(1)  # a CRD file's own leading '---' separates it from its body
        body = yaml.safe_load(chunk)
        if body is None:
            continue
        if not source:
            raise ManifestError(f"no '# Source:' line before {str(body)[:80]}")
        out.append((source, without_helm_labels(body)))
    return out


def key(obj: Obj) -> Key:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def objects(sets: Iterable[str] = ()) -> dict[Key, Obj]:
    """What a kustomization with these values must build: the chart's objects and the Namespace."""
    out = {key(o): o for _, o in render(sets)}
    ns = namespace()
    out[key(ns)] = ns
    return out


def namespace() -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def full_sets(name: str) -> tuple[str, ...]:
    """The values of a base or overlay (a component has one set per parent: parent + its own)."""
    v = BY_NAME[name]
    if v.component:
        raise ValueError(f"{name} is a component; its values depend on what it is applied to")
    return (*(full_sets(v.parents[0]) if v.parents else ()), *v.sets)


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


def _file_name(prefix: str, k: Key) -> str:
    return f"{prefix}-{k[1].lower()}-{k[3]}.yaml"


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


# ------------------------------------------------------------------ files


def kustomization_header(v: Variant) -> str:
    lines = [GENERATED, "", *textwrap.wrap(f"{v.name}: {v.about}.", width=96), ""]
    if not v.parents:
        lines.append(f"helm {' '.join(helm_args(v.sets))}")
    else:
        lines.append("The objects these values add, and patches for those they change or remove,")
        lines.append("relative to:")
        for parent in v.parents:
            parent_sets = full_sets(parent)
            lines.append(f"  {parent}: helm {' '.join(helm_args(parent_sets))}")
        lines.append(f"with: {' '.join(f'--set {s}' for s in v.sets)}")
    return "\n".join(lines)


def variant_files(v: Variant) -> dict[str, str]:
    header = f"{GENERATED}\nPart of {v.name} (see kustomization.yaml)."
    kustomization: Obj = {
        "apiVersion": "kustomize.config.k8s.io/" + ("v1alpha1" if v.component else "v1beta1"),
        "kind": "Component" if v.component else "Kustomization",
    }
    if not v.parents:  # the base: everything
        files = grouped(render(v.sets), header)
        files["namespace.yaml"] = dump([namespace()], header)
        first = ["namespace.yaml", "crds.yaml"]
        kustomization["resources"] = first + sorted(f for f in files if f not in first)
        files["kustomization.yaml"] = dump([kustomization], kustomization_header(v))
        return files

    d = merged_delta(v)
    files = grouped(d.added.values(), header)
    resources = (
        [] if v.component else [os.path.relpath(MANIFESTS / v.parents[0], MANIFESTS / v.name)]
    )
    resources += sorted(files)
    patches: list[Obj] = []
    for k in sorted(d.changed, key=lambda k: (k[1], k[3], k[2])):
        name = _file_name("patch", k)
        if name in files:
            raise ManifestError(f"{v.name}: two patches named {name}")
        files[name] = dump([d.changed[k]], f"{header}\nJSON patch (RFC 6902) for {k[1]} {k[3]}.")
        patches.append({"path": name, "target": target(k)})
    for k in sorted(d.removed, key=lambda k: (k[1], k[3], k[2])):
        name = _file_name("delete", k)
        if name in files:
            raise ManifestError(f"{v.name}: two patches named {name}")
        files[name] = dump([delete_patch(k)], header)
        patches.append({"path": name})
    if resources:
        kustomization["resources"] = resources
    if patches:
        kustomization["patches"] = patches
    files["kustomization.yaml"] = dump([kustomization], kustomization_header(v))
    return files


def print_config(args: tuple[str, ...], legacy: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != "USE_LEGACY"}
    if legacy:
        env["USE_LEGACY"] = "true"
    argv = [sys.executable, "-m", "topolvm", "scheduler", "print-config", *args]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    if res.returncode != 0:
        raise ManifestError(f"{' '.join(argv[2:])} failed:\n{res.stderr.strip()}")
    return res.stdout


def scheduler_config_files() -> dict[str, str]:
    out = {}
    for name, (args, legacy, about) in SCHEDULER_CONFIGS.items():
        command = " ".join(["USE_LEGACY=true"] * legacy + ["topolvm scheduler print-config", *args])
        lines = [
            f"`{command}`",
            "Regenerated by `python -m devtools.manifests`; edit a copy, not this file.",
            *textwrap.wrap(about, width=96),
        ]
        header = "".join(f"# {line}\n" for line in lines)
        out[name] = header + print_config(args, legacy)
    return out


def generate() -> dict[Path, str]:
    """Every generated file and its content."""
    files: dict[Path, str] = {}
    for v in VARIANTS:
        for name, text in variant_files(v).items():
            files[MANIFESTS / v.name / name] = text
    for name, text in scheduler_config_files().items():
        files[SCHEDULER_CONFIG / name] = text
    return files


def _owned_files() -> Iterator[Path]:
    """The files on disk that the generator owns (so one it no longer writes is stale)."""
    if MANIFESTS.exists():
        yield from (p for p in MANIFESTS.rglob("*") if p.is_file() and p.name not in HAND_WRITTEN)
    if SCHEDULER_CONFIG.exists():
        yield from SCHEDULER_CONFIG.glob("scheduler-config*.yaml")


def stale(files: dict[Path, str] | None = None) -> list[Path]:
    """The files that differ from a fresh render, are missing, or are no longer generated."""
    files = generate() if files is None else files
    out = {p for p, text in files.items() if not p.is_file() or p.read_text() != text}
    out |= {p for p in _owned_files() if p not in files}
    return sorted(out)


def write(files: dict[Path, str]) -> list[Path]:
    changed = stale(files)
    for path in changed:
        if path in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(files[path])
        else:
            path.unlink()
            for parent in path.parents:
                if parent in (MANIFESTS, SCHEDULER_CONFIG) or any(parent.iterdir()):
                    break
                parent.rmdir()
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 naming the stale files, write nothing"
    )
    args = parser.parse_args()
    try:
        files = generate()
    except (ManifestError, HelmUnavailable) as e:
        print(f"devtools.manifests: {e}", file=sys.stderr)
        return 2
    if args.check:
        paths = stale(files)
        for path in paths:
            print(f"stale: {path.relative_to(ROOT)}", file=sys.stderr)
        if paths:
            print("regenerate with: python -m devtools.manifests", file=sys.stderr)
        return 1 if paths else 0
    for path in write(files):
        print(f"{'wrote' if path in files else 'deleted'} {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

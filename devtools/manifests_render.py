"""The chart rendered by ``helm template`` into objects: checked to be deterministic first,
Helm's own labels removed, each object keyed by apiVersion, kind, namespace and name."""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from devtools.helm import helm
from devtools.manifests_variants import CHART, NAMESPACE, RELEASE, ROOT

# Labels saying that Helm manages an object; these objects are applied with kubectl.
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")

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
            "devtools/manifests_render.py must pin or strip what they produce: " + ", ".join(found)
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

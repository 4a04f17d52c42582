"""What the chart tests share (tests/test_chart.py, tests/test_chart_node.py): helm, a render of
a mode with values, and ways to read what it rendered."""

from __future__ import annotations

import functools
import shlex
import subprocess
from pathlib import Path
from typing import Any

import yaml

from devtools.helm import helm

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "topolvm"
MODES = sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml"))
NS = "topolvm-system"


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm()), *args], capture_output=True, text=True, check=check, timeout=120
    )


def values_args(mode: str | None, sets: tuple[str, ...] = ()) -> list[str]:
    files = ["-f", str(CHART / "ci" / f"{mode}-values.yaml")] if mode else []
    return files + [a for s in sets for a in ("--set", s)]


@functools.cache
def render(mode: str | None = None, sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    out = run_helm("template", "t", str(CHART), "-n", NS, *values_args(mode, sets)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def notes(mode: str | None = None, sets: tuple[str, ...] = ()) -> str:
    res = run_helm("install", "t", str(CHART), "-n", NS, "--dry-run=client",
                   *values_args(mode, sets))  # fmt: skip
    return res.stdout.split("NOTES:", 1)[1]


def kinds(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet"):
            spec = d["spec"]["template"]["spec"]
            out += spec.get("initContainers", []) + spec["containers"]
    return out


def container(docs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [c for c in containers(docs) if c["name"] == name]


def argv_of(c: dict[str, Any]) -> list[str]:
    return [*c.get("command", []), *c.get("args", [])]


def topolvm_argv(c: dict[str, Any]) -> list[str] | None:
    argv = argv_of(c)
    if argv and argv[0].endswith("topolvm"):
        return argv[1:]
    if argv[:2] == ["sh", "-c"] and "topolvm " in argv[2]:
        return shlex.split(argv[2])[1:]
    return None


def pod_spec(docs: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    [obj] = [d for n, d in kinds(docs, kind).items() if n.endswith(suffix)]
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def flag(argv: list[str], name: str) -> str | None:
    """The value of ``--name=value`` in ``argv``; "" for a bare ``--name``; None if absent."""
    for arg in argv:
        key, eq, value = arg.partition("=")
        if key == name:
            return value if eq else ""
    return None


def liveness_port(c: dict[str, Any]) -> tuple[str, int]:
    """(path, container port number) the container's liveness probe calls."""
    get = c["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    port = get["port"]
    return get["path"], ports[port] if isinstance(port, str) else port

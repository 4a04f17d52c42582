"""The OCI image layout: ``umoci`` packs the layer tars with the image's configuration; what
the layout, and the layers, hold."""

from __future__ import annotations

import json
import re
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devtools.image_common import ImageError, run
from devtools.image_recipe import ENTRYPOINT, PATH


def umoci(*args: str) -> str:
    return run(["umoci", *args])


def assemble(
    layout: Path,
    tag: str,
    layers: Sequence[tuple[Path, str]],
    *,
    arch: str,
    epoch: int,
    revision: str,
) -> None:
    """An OCI image layout at ``layout`` with ``layers`` (tar, what made it), the entrypoint
    and PATH; every time stamp is ``epoch``."""
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    ref = f"{layout}:{tag}"
    umoci("init", "--layout", str(layout))
    umoci("new", "--image", ref)
    for tar, created_by in layers:
        umoci(
            "raw", "add-layer", "--image", ref, f"--history.created={created}",
            f"--history.created_by={created_by}", str(tar),
        )  # fmt: skip
    labels = {
        "org.opencontainers.image.title": "topolvm",
        "org.opencontainers.image.description": "TopoLVM (Python): CSI driver for node-local LVM",
        "org.opencontainers.image.version": tag,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.licenses": "Apache-2.0",
    }
    umoci(
        "config", "--image", ref, f"--created={created}", f"--history.created={created}",
        "--history.created_by=devtools/image.py: entrypoint, environment, labels",
        "--author=topolvm", "--os=linux", f"--architecture={arch}",
        f"--config.entrypoint={ENTRYPOINT}", f"--config.env=PATH={PATH}",
        "--config.env=LANG=C.UTF-8", "--config.workingdir=/",
        *(f"--config.label={k}={v}" for k, v in labels.items()),
        *(f"--manifest.annotation={k}={v}" for k, v in labels.items()),
    )  # fmt: skip
    umoci("gc", "--layout", str(layout))


def blob(layout: Path, digest: str) -> Path:
    algo, _, hexd = digest.partition(":")
    return layout / "blobs" / algo / hexd


def manifest_of(layout: Path, tag: str) -> tuple[str, dict[str, Any]]:
    index = json.loads((layout / "index.json").read_text())
    for m in index["manifests"]:
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            manifest: dict[str, Any] = json.loads(blob(layout, m["digest"]).read_text())
            return str(m["digest"]), manifest
    raise ImageError(f"{layout}: no image tagged {tag}")


def config_of(layout: Path, tag: str) -> dict[str, Any]:
    _, manifest = manifest_of(layout, tag)
    config: dict[str, Any] = json.loads(blob(layout, manifest["config"]["digest"]).read_text())
    return config


def python_packages(layer: Path) -> list[str]:
    """name==version of every distribution in the venv (from its dist-info folder names)."""
    found = []
    with tarfile.open(layer) as tar:
        for name in tar.getnames():
            m = re.fullmatch(
                r"\./opt/topolvm/lib/python[\d.]+/site-packages/([^/]+)\.dist-info", name
            )
            if m:
                dist, _, version = m.group(1).partition("-")
                found.append(f"{dist}=={version}")
    return sorted(found, key=str.lower)


def rootfs_bytes(*layers: Path) -> int:
    total = 0
    for layer in layers:
        with tarfile.open(layer) as tar:
            total += sum(m.size for m in tar if m.isreg())
    return total

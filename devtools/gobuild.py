"""Build the real Kubernetes components the tests run, from pinned Go modules.

Every version is pinned in ``devtools/gomod/<group>/go.mod`` (with its ``go.sum``); the table
below names the binaries each group builds. Binaries land in
``~/.cache/topolvm/gotools/<group>-<key>/`` (``$TOPOLVM_GOTOOLS_CACHE`` overrides it) where
``key`` hashes the group's go.mod, go.sum, the build flags and the Go version, so no clone on the
machine rebuilds what one has built, and a changed pin builds into a new folder. Modules come
from the Go module proxy only; GOMODCACHE and GOCACHE are Go's defaults, so they survive too.

    python -m devtools.gobuild            # build whatever is missing, print the paths
    python -m devtools.gobuild --versions # the pinned versions, one per line
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from devtools.buildcache import BuildError, cached_build, run_with_progress, say
from devtools.cachedir import cache_dir as tool_cache

ROOT = Path(__file__).resolve().parent.parent
GOMOD = ROOT / "devtools" / "gomod"
CACHE = tool_cache("gotools", "TOPOLVM_GOTOOLS_CACHE")

_VERSION_PKG = "k8s.io/component-base/version"
_CSI = "github.com/kubernetes-csi"


@dataclass(frozen=True)
class Group:
    """One consumer module and the main packages it builds."""

    name: str
    binaries: dict[str, str]
    # ``{version}``, ``{major}`` and ``{minor}`` are filled from the go.mod pin of the first binary.
    ldflags: tuple[str, ...] = ()
    # Modules whose files (not binaries) tests need, copied next to the binaries.
    files: dict[str, tuple[str, str]] = field(default_factory=dict)
    cold_minutes: int = 2


GROUPS: tuple[Group, ...] = (
    Group(
        "k8s",
        {
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
        },
        ldflags=(
            f"-X {_VERSION_PKG}.gitVersion={{version}}",
            f"-X {_VERSION_PKG}.gitMajor={{major}}",
            f"-X {_VERSION_PKG}.gitMinor={{minor}}",
            f"-X {_VERSION_PKG}.gitTreeState=clean",
        ),
        cold_minutes=10,
    ),
    Group("etcd", {"etcd": "go.etcd.io/etcd/server/v3"}, cold_minutes=2),
    Group(
        "provisioner",
        {"csi-provisioner": f"{_CSI}/external-provisioner/v6/cmd/csi-provisioner"},
        ldflags=("-X main.version={version}",),  # as the sidecars' own Makefiles stamp it
        cold_minutes=4,
    ),
    Group(
        "resizer",
        {"csi-resizer": f"{_CSI}/external-resizer/v2/cmd/csi-resizer"},
        ldflags=("-X main.version={version}",),
        cold_minutes=4,
    ),
    Group(
        "snapshotter",
        {
            "csi-snapshotter": f"{_CSI}/external-snapshotter/v8/cmd/csi-snapshotter",
            "snapshot-controller": f"{_CSI}/external-snapshotter/v8/cmd/snapshot-controller",
        },
        ldflags=("-X main.version={version}",),
        files={"snapshot-crds": (f"{_CSI}/external-snapshotter/client/v8", "config/crd")},
        cold_minutes=4,
    ),
    Group(
        "csisanity",
        {"csi-sanity": f"{_CSI}/csi-test/v5/cmd/csi-sanity"},
        ldflags=("-X main.version={version}",),
    ),
)


def go_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GO")}
    for keep in ("GOPATH", "GOMODCACHE", "GOCACHE", "GOPROXY", "GOSUMDB"):
        if keep in os.environ:
            env[keep] = os.environ[keep]
    env.update(GOTOOLCHAIN="local", GOWORK="off", CGO_ENABLED="0", GOFLAGS="-mod=readonly")
    return env


def _go() -> str:
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None
    )
    if go is None:
        raise BuildError(
            "the Go toolchain (go) is not installed; Go 1.26 is needed to build the test bed"
        )
    return go


def _go_version() -> str:
    out = subprocess.run(
        [_go(), "version"], capture_output=True, text=True, check=True, env=go_env()
    )
    return out.stdout.strip()


def ldflags(group: Group) -> list[str]:
    version = versions()[next(iter(group.binaries.values()))]
    major, minor = version.lstrip("v").split(".")[:2]
    return [
        "-s",
        "-w",
        *(f.format(version=version, major=major, minor=minor) for f in group.ldflags),
    ]


def cache_dir(group: Group) -> Path:
    h = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        h.update((GOMOD / group.name / name).read_bytes())
    h.update(json.dumps([group.binaries, ldflags(group), group.files], sort_keys=True).encode())
    h.update(_go_version().encode())
    return CACHE / f"{group.name}-{h.hexdigest()[:12]}"


def build(group: Group) -> Path:
    """Return the folder with ``group``'s binaries, building them first if the cache lacks them."""
    return cached_build(cache_dir(group), lambda tmp: _build_into(group, tmp), kind=group.name)


def _build_into(group: Group, tmp: Path) -> None:
    mod = GOMOD / group.name
    argv = [_go(), "build", "-v", "-trimpath", "-ldflags", " ".join(ldflags(group))]
    argv += ["-o", str(tmp) + "/", *group.binaries.values()]
    label = f"gobuild: {group.name} ({', '.join(group.binaries)})"
    say(f"{label}: cold build, expect about {group.cold_minutes} min on 2 cores")
    # `go build -v` names each package as it compiles it.
    run_with_progress(
        argv, cwd=mod, env=go_env(), label=label, counted=bool, unit="packages compiled"
    )
    for name, pkg in group.binaries.items():
        # go names a binary after the import path's last element, skipping a /vN suffix.
        elems = pkg.split("/")
        built = tmp / (elems[-2] if re.fullmatch(r"v\d+", elems[-1]) else elems[-1])
        if built.name != name:
            built.rename(tmp / name)
    for name, (module, sub) in group.files.items():
        listed = subprocess.run(
            [_go(), "list", "-m", "-f", "{{.Dir}}", module],
            cwd=mod,
            env=go_env(),
            capture_output=True,
            text=True,
            check=True,
        )
        shutil.copytree(Path(listed.stdout.strip()) / sub, tmp / name)
        for p in (tmp / name).rglob("*"):
            p.chmod(0o755 if p.is_dir() else 0o644)


def ensure(*names: str) -> dict[str, Path]:
    """Paths of the named binaries (or file folders), building each missing group once."""
    wanted = set(names)
    found: dict[str, Path] = {}
    for group in GROUPS:
        provides = set(group.binaries) | set(group.files)
        if names and not wanted & provides:
            continue
        folder = build(group)
        found.update({n: folder / n for n in provides})
    unknown = wanted - set(found)
    if unknown:
        raise BuildError(f"no group builds {sorted(unknown)}")
    return found


def versions() -> dict[str, str]:
    """The pinned version of each built tool's module, read from the committed go.mod files."""
    pins: dict[str, str] = {}
    for group in GROUPS:
        text = (GOMOD / group.name / "go.mod").read_text()
        for pkg in group.binaries.values():
            for line in text.splitlines():
                parts = line.replace("require", "").split()
                if (
                    len(parts) >= 2
                    and parts[1].startswith("v")
                    and (pkg + "/").startswith(parts[0] + "/")
                ):
                    pins[pkg] = parts[1]
                    break
    return pins


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="binaries to build (default: all)")
    parser.add_argument("--versions", action="store_true", help="print the pinned versions")
    args = parser.parse_args()
    if args.versions:
        for pkg, ver in versions().items():
            print(f"{pkg} {ver}")
        return 0
    try:
        for name, path in sorted(ensure(*args.names).items()):
            print(f"{name}\t{path}")
    except BuildError as exc:
        print(f"gobuild: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

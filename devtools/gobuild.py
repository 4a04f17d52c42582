"""Build the real Kubernetes components the tests run, from pinned Go modules.

Every version is pinned in ``devtools/gomod/<group>/go.mod`` (with its ``go.sum``); the table
below names the binaries each group builds and its build settings (cgo, build tags). Binaries
land in ``~/.cache/topolvm/gotools/<group>-<key>/`` (``$TOPOLVM_GOTOOLS_CACHE`` overrides it)
where ``key`` hashes the group's go.mod, go.sum, the build flags and tags, the Go version and, for
a cgo group, the C toolchain and the Debian packages it links, so no clone on the machine
rebuilds what one has built, and a changed input builds into a new folder. Modules come from the
Go module proxy only; GOMODCACHE and GOCACHE are Go's defaults, so they survive too.

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
_CONTAINERD = "github.com/containerd/containerd/v2"
_CNI = "github.com/containernetworking/plugins"


@dataclass(frozen=True)
class Group:
    """One consumer module and the main packages it builds."""

    name: str
    binaries: dict[str, str]
    # Filled from the go.mod pin of the first binary's module: ``{version}`` (``{bare}`` without
    # its "v"), ``{major}``, ``{minor}``, and ``{sum}``, the module's go.sum hash: it stands in
    # for the git commit upstream's Makefiles stamp, which a module download does not carry.
    ldflags: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    # cgo off builds static binaries that need nothing of the host. With cgo on, the C compiler,
    # the C library and the Debian packages named in ``debs`` (pkg-config libraries that a
    # static link copies into the binary) join the cache key; ``make apt`` installs them.
    cgo: bool = False
    debs: tuple[str, ...] = ()
    # Modules whose files (not binaries) tests need, copied next to the binaries.
    files: dict[str, tuple[str, str]] = field(default_factory=dict)
    cold_minutes: int = 2
    # Built only when named (`python -m devtools.gobuild crictl`): no test needs it, and a cold
    # build would cost every clean CI run its minutes.
    on_demand: bool = False


GROUPS: tuple[Group, ...] = (
    Group(
        "k8s",
        {
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
            "kubelet": "k8s.io/kubernetes/cmd/kubelet",
            "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
        },
        ldflags=(
            f"-X {_VERSION_PKG}.gitVersion={{version}}",
            f"-X {_VERSION_PKG}.gitMajor={{major}}",
            f"-X {_VERSION_PKG}.gitMinor={{minor}}",
            f"-X {_VERSION_PKG}.gitTreeState=clean",
        ),
        cold_minutes=12,
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
    # What a real node runs: the container runtime, the OCI runtime and the CNI plugins.
    Group(
        "containerd",
        {
            "containerd": f"{_CONTAINERD}/cmd/containerd",
            "containerd-shim-runc-v2": f"{_CONTAINERD}/cmd/containerd-shim-runc-v2",
            "ctr": f"{_CONTAINERD}/cmd/ctr",
        },
        ldflags=(  # as containerd's Makefile stamps them
            f"-X {_CONTAINERD}/version.Version={{version}}",
            f"-X {_CONTAINERD}/version.Revision={{sum}}",
            f"-X {_CONTAINERD}/version.Package={_CONTAINERD}",
        ),
        # btrfs and devmapper snapshotters need cgo; the rest are the Makefile's (STATIC=1) tags.
        tags=("no_btrfs", "no_devmapper", "urfave_cli_no_docs", "osusergo", "netgo"),
        cold_minutes=4,
    ),
    Group(
        "runc",
        {"runc": "github.com/opencontainers/runc"},
        # runc embeds its VERSION file as main.version; the Makefile stamps main.gitCommit.
        # Linked statically as `make static` does (libseccomp.a and glibc copied in).
        ldflags=("-X main.gitCommit={sum}", "-extldflags -static"),
        # The Makefile's tags but libpathrs (a Rust library Debian lacks), plus `make static`'s.
        tags=("seccomp", "urfave_cli_no_docs", "netgo", "osusergo"),
        cgo=True,
        debs=("libseccomp-dev",),
        cold_minutes=1,
    ),
    Group(
        "cni",
        {
            "bridge": f"{_CNI}/plugins/main/bridge",
            "host-local": f"{_CNI}/plugins/ipam/host-local",
            "loopback": f"{_CNI}/plugins/main/loopback",
        },
        # as the plugins' release workflow stamps it (build_linux.sh with CGO_ENABLED=0)
        ldflags=(f"-X {_CNI}/pkg/utils/buildversion.BuildVersion={{version}}",),
        cold_minutes=1,
    ),
    Group(  # for debugging a node by hand
        "crictl",
        {"crictl": "sigs.k8s.io/cri-tools/cmd/crictl"},
        ldflags=("-X sigs.k8s.io/cri-tools/pkg/version.Version={bare}",),  # as its Makefile does
        cold_minutes=4,
        on_demand=True,
    ),
)


def go_env(cgo: bool = False) -> dict[str, str]:
    """The caller's environment without what would change a build behind the cache key's back:
    Go's settings (but where its caches live and which proxy it asks) and cgo's C settings
    (CC, CGO_CFLAGS, pkg-config paths): a cgo build uses the default gcc and pkg-config."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GO", "CGO_", "PKG_CONFIG")) and k not in ("CC", "CXX")
    }
    for keep in ("GOPATH", "GOMODCACHE", "GOCACHE", "GOPROXY", "GOSUMDB"):
        if keep in os.environ:
            env[keep] = os.environ[keep]
    env.update(GOTOOLCHAIN="local", GOWORK="off", GOFLAGS="-mod=readonly")
    env["CGO_ENABLED"] = "1" if cgo else "0"
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


def _first_line(argv: list[str], env: dict[str, str] | None = None) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env)
    return (out.stdout or out.stderr).strip().splitlines()[0]


def _go_version() -> str:
    return _first_line([_go(), "version"], go_env())


def c_toolchain(group: Group) -> list[str]:
    """What a cgo build depends on besides Go: the C compiler, the C library and the versions of
    the Debian packages the group links; empty for a group without cgo."""
    if not group.cgo:
        return []
    env = go_env(cgo=True)
    cc = _first_line([_go(), "env", "CC"], env)
    try:
        found = [_first_line([cc, "--version"], env), _first_line(["ldd", "--version"])]
        for deb in ("pkg-config", *group.debs):
            query = ["dpkg-query", "-W", "-f", "${Status} ${Version}", deb]
            status = subprocess.run(query, capture_output=True, text=True, check=False, env=env)
            if not status.stdout.startswith("install ok installed "):
                raise BuildError(f"{group.name} needs Debian's {deb}: run `make apt` as root")
            found.append(f"{deb} {status.stdout.split()[-1]}")
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError(f"{group.name} needs a C toolchain ({cc}, glibc, dpkg): {exc}") from exc
    return found


def ldflags(group: Group) -> list[str]:
    module, version = pin(group)
    major, minor = version.lstrip("v").split(".")[:2]
    fields = dict(version=version, bare=version.lstrip("v"), major=major, minor=minor)
    if any("{sum}" in f for f in group.ldflags):
        sums = (GOMOD / group.name / "go.sum").read_text().splitlines()
        fields["sum"] = next(s.split()[2] for s in sums if s.split()[:2] == [module, version])
    return ["-s", "-w", *(f.format(**fields) for f in group.ldflags)]


def cache_dir(group: Group) -> Path:
    h = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        h.update((GOMOD / group.name / name).read_bytes())
    inputs: list[object] = [group.binaries, ldflags(group), group.files]
    if group.tags or group.cgo:  # so that adding them left the other groups' keys as they were
        inputs += [group.tags, group.cgo, c_toolchain(group)]
    h.update(json.dumps(inputs, sort_keys=True).encode())
    h.update(_go_version().encode())
    return CACHE / f"{group.name}-{h.hexdigest()[:12]}"


def build(group: Group) -> Path:
    """Return the folder with ``group``'s binaries, building them first if the cache lacks them."""
    # keep=2: a work tree and a clean clone at other pins share this cache; a build for one must
    # not remove the binaries the other's running session starts.
    return cached_build(
        cache_dir(group), lambda tmp: _build_into(group, tmp), kind=group.name, keep=2
    )


def _build_into(group: Group, tmp: Path) -> None:
    mod = GOMOD / group.name
    argv = [_go(), "build", "-v", "-trimpath", "-ldflags", " ".join(ldflags(group))]
    if group.tags:
        argv += ["-tags", ",".join(group.tags)]
    argv += ["-o", str(tmp) + "/", *group.binaries.values()]
    label = f"gobuild: {group.name} ({', '.join(group.binaries)})"
    say(f"{label}: cold build, expect about {group.cold_minutes} min on 2 cores")
    # `go build -v` names each package as it compiles it.
    run_with_progress(
        argv, cwd=mod, env=go_env(group.cgo), label=label, counted=bool, unit="packages compiled"
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
    """Paths of the named binaries (or file folders), building each missing group once; with no
    name, every group but the on-demand ones."""
    wanted = set(names)
    found: dict[str, Path] = {}
    for group in GROUPS:
        provides = set(group.binaries) | set(group.files)
        if (names and not wanted & provides) or (not names and group.on_demand):
            continue
        folder = build(group)
        found.update({n: folder / n for n in provides})
    unknown = wanted - set(found)
    if unknown:
        raise BuildError(f"no group builds {sorted(unknown)}")
    return found


def requires(group: Group) -> dict[str, str]:
    """Module -> version of the ``require`` lines of ``group``'s go.mod."""
    found: dict[str, str] = {}
    block = False
    for raw in (GOMOD / group.name / "go.mod").read_text().splitlines():
        line = raw.split("//")[0].strip()
        if line in ("require (", ")"):
            block = line != ")"
        elif (m := re.fullmatch(r"(?:require\s+)?(\S+)\s+(v\S+)", line)) and (
            block or line.startswith("require")
        ):
            found[m[1]] = m[2]
    return found


def pin(group: Group, pkg: str | None = None) -> tuple[str, str]:
    """(module, version) that provides ``pkg`` (the first binary by default): the longest
    required module path that is a prefix of the package's."""
    pkg = pkg or next(iter(group.binaries.values()))
    mods = [m for m in requires(group).items() if (pkg + "/").startswith(m[0] + "/")]
    if not mods:
        raise BuildError(f"devtools/gomod/{group.name}/go.mod requires no module of {pkg}")
    return max(mods, key=lambda m: len(m[0]))


def versions() -> dict[str, str]:
    """The pinned version of each built tool's module, read from the committed go.mod files."""
    return {pkg: pin(g, pkg)[1] for g in GROUPS for pkg in g.binaries.values()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="binaries to build (default: all but crictl)")
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

"""``make image``: the topolvm OCI image, built without a Docker daemon.

Two layers, each a tar made reproducibly from the repo's inputs, packed by ``umoci`` into an
OCI image layout at ``build/image/oci`` (tag: the project's version):

1. **Debian base** -- ``mmdebstrap`` (variant ``essential``, no apt) installs
   :data:`DEBIAN_PACKAGES` from Debian bookworm (+ updates, security). Cached in
   ``~/.cache/topolvm/image/base-<key>/``, keyed by everything that goes into it.
2. **topolvm** -- a venv at ``/opt/topolvm`` made by the image's own ``python3`` (in a chroot):
   this repo's wheel (built offline with the pinned :data:`BUILD_CONSTRAINTS`) and
   :data:`PYTHON_REQUIREMENTS` (pinned; wheels from PyPI, installed offline with ``--no-deps``,
   then ``pip check``), ``/usr/local/bin/topolvm`` and upstream's component names ``/lvmd``,
   ``/topolvm-node``, ... (``topolvm`` dispatches on ``argv[0]``). Wheels are cached too: only
   a cold cache needs the network.

Usage::

    python -m devtools.image              # build (or reuse); print layout, digest, sizes
    python -m devtools.image --check      # ... then unpack it and run its binaries
    python -m devtools.image --refresh    # rebuild the Debian layer (new security updates)
    python devtools/image.py --requirements   # the pins, for the Dockerfile's pip install
    python devtools/image.py --build-constraints  # ... and for the wheel's build
    python -m devtools.image --freeze     # the pins as this venv has them (to update the list)

Needs root (chroot, device nodes), ``mmdebstrap`` and ``umoci`` (installed with apt-get when
missing), Debian's mirror and PyPI. Standard library only: the Dockerfile runs this file with
the plain Debian ``python3``. See docs/image.md.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "image"
CACHE = Path(
    os.environ.get("TOPOLVM_IMAGE_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "topolvm" / "image"
)

# --- what goes into the image (the Dockerfile mirrors these; tests/test_image.py checks) -------

SUITE = "bookworm"
APT_SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# The Debian packages on top of the essential set (Recommends are not installed).
DEBIAN_PACKAGES = (
    "python3",  # 3.11: runs topolvm
    "lvm2",  # lvm, dmsetup
    "xfsprogs",  # mkfs.xfs, xfs_growfs
    "e2fsprogs",  # mkfs.ext4, resize2fs, dumpe2fs
    "btrfs-progs",  # mkfs.btrfs, btrfs filesystem resize
    "util-linux",  # blkid, wipefs, findmnt, nsenter
    "mount",  # mount, umount
    "file",  # as upstream's image has it (topolvm itself uses blkid)
)
# Like debian:*-slim: no manuals, docs (but the copyright files) or translations.
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
)
PYTHON_VERSION = "3.11"  # bookworm's python3; the wheels below are picked for it
GLIBC = (2, 36)  # bookworm's; the newest manylinux wheels that run on it
PIP = "pip==26.3"  # runs from its wheel inside the chroot; not left in the image
# The runtime dependency closure of pyproject.toml's [project].dependencies, pinned
# (``python -m devtools.image --freeze`` prints it from the current venv).
PYTHON_REQUIREMENTS = """\
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-types==0.8.0
anyio==4.16.0
attrs==26.1.0
cffi==2.1.1
cryptography==50.0.2
frozenlist==1.8.0
grpcio==1.85.1
grpcio-health-checking==1.85.1
h11==0.16.0
httpcore2==2.16.2
httpx2==2.16.2
idna==3.20
jsonpatch==1.47
jsonpointer==3.12
lightkube==1.0.1
lightkube-models==1.37.0.8
msgspec==0.22.0
multidict==7.2.1
prometheus-client==0.26.0
propcache==0.5.4
protobuf==7.36.2
pycparser==3.12
pydantic==2.14.3
pydantic-core==2.50.4
pyyaml==6.0.3
truststore==0.10.5
typing-extensions==4.16.0
typing-inspection==0.4.5
yarl==1.25.1
"""
# What builds this project's wheel (pyproject's [build-system] closure), pinned too: protoc from
# grpcio-tools writes the generated modules. Resolved with ``pip install --dry-run --report``.
BUILD_CONSTRAINTS = """\
grpcio==1.85.1
grpcio-tools==1.85.1
hatchling==1.33.0
mypy-protobuf==5.1.0
packaging==26.3
pathspec==1.1.1
pluggy==1.7.0
protobuf==7.36.2
setuptools==84.2.1
tomlkit==0.15.2
trove-classifiers==2026.9.21.13
types-protobuf==7.35.1.20260906
typing-extensions==4.16.0
"""
VENV = "/opt/topolvm"
COMMAND_LINKS = ("lvmd", "topolvm-node", "topolvm-controller", "topolvm-scheduler")
# The venv first: ``python3`` is the one with topolvm (like an activated venv).
PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENTRYPOINT = "topolvm"
# The files of the repo that make the wheel (tracked or not, unless git-ignored).
SOURCES = ("pyproject.toml", "hatch_build.py", "README.md", "LICENSE", "src")
HOST_TOOLS = {"mmdebstrap": "mmdebstrap", "umoci": "umoci"}  # command: Debian package
ARCHES = {"amd64": "x86_64", "arm64": "aarch64"}  # Debian: wheel platform


class ImageError(RuntimeError):
    """A build step failed."""


@dataclass
class ImageInfo:
    """What a build made; written to ``build/image/image.json``."""

    layout: str  # the OCI image layout folder
    tag: str
    digest: str  # of the image manifest
    compressed_bytes: int  # the gzipped layers: what a registry stores and a node pulls
    layer_bytes: list[int]  # each layer's gzipped size, base first
    uncompressed_bytes: int  # the layer tars
    rootfs_bytes: int  # the files' sizes in the unpacked root filesystem
    source_date_epoch: int
    base_key: str
    key: str  # of every input; a build with the same key is reused
    debian_packages: list[str]  # name=version of every package in the image
    python_packages: list[str]
    revision: str

    def ref(self) -> str:
        return f"{self.layout}:{self.tag}"


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    started = time.monotonic()
    say(f"{what} ...")
    yield
    say(f"{what}: {time.monotonic() - started:.1f}s")


def run(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> str:
    """Run a command; its output. A failure raises :class:`ImageError` with the output."""
    proc = subprocess.run(
        list(argv),
        env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise ImageError(
            f"{shlex.join(argv[:8])} ... exited {proc.returncode}\n{proc.stdout[-4000:]}"
        )
    return proc.stdout


def sha256(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def project_version() -> str:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return str(data["project"]["version"])


def requirements() -> list[str]:
    return [line for line in PYTHON_REQUIREMENTS.splitlines() if line.strip()]


# --- host set-up -----------------------------------------------------------------------------


def ensure_host_tools() -> None:
    """mmdebstrap and umoci from Debian's packages, installed when missing."""
    missing = sorted({pkg for cmd, pkg in HOST_TOOLS.items() if shutil.which(cmd) is None})
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ImageError(f"missing {', '.join(missing)}: apt-get install {' '.join(missing)}")
    say(f"installing {' '.join(missing)} (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env)


def debian_arch() -> str:
    arch = run(["dpkg", "--print-architecture"]).strip()
    if arch not in ARCHES:
        raise ImageError(f"unsupported architecture {arch} (known: {', '.join(ARCHES)})")
    return arch


def git(*args: str) -> str:
    try:
        return run(["git", "-C", str(REPO), *args]).strip()
    except (ImageError, FileNotFoundError):
        return ""


RECIPE = "devtools/image.py"  # this file: the Debian layer's recipe and the build's


@dataclass
class Revision:
    """Where the image's inputs come from in git."""

    name: str  # the last commit that changed an input (+ "-dirty" if one has changes)
    epoch: int  # SOURCE_DATE_EPOCH: that commit's time
    base_epoch: int  # the Debian layer's: the last commit that changed the recipe


def revision() -> Revision:
    """Commits that touch neither the recipe nor the wheel's sources do not change the image.
    ``$SOURCE_DATE_EPOCH`` overrides both times."""
    inputs = [*SOURCES, RECIPE]
    last = git("log", "-1", "--format=%h %ct", "--abbrev=12", "--", *inputs).split()
    if len(last) != 2:
        last = git("log", "-1", "--format=%h %ct", "--abbrev=12").split()
    recipe = git("log", "-1", "--format=%ct", "--", RECIPE)
    dirty = bool(git("status", "--porcelain", "--untracked-files=all", "--", *inputs))
    fixed = os.environ.get("SOURCE_DATE_EPOCH", "")
    if fixed.isdigit():
        epoch = base_epoch = int(fixed)
    elif len(last) == 2:
        epoch = int(last[1])
        base_epoch = int(recipe) if recipe.isdigit() else epoch
    else:
        raise ImageError("not a git checkout: set SOURCE_DATE_EPOCH")
    name = (last[0] if len(last) == 2 else "unknown") + ("-dirty" if dirty else "")
    return Revision(name, epoch, base_epoch)


@contextlib.contextmanager
def staging(final: Path) -> Iterator[Path]:
    """A fresh folder next to ``final`` that becomes ``final`` when the block succeeds."""
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        yield work
        if final.exists():
            shutil.rmtree(final)
        work.rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def prune(prefix: str, keep: Path, count: int = 2) -> None:
    """Drop all but the ``count`` newest cache folders named ``prefix*`` (``keep`` stays)."""
    folders = sorted(CACHE.glob(f"{prefix}*"), key=lambda f: f.stat().st_mtime, reverse=True)
    for old in [f for f in folders if f != keep][count - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One build at a time (per cache folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- layer 1: Debian ---------------------------------------------------------------------


@dataclass
class Base:
    key: str
    layer: Path  # uncompressed tar
    packages: list[str]  # name=version


def base_key(arch: str, epoch: int) -> str:
    mmdebstrap = run(["mmdebstrap", "--version"]).strip()
    return sha256(
        json.dumps(
            {
                "suite": SUITE,
                "sources": APT_SOURCES,
                "packages": DEBIAN_PACKAGES,
                "dpkg": DPKG_OPTIONS,
                "arch": arch,
                "epoch": epoch,
                "mmdebstrap": mmdebstrap,
                "recipe": 2,  # bump when build_base changes what it makes
            },
            sort_keys=True,
        )
    )[:16]


def build_base(arch: str, epoch: int, refresh: bool) -> Base:
    """The Debian layer from the cache, or from mmdebstrap (about 30 s and 30 MB of .debs)."""
    key = base_key(arch, epoch)
    folder = CACHE / f"base-{key}"
    if folder.is_dir() and not refresh:
        return Base(key, folder / "layer.tar", (folder / "packages.txt").read_text().split())
    with (
        step(f"Debian layer: mmdebstrap {SUITE} + {' '.join(DEBIAN_PACKAGES)}"),
        staging(folder) as work,
    ):
        layer, manifest = work / "layer.tar", work / "packages.txt"
        hooks = Path("/usr/share/mmdebstrap/hooks/merged-usr")
        argv = [
            "mmdebstrap", "--mode=root", "--variant=essential", "--format=tar",
            f"--architectures={arch}", f"--include={','.join(DEBIAN_PACKAGES)}",
            # merged /usr with usr-is-merged, not usrmerge (which would bring perl)
            f"--hook-dir={hooks}",
            *(f"--dpkgopt={o}" for o in DPKG_OPTIONS),
            # the build host's files: the container runtime provides its own
            '--customize-hook=rm -f "$1/etc/resolv.conf" "$1/etc/hostname"',
            "--customize-hook=chroot \"$1\" dpkg-query -W -f='${Package}=${Version}\\n' "
            f"| LC_ALL=C sort > {shlex.quote(str(manifest))}",
            SUITE, str(layer), *APT_SOURCES,
        ]  # fmt: skip
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch), LC_ALL="C.UTF-8")
        run(argv, env=env)
        # Device nodes stay out of the layer (runtimes mount /dev; rootless unpackers cannot
        # make them); the folder itself stays.
        run(["tar", "--delete", "--wildcards", "-f", str(layer), "./dev/?*"])
    prune("base-", folder)
    return Base(key, folder / "layer.tar", (folder / "packages.txt").read_text().split())


# --- layer 2: topolvm ----------------------------------------------------------------------


def source_files() -> list[Path]:
    """The files that make the wheel: tracked or untracked but not ignored."""
    out = git("ls-files", "-z", "-co", "--exclude-standard", "--", *SOURCES)
    if out:
        names = sorted({n for n in out.split("\0") if n})
    else:  # not a git checkout (a source archive): everything but caches and generated code
        names = sorted(
            str(p.relative_to(REPO))
            for s in SOURCES
            for p in ([REPO / s] if (REPO / s).is_file() else (REPO / s).rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and "_pb2" not in p.name
        )
    return [REPO / n for n in names if (REPO / n).is_file()]


def sources_hash(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(REPO)).encode() + b"\0")
        h.update(file_sha256(f).encode() + b"\0")
    return h.hexdigest()


def pypi_env() -> dict[str, str]:
    """pip's environment: wheels from the index only (not a local ``PIP_FIND_LINKS``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_NO_INDEX")}
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def wheel_tags(arch: str) -> list[str]:
    machine = ARCHES[arch]
    tags = [f"manylinux_{GLIBC[0]}_{m}_{machine}" for m in range(GLIBC[1], 16, -1)]
    return [*tags, f"manylinux2014_{machine}"]


def wheelhouse(arch: str) -> Path:
    """The pinned wheels (and pip's), for bookworm's CPython on ``arch``; cached."""
    tags = wheel_tags(arch)
    key = sha256(PYTHON_REQUIREMENTS, PIP, PYTHON_VERSION, *tags)[:16]
    folder = CACHE / f"wheels-{key}"
    if folder.is_dir():
        return folder
    with step(f"wheels: {len(requirements())} pinned packages from PyPI"), staging(folder) as work:
        tmp = str(work)
        (work / "requirements.txt").write_text(PYTHON_REQUIREMENTS)
        run([
            sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
            "--no-deps", "--only-binary=:all:", "--implementation=cp",
            f"--python-version={PYTHON_VERSION}", f"--abi=cp{PYTHON_VERSION.replace('.', '')}",
            *(f"--platform={t}" for t in tags), "-d", tmp,
            "-r", str(work / "requirements.txt"), PIP,
        ], env=pypi_env())  # fmt: skip
    prune("wheels-", folder)
    return folder


def build_tools() -> Path:
    """The pinned wheels that build this project's wheel, for the interpreter running this;
    cached, so that a warm build needs no network."""
    key = sha256(BUILD_CONSTRAINTS, sys.implementation.cache_tag, sys.platform, os.uname().machine)
    folder = CACHE / f"build-tools-{key[:16]}"
    if folder.is_dir():
        return folder
    with step("wheel build tools from PyPI"), staging(folder) as work:
        (work / "constraints.txt").write_text(BUILD_CONSTRAINTS)
        run([
            sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
            "--no-deps", "--only-binary=:all:", "-d", str(work),
            "-r", str(work / "constraints.txt"),
        ], env=pypi_env())  # fmt: skip
    prune("build-tools-", folder)
    return folder


def build_wheel(files: Sequence[Path], out: Path, epoch: int) -> Path:
    """This repo's wheel, built from a copy of its sources (the build hook writes generated
    modules next to the .proto files; the work tree is left alone), offline."""
    tools = build_tools()
    with tempfile.TemporaryDirectory(prefix="topolvm-src-") as tmp:
        src = Path(tmp) / "src"
        for f in files:
            dest = src / f.relative_to(REPO)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)
        env = dict(pypi_env(), SOURCE_DATE_EPOCH=str(epoch))
        run([
            sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
            f"--find-links={tools}", f"--build-constraint={tools / 'constraints.txt'}",
            "-w", str(out), str(src),
        ], env=env)  # fmt: skip
    wheels = sorted(out.glob("topolvm-*.whl"))
    if len(wheels) != 1:
        raise ImageError(f"expected one topolvm wheel in {out}, found {wheels}")
    return wheels[0]


CHROOT = """\
set -e
root="$1"; shift
mount --rbind /dev "$root/dev"
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
exec chroot "$root" "$@"
"""


def chroot_command(root: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` run in ``root`` with /dev, /proc and /sys, in a mount and PID namespace of its
    own (the mounts go when it ends)."""
    return [
        "unshare", "--mount", "--pid", "--fork", "--propagation=private",
        "sh", "-c", CHROOT, "sh", str(root), *argv,
    ]  # fmt: skip


def chroot_env(**extra: str) -> dict[str, str]:
    return {"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8", **extra}


def build_app_layer(base: Base, wheels: Path, wheel: Path, work: Path, epoch: int) -> Path:
    """The venv, made in a chroot of the Debian layer by its own python3; tar of what it adds."""
    root = work / "rootfs"
    root.mkdir()
    run(["tar", "-x", "-f", str(base.layer), "-C", str(root), "--numeric-owner"])
    stage = root / "tmp" / "topolvm-install"
    shutil.copytree(wheels, stage)
    shutil.copy2(wheel, stage)
    (stage / "requirements.txt").write_text(PYTHON_REQUIREMENTS)
    pip_wheel = next(stage.glob("pip-*.whl"))
    inside = "/tmp/topolvm-install/{}"
    pip = [f"{VENV}/bin/python", inside.format(f"{pip_wheel.name}/pip")]
    pip_opts = ["--disable-pip-version-check", "--no-cache-dir", "--no-input"]
    env = chroot_env(SOURCE_DATE_EPOCH=str(epoch), PYTHONDONTWRITEBYTECODE="1")
    steps = [
        ["python3", "-m", "venv", "--without-pip", VENV],
        [*pip, "install", *pip_opts, "-q", "--no-index", "--no-deps", "--no-compile",
         "--find-links", inside.format(""), "-r", inside.format("requirements.txt"),
         inside.format(wheel.name)],
        [*pip, "check", *pip_opts],
        # unchecked-hash: the image never changes, and a .pyc must not depend on file times
        [f"{VENV}/bin/python", "-m", "compileall", "-q", "-j", "1",
         "--invalidation-mode=unchecked-hash", f"{VENV}/lib"],
    ]  # fmt: skip
    for argv in steps:
        run(chroot_command(root, argv), env=env)
    shutil.rmtree(stage)
    (root / "usr/local/bin/topolvm").symlink_to(f"{VENV}/bin/{ENTRYPOINT}")
    for name in COMMAND_LINKS:
        (root / name).symlink_to("/usr/local/bin/topolvm")
    links = [f"./{n}" for n in COMMAND_LINKS]
    members = sorted(["./opt/topolvm", "./usr/local/bin/topolvm", *links])
    layer = work / "app.tar"
    reproducible_tar(root, members, layer, epoch)
    return layer


def reproducible_tar(root: Path, members: Sequence[str], out: Path, epoch: int) -> None:
    """GNU tar the reproducible-builds way: sorted, numeric owners, times clamped to
    ``epoch``, no atime/ctime."""
    run([
        "tar", "--create", "--file", str(out), "-C", str(root), "--sort=name",
        "--format=posix", "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
        f"--mtime=@{epoch}", "--clamp-mtime", "--numeric-owner", "--owner=0", "--group=0",
        "--", *members,
    ])  # fmt: skip


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


# --- the OCI image -------------------------------------------------------------------------


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


# --- build ---------------------------------------------------------------------------------


def build(out: Path = OUT, *, refresh: bool = False) -> ImageInfo:
    """Build the image (or reuse the last build when no input changed); its description."""
    started = time.monotonic()
    ensure_host_tools()
    if os.geteuid() != 0:
        raise ImageError("building the image needs root (chroot, mmdebstrap --mode=root)")
    arch = debian_arch()
    rev = revision()
    epoch = rev.epoch
    tag = project_version()
    with locked(CACHE / "lock"):
        base = build_base(arch, rev.base_epoch, refresh)
        files = source_files()
        key = sha256(
            base.key, PYTHON_REQUIREMENTS, PIP, str(epoch), tag, rev.name,
            sources_hash(files), Path(__file__).read_bytes(), umoci("--version"),
        )[:16]  # fmt: skip
        record = out / "image.json"
        last = _recorded(record)
        if last is not None and last.key == key and _intact(last):
            say(f"image: up to date ({time.monotonic() - started:.1f}s)")
            return last
        wheels = wheelhouse(arch)
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="work-", dir=out) as tmp:
            work = Path(tmp)
            (work / "dist").mkdir()
            with step("topolvm wheel"):
                wheel = build_wheel(files, work / "dist", epoch)
            with step("topolvm layer: venv in a chroot"):
                app = build_app_layer(base, wheels, wheel, work, epoch)
            layout = work / "oci"
            layers = [
                (base.layer, f"mmdebstrap {SUITE}: {' '.join(DEBIAN_PACKAGES)}"),
                (app, f"venv {VENV}: {wheel.name} and {len(requirements())} pinned packages"),
            ]
            with step("OCI layout: umoci"):
                assemble(layout, tag, layers, arch=arch, epoch=epoch, revision=rev.name)
            digest, manifest = manifest_of(layout, tag)
            layer_sizes = [int(x["size"]) for x in manifest["layers"]]
            info = ImageInfo(
                layout=str(out / "oci"),
                tag=tag,
                digest=digest,
                compressed_bytes=sum(layer_sizes),
                layer_bytes=layer_sizes,
                uncompressed_bytes=base.layer.stat().st_size + app.stat().st_size,
                rootfs_bytes=rootfs_bytes(base.layer, app),
                source_date_epoch=epoch,
                base_key=base.key,
                key=key,
                debian_packages=base.packages,
                python_packages=python_packages(app),
                revision=rev.name,
            )
            final = out / "oci"
            if final.exists():
                shutil.rmtree(final)
            layout.rename(final)
            record.write_text(json.dumps(asdict(info), indent=2) + "\n")
    say(f"image: built in {time.monotonic() - started:.0f}s")
    return info


def _recorded(record: Path) -> ImageInfo | None:
    try:
        return ImageInfo(**json.loads(record.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _intact(info: ImageInfo) -> bool:
    try:
        digest, _ = manifest_of(Path(info.layout), info.tag)
    except (OSError, ValueError, ImageError):
        return False
    return digest == info.digest


def unpack(info: ImageInfo, dest: Path) -> Path:
    """The image's root filesystem at ``dest`` (``umoci raw unpack``); returns ``dest``."""
    umoci("raw", "unpack", "--image", info.ref(), str(dest))
    return dest


def run_in_root(root: Path, argv: Sequence[str], timeout: float = 120) -> tuple[int, str]:
    """Run ``argv`` in the unpacked image (chroot, with /dev, /proc, /sys): status, output."""
    proc = subprocess.run(
        chroot_command(root, argv),
        env=chroot_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


# What `--check` (and tests/test_image.py) run from the image's root.
CHECKS: tuple[tuple[str, ...], ...] = (
    ("topolvm", "--version"),
    ("topolvm", "--help"),
    ("/lvmd", "--help"),
    ("/topolvm-node", "--help"),
    ("python3", "-c", "import importlib.metadata as m, topolvm; print(m.version('topolvm'))"),
    ("lvm", "version"),
    ("mkfs.xfs", "-V"),
    ("xfs_growfs", "-V"),
    ("mkfs.ext4", "-V"),
    (
        "sh",
        "-c",
        "for c in resize2fs dumpe2fs xfs_growfs dmsetup umount losetup; do "
        'command -v "$c" || { echo "$c: not found"; exit 1; }; done',
    ),
    ("mkfs.btrfs", "--version"),
    ("btrfs", "--version"),
    ("blkid", "-V"),
    ("wipefs", "-V"),
    ("findmnt", "-V"),
    ("nsenter", "-V"),
    ("mount", "-V"),
    ("file", "--version"),
)


def check(info: ImageInfo) -> list[str]:
    """Unpack the image and run :data:`CHECKS` from it; the failures."""
    failures = []
    with tempfile.TemporaryDirectory(prefix="check-", dir=Path(info.layout).parent) as tmp:
        root = unpack(info, Path(tmp) / "rootfs")
        for argv in CHECKS:
            rc, out = run_in_root(root, argv)
            first = (out.strip().splitlines() or [""])[0]
            ok = rc == 0
            say(f"  {'ok  ' if ok else 'FAIL'} {' '.join(argv)[:40]:40} {first[:60]}")
            if not ok:
                failures.append(f"{' '.join(argv)}: exit {rc}: {out[-2000:]}")
    return failures


def freeze() -> list[str]:
    """The runtime closure of pyproject's dependencies, pinned as this interpreter has them."""
    import importlib.metadata as md

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    def name_of(requirement: str) -> str | None:
        spec, _, marker = requirement.partition(";")
        if "extra" in marker:
            return None
        if marker.strip() and not _marker_holds(marker):
            return None
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        return m.group(1) if m else None

    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    todo = [n for r in data["project"]["dependencies"] if (n := name_of(r))]
    pinned: dict[str, str] = {}
    while todo:
        name = todo.pop()
        if norm(name) in pinned:
            continue
        dist = md.distribution(name)
        pinned[norm(name)] = dist.version
        todo += [n for r in dist.requires or [] if (n := name_of(r))]
    return [f"{n}=={v}" for n, v in sorted(pinned.items())]


def _marker_holds(marker: str) -> bool:
    """Environment markers without extras, for Linux CPython 3.11 (``packaging`` when present)."""
    try:
        from packaging.markers import Marker
    except ImportError:  # pragma: no cover - only outside the dev venv
        return True
    env = {"python_version": PYTHON_VERSION, "sys_platform": "linux", "os_name": "posix",
           "platform_system": "Linux", "implementation_name": "cpython",
           "platform_python_implementation": "CPython"}  # fmt: skip
    return bool(Marker(marker).evaluate(env))


def describe(info: ImageInfo) -> str:
    mib = 1 << 20
    layers = " + ".join(f"{b / mib:.1f}" for b in info.layer_bytes)
    return "\n".join([
        f"layout      {info.layout}",
        f"image       {info.ref()}",
        f"digest      {info.digest}",
        f"compressed  {info.compressed_bytes / mib:.1f} MiB ({layers} MiB: Debian + topolvm)",
        f"unpacked    {info.rootfs_bytes / mib:.1f} MiB of files "
        f"({info.uncompressed_bytes / mib:.1f} MiB of layer tars)",
        f"packages    {len(info.debian_packages)} Debian, {len(info.python_packages)} Python",
        f"revision    {info.revision} (SOURCE_DATE_EPOCH={info.source_date_epoch})",
    ])  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.image", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (build/image)")
    parser.add_argument("--check", action="store_true", help="run the image's binaries")
    parser.add_argument("--refresh", action="store_true", help="rebuild the Debian layer")
    parser.add_argument("--json", action="store_true", help="print the description as JSON")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--requirements", action="store_true", help="print the Python pins")
    what.add_argument(
        "--build-constraints", action="store_true", help="print the wheel build's pins"
    )
    what.add_argument("--packages", action="store_true", help="print the Debian packages")
    what.add_argument("--freeze", action="store_true", help="print the pins from this venv")
    args = parser.parse_args(argv)
    if args.requirements or args.build_constraints:
        print(PYTHON_REQUIREMENTS if args.requirements else BUILD_CONSTRAINTS, end="")
        return 0
    if args.packages:
        print("\n".join(DEBIAN_PACKAGES))
        return 0
    if args.freeze:
        print("\n".join(freeze()))
        return 0
    try:
        info = build(args.out, refresh=args.refresh)
        print(json.dumps(asdict(info), indent=2) if args.json else describe(info), flush=True)
        if args.check:
            failures = check(info)
            if failures:
                say("\n".join(failures))
                return 1
    except ImageError as exc:
        say(f"image build failed: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

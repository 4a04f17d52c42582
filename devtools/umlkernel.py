"""The test bed's own User-Mode Linux kernel, built from Debian's pinned kernel source package.

Why not Debian's ``user-mode-linux`` package: its kernel (6.1) saves a guest's FPU state with a
fixed XSAVE size (2696 bytes), which the host refuses on a CPU with AMX (11008 bytes), so every
guest's init dies at boot there. Linux 6.13 fixed it; Debian's 6.12 source still has the bug.
This module takes ``linux-source-6.12`` (``apt-get download``, no install), applies
``devtools/kernel/*.patch`` (the host's XSAVE size read at boot) and builds ``ARCH=um`` with
``make defconfig`` plus ``devtools/kernel/uml.config`` (everything built in, no modules).

The kernel lands in ``~/.cache/topolvm/umlkernel/linux-<key>/linux`` (``$TOPOLVM_UMLKERNEL_CACHE``
overrides the folder), where ``key`` hashes the source version, the patches, the config, the
recipe, the compiler and libc, so every clone on the machine shares one build; a changed input
builds anew and builds older than the two before it are pruned. A cold build takes about 4
minutes on 2 cores.

    python -m devtools.uml kernel      # build if needed, print the kernel's path
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from devtools.buildcache import BuildError, cached_build, locked, run_with_progress, say
from devtools.cachedir import cache_dir

SOURCE_PACKAGE = "linux-source-6.12"
SOURCE_VERSION = "6.12.117-1~deb12u1"  # the pin; Debian's 6.12 series if the archive dropped it
LOCALVERSION = "-topolvm"  # uml.config's CONFIG_LOCALVERSION: `uname -r` ends with it
FILES = Path(__file__).resolve().parent / "kernel"
CONFIG = FILES / "uml.config"
CACHE = cache_dir("umlkernel", "TOPOLVM_UMLKERNEL_CACHE")
SOURCES = CACHE / "source"
TOOLS = ("make", "gcc", "flex", "bison", "bc", "patch", "xz", "perl")
# Raise when the build's steps change (they are not in a file the key hashes).
RECIPE = 1
BUILD_ENV = {"KBUILD_BUILD_USER": "topolvm", "KBUILD_BUILD_HOST": "testbed"}


class KernelBuildError(BuildError):
    """The kernel could not be fetched, configured or built; the message says which step."""


def patches() -> list[Path]:
    return sorted(FILES.glob("*.patch"))


def _compiler() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise KernelBuildError(_missing_tools())
    out = subprocess.run([gcc, "--version"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise KernelBuildError(f"`gcc --version` failed: {_last_line(out.stderr)}")
    return out.stdout.splitlines()[0]


def _missing_tools() -> str:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    return (
        f"building the UML kernel needs {' '.join(missing)} "
        "(apt-get install build-essential flex bison bc patch xz-utils; `make deps` does it)"
    )


def build_dir(version: str) -> Path:
    """Where the kernel built from ``version`` of the source package lives: the key hashes every
    input of the build (the recipe below, the config, the patches, the compiler and libc)."""
    recipe = [RECIPE, SOURCE_PACKAGE, version, _compiler(), platform.libc_ver(), BUILD_ENV]
    h = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
    for f in (CONFIG, *patches()):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return CACHE / f"linux-{h.hexdigest()[:12]}"


def kernel() -> Path:
    """The path of the test bed's UML kernel, building it first if the cache lacks it. A warm
    call reads only local files (no apt), also when the pinned version had to be replaced."""
    try:
        for version in (SOURCE_VERSION, *_cached_versions()):
            cached = build_dir(version) / "linux"
            if cached.exists():
                return cached
        with locked(SOURCES / ".lock"):  # two cold runs download one .deb
            deb = _source_deb()
        version = _deb_version(deb)
        build = functools.partial(_build_into, deb, version)
        # keep=2: a work tree and a clean clone at another kernel config share this cache; a
        # build for one must not remove the kernel the other is booting.
        return cached_build(build_dir(version), build, kind="linux", keep=2) / "linux"
    except KernelBuildError:
        raise
    except (BuildError, OSError, subprocess.SubprocessError) as exc:
        raise KernelBuildError(f"umlkernel: {exc}") from exc


def built_release(kernel: Path) -> str:
    """``uname -r`` of a guest booted from ``kernel``, as its build recorded it."""
    return (kernel.parent / "version").read_text().splitlines()[1]


# --- the source package -------------------------------------------------------------------


def _debs() -> list[Path]:
    """The source package's .debs in the cache, oldest first."""
    return sorted(SOURCES.glob(f"{SOURCE_PACKAGE}_*.deb"), key=lambda p: p.stat().st_mtime)


def _cached_versions() -> list[str]:
    return [_deb_version(deb) for deb in _debs()]


def _source_deb() -> Path:
    """The source package's .deb in the cache: the pinned version; if the archive no longer has
    it, (with a warning) the one downloaded before or else the 6.12 version apt offers."""
    SOURCES.mkdir(parents=True, exist_ok=True)
    cached = _debs()
    for deb in cached:
        if _deb_version(deb) == SOURCE_VERSION:
            return deb
    res = _apt_download(f"{SOURCE_PACKAGE}={SOURCE_VERSION}")
    if res.returncode != 0 and os.geteuid() == 0:  # apt's package lists may be missing or old
        say("umlkernel: apt-get update")
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, check=False, timeout=900)
        res = _apt_download(f"{SOURCE_PACKAGE}={SOURCE_VERSION}")
    if res.returncode == 0:
        deb = _only_deb(SOURCE_VERSION)
    else:
        say(
            f"umlkernel: {SOURCE_PACKAGE} {SOURCE_VERSION} cannot be downloaded "
            f"({_last_line(res.stderr)}); building another version of the 6.12 series"
        )
        if cached:
            return cached[-1]
        res = _apt_download(SOURCE_PACKAGE)
        if res.returncode != 0:
            raise KernelBuildError(
                f"apt-get download {SOURCE_PACKAGE} failed: {_last_line(res.stderr)} "
                "(run `apt-get update` as root, or `make deps`)"
            )
        deb = _only_deb(None)
    for old in SOURCES.glob("*.deb"):
        if old != deb:
            old.unlink()
    return deb


def _only_deb(version: str | None) -> Path:
    """The .deb apt-get download just wrote (of ``version``, when given)."""
    found = [d for d in _debs() if version is None or _deb_version(d) == version]
    if not found:
        raise KernelBuildError(f"apt-get download left no {SOURCE_PACKAGE} .deb in {SOURCES}")
    return found[-1]


def _apt_download(spec: str) -> subprocess.CompletedProcess[str]:
    say(f"umlkernel: apt-get download {spec} (about 150 MB)")
    return subprocess.run(
        # As root apt drops to the _apt user, which may not write to the cache: no sandbox.
        ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", spec],
        cwd=SOURCES, capture_output=True, text=True, check=False, timeout=1800,
    )  # fmt: skip


def _deb_version(deb: Path) -> str:
    res = subprocess.run(
        ["dpkg-deb", "--field", str(deb), "Version"], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise KernelBuildError(f"{deb}: not a readable .deb: {_last_line(res.stderr)}")
    return res.stdout.strip()


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


# --- the build ----------------------------------------------------------------------------


def _build_into(deb: Path, version: str, out: Path) -> None:
    if any(shutil.which(t) is None for t in TOOLS):
        raise KernelBuildError(_missing_tools())
    label = f"umlkernel: Linux {version.split('-', 1)[0]}{LOCALVERSION}"
    say(f"{label}: building the UML kernel (Debian {SOURCE_PACKAGE} {version}), about 4 min")
    # The tree (about 1.5 GB once built) is unpacked into the partial build folder, which a
    # killed build leaves for the next one to remove; only the kernel binary is kept.
    src = out / "src"
    src.mkdir()
    try:
        tree = _unpack(deb, src)
        for patch in patches():
            _step(tree, ["patch", "-p1", "--forward", "--batch", "-i", str(patch)], patch.name)
        _configure(tree)
        env = dict(os.environ, **BUILD_ENV, KBUILD_BUILD_TIMESTAMP=f"Debian {version}")
        run_with_progress(
            ["make", "ARCH=um", f"-j{os.cpu_count() or 2}", "linux"],
            cwd=tree, env=env, label=label, unit="files compiled",
            counted=lambda line: line.startswith("  CC "),
        )  # fmt: skip
        shutil.copy2(tree / "linux", out / "linux")
        built = _step(tree, ["make", "-s", "ARCH=um", "kernelrelease"], "make kernelrelease")
    finally:
        shutil.rmtree(src, ignore_errors=True)
    (out / "version").write_text(f"{SOURCE_PACKAGE} {version}\n{built.strip()}\n")


def _unpack(deb: Path, into: Path) -> Path:
    """The source tree from the .deb's ``/usr/src/linux-source-6.12.tar.xz``."""
    inner = f"./usr/src/{SOURCE_PACKAGE}.tar.xz"
    script = 'dpkg-deb --fsys-tarfile "$1" | tar -xO "$2" | tar -xJ'
    _step(into, ["sh", "-ec", script, "sh", str(deb), inner], f"unpack {deb.name}")
    tree = into / SOURCE_PACKAGE
    if not (tree / "Makefile").exists():
        raise KernelBuildError(f"{deb.name}: {inner} did not hold {SOURCE_PACKAGE}/")
    return tree


def _configure(tree: Path) -> None:
    """``defconfig``, then uml.config; every setting of uml.config must survive olddefconfig
    (Kconfig drops a line whose dependencies are off, silently)."""
    _step(tree, ["make", "ARCH=um", "defconfig"], "make defconfig")
    wanted = CONFIG.read_text()
    with (tree / ".config").open("a") as f:
        f.write(wanted)
    _step(tree, ["make", "ARCH=um", "olddefconfig"], "make olddefconfig")
    final = set((tree / ".config").read_text().splitlines())
    settings = re.findall(r"^(CONFIG_\w+=.*|# CONFIG_\w+ is not set)$", wanted, re.M)
    lost = [line for line in settings if line not in final]
    if lost:
        raise KernelBuildError(f"{CONFIG.name}: Kconfig did not keep {lost}")


def _step(cwd: Path, argv: list[str], what: str) -> str:
    """Run one step of the build; its output, or :class:`KernelBuildError` with its tail."""
    res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise KernelBuildError(
            f"umlkernel: {what} failed ({res.returncode}):\n{(res.stdout + res.stderr)[-3000:]}"
        )
    return res.stdout

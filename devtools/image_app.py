"""The image's second layer: the venv ``/opt/topolvm`` with this repo's wheel and the pinned
:data:`PYTHON_REQUIREMENTS`, made in a chroot of the Debian layer by its own ``python3``; the
pinned wheels (and those that build this repo's wheel) are cached, so that a warm build needs no
network."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from devtools.buildcache import cached_build
from devtools.image_base import Base
from devtools.image_common import (
    CACHE,
    ImageError,
    chroot_command,
    chroot_env,
    file_sha256,
    git,
    run,
    sha256,
    step,
)
from devtools.image_recipe import (
    ARCHES,
    BUILD_CONSTRAINTS,
    COMMAND_LINKS,
    ENTRYPOINT,
    GLIBC,
    PIP,
    PYTHON_REQUIREMENTS,
    PYTHON_VERSION,
    REPO,
    SOURCES,
    VENV,
    requirements,
)


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
    """The pinned wheels (and pip's), for bookworm's CPython on ``arch``; cached (with one
    earlier set)."""
    tags = wheel_tags(arch)
    key = sha256(PYTHON_REQUIREMENTS, PIP, PYTHON_VERSION, *tags)[:12]

    def download(work: Path) -> None:
        (work / "requirements.txt").write_text(PYTHON_REQUIREMENTS)
        with step(f"wheels: {len(requirements())} pinned packages from PyPI"):
            run([
                sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                "--no-deps", "--only-binary=:all:", "--implementation=cp",
                f"--python-version={PYTHON_VERSION}", f"--abi=cp{PYTHON_VERSION.replace('.', '')}",
                *(f"--platform={t}" for t in tags), "-d", str(work),
                "-r", str(work / "requirements.txt"), PIP,
            ], env=pypi_env())  # fmt: skip

    return cached_build(CACHE / f"wheels-{key}", download, kind="wheels", keep=1)


def build_tools() -> Path:
    """The pinned wheels that build this project's wheel, for the interpreter running this;
    cached (with one earlier set), so that a warm build needs no network."""
    key = sha256(BUILD_CONSTRAINTS, sys.implementation.cache_tag, sys.platform, os.uname().machine)

    def download(work: Path) -> None:
        (work / "constraints.txt").write_text(BUILD_CONSTRAINTS)
        with step("wheel build tools from PyPI"):
            run([
                sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                "--no-deps", "--only-binary=:all:", "-d", str(work),
                "-r", str(work / "constraints.txt"),
            ], env=pypi_env())  # fmt: skip

    return cached_build(CACHE / f"build-tools-{key[:12]}", download, kind="build-tools", keep=1)


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

"""What the image's build steps share (devtools/image_recipe.py has the recipe, image.py the
command line): the cache folder, running commands, hashes, git (the revision and
``SOURCE_DATE_EPOCH``), the host's tools and architecture, and a chroot of an unpacked root with
/dev, /proc and /sys."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from devtools.buildcache import say
from devtools.cachedir import cache_dir
from devtools.image_recipe import ARCHES, HOST_TOOLS, PATH, REPO, SOURCES

CACHE = cache_dir("image", "TOPOLVM_IMAGE_CACHE")

# The recipe: devtools/image_recipe.py, image.py and the build's modules devtools/image_*.py
# (their bytes are in the image's key; their last commit dates the Debian layer).
RECIPE = tuple(sorted(p.relative_to(REPO).as_posix() for p in REPO.glob("devtools/image*.py")))


class ImageError(RuntimeError):
    """A build step failed."""


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


@dataclass
class Revision:
    """Where the image's inputs come from in git."""

    name: str  # the last commit that changed an input (+ "-dirty" if one has changes)
    epoch: int  # SOURCE_DATE_EPOCH: that commit's time
    base_epoch: int  # the Debian layer's: the last commit that changed the recipe


def revision() -> Revision:
    """Commits that touch neither the recipe nor the wheel's sources do not change the image.
    ``$SOURCE_DATE_EPOCH`` overrides both times."""
    inputs = [*SOURCES, *RECIPE]
    last = git("log", "-1", "--format=%h %ct", "--abbrev=12", "--", *inputs).split()
    if len(last) != 2:
        last = git("log", "-1", "--format=%h %ct", "--abbrev=12").split()
    recipe = git("log", "-1", "--format=%ct", "--", *RECIPE)
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


# --- a chroot of an unpacked root ------------------------------------------------------------

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

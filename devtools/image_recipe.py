"""What goes into the topolvm OCI image: the recipe that ``make image`` (devtools/image.py and its
parts: image_common, image_base, image_app, image_oci, image_build) and the Dockerfile both
follow (tests/test_image.py checks that they agree; docs/image.md).

Standard library only: the Dockerfile copies this file alone and runs it with the plain Debian
``python3`` for the pins::

    python3 devtools/image_recipe.py --requirements        # the Python pins
    python3 devtools/image_recipe.py --build-constraints   # ... and for the wheel's build
    python3 devtools/image_recipe.py --packages            # the Debian packages
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "image"

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
    "thin-provisioning-tools",  # thin_dump: a thin volume's mapped blocks, for a copy
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
anyio==4.16.0
attrs==26.1.0
cffi==2.1.1
cryptography==50.0.2
frozenlist==1.8.0
grpcio==1.85.1
grpcio-health-checking==1.85.1
grpclib==0.4.9
h11==0.16.0
h2==4.4.1
hpack==4.2.0
httpcore2==2.16.2
httpx2==2.16.2
hyperframe==6.1.0
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
pyyaml==6.0.3
tqdm==4.70.1
truststore==0.10.5
typing-extensions==4.16.0
xxhash==4.1.0
yarl==1.25.1
zstandard==0.25.0
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


def requirements() -> list[str]:
    return [line for line in PYTHON_REQUIREMENTS.splitlines() if line.strip()]


def project_version() -> str:
    """The image's tag."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return str(data["project"]["version"])


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


def print_lists(argv: Sequence[str]) -> int | None:
    """``--requirements``, ``--build-constraints`` or ``--packages``: print it, return 0;
    None for any other command line."""
    if list(argv) == ["--requirements"]:
        print(PYTHON_REQUIREMENTS, end="")
    elif list(argv) == ["--build-constraints"]:
        print(BUILD_CONSTRAINTS, end="")
    elif list(argv) == ["--packages"]:
        print("\n".join(DEBIAN_PACKAGES))
    else:
        return None
    return 0


if __name__ == "__main__":
    code = print_lists(sys.argv[1:])
    if code is None:
        print(
            "usage: image_recipe.py --requirements | --build-constraints | --packages",
            file=sys.stderr,
        )
        code = 2
    sys.exit(code)

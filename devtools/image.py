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
missing), Debian's mirror and PyPI. This file is the recipe (what goes into the image) and the
command line. Standard library only: the Dockerfile runs this file alone, with the plain Debian
``python3``, for the pins. The build is in devtools/image_common.py (what the steps share),
image_base.py (the Debian layer), image_app.py (the wheels and the topolvm layer),
image_oci.py (umoci, and reading the layout) and image_build.py (the build, its record and
``--check``). See docs/image.md.
"""

from __future__ import annotations

import argparse
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
    if not __package__:  # run as a file (python devtools/image.py): the build needs the package
        sys.path.insert(0, str(REPO))
    from devtools.buildcache import say
    from devtools.image_build import build, check, describe
    from devtools.image_common import ImageError

    try:
        info = build(args.out, refresh=args.refresh)
        print(info.as_json() if args.json else describe(info), flush=True)
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

"""The image's first layer: Debian bookworm's essential set and :data:`DEBIAN_PACKAGES`, made by
``mmdebstrap`` (no apt) and cached in ``~/.cache/topolvm/image/base-<key>/`` with the exact
version of every package."""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from devtools.buildcache import cached_build
from devtools.image_common import CACHE, run, sha256, step
from devtools.image_recipe import APT_SOURCES, DEBIAN_PACKAGES, DPKG_OPTIONS, SUITE


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
    )[:12]


def build_base(arch: str, epoch: int, refresh: bool) -> Base:
    """The Debian layer from the cache, or from mmdebstrap (about 30 s and 30 MB of .debs).
    ``refresh`` builds it again (new security updates); the cache keeps one earlier build."""
    key = base_key(arch, epoch)

    def mmdebstrap(work: Path) -> None:
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
        with step(f"Debian layer: mmdebstrap {SUITE} + {' '.join(DEBIAN_PACKAGES)}"):
            run(argv, env=env)
            # Device nodes stay out of the layer (runtimes mount /dev; rootless unpackers
            # cannot make them); the folder itself stays.
            run(["tar", "--delete", "--wildcards", "-f", str(layer), "./dev/?*"])

    folder = cached_build(CACHE / f"base-{key}", mmdebstrap, kind="base", keep=1, rebuild=refresh)
    return Base(key, folder / "layer.tar", (folder / "packages.txt").read_text().split())

"""The image's build: both layers, then the OCI layout at ``build/image/oci`` and its record
``build/image/image.json`` (reused while no input changes); and ``--check``, which unpacks the
image and runs its binaries from its root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from devtools.buildcache import locked, say
from devtools.image_app import build_app_layer, build_wheel, source_files, sources_hash, wheelhouse
from devtools.image_base import build_base
from devtools.image_common import (
    CACHE,
    RECIPE,
    ImageError,
    chroot_command,
    chroot_env,
    debian_arch,
    ensure_host_tools,
    revision,
    sha256,
    step,
)
from devtools.image_oci import assemble, manifest_of, python_packages, rootfs_bytes, umoci
from devtools.image_recipe import (
    DEBIAN_PACKAGES,
    OUT,
    PIP,
    PYTHON_REQUIREMENTS,
    REPO,
    SUITE,
    VENV,
    project_version,
    requirements,
)


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

    def as_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


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
            sources_hash(files), *((REPO / f).read_bytes() for f in RECIPE),
            umoci("--version"),
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
            record.write_text(info.as_json() + "\n")
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

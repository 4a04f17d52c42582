"""Images for the test bed's nodes, without a registry: OCI archives that each node's containerd
imports (``ctr -n k8s.io images import``), so the kubelet finds every image it is asked for
(``imagePullPolicy: IfNotPresent``) and never pulls.

- ``pause``: the sandbox image, ``pause.c`` of the pinned Kubernetes module built with
  ``gcc -static``, tagged as containerd's default sandbox image;
- ``busybox``: Debian's ``busybox-static`` (``apt-get download``), the workloads' image (the
  demo's Vault pods, the tests' writers and readers);
- ``csi-provisioner``, ``csi-resizer``, ``csi-snapshotter``: the static binaries
  devtools/gobuild.py builds, each alone in an image at ``/<name>`` (the chart's command);
- ``topolvm``: the project's image (``make image``, devtools/image.py), under the chart's default
  repository and the project's version, so the chart needs no image values but a pull policy.

Small images are one uncompressed layer written here (no tool needed); the archives are cached in
``~/.cache/topolvm/nodeimages/`` by a hash of their inputs.

    python -m devtools.nodeimages      # build what is missing; print name, archive, size
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from devtools import gobuild
from devtools.buildcache import BuildError, cached_build, locked, say
from devtools.cachedir import cache_dir

CACHE = cache_dir("nodeimages", "TOPOLVM_NODEIMAGES_CACHE")
PAUSE = "registry.k8s.io/pause:3.10.2"  # containerd 2.4's default sandbox image
LOCAL = "topolvm.test"  # the registry name of images built here (never pulled)
SIDECARS = ("csi-provisioner", "csi-resizer", "csi-snapshotter")
EPOCH = 1_700_000_000  # every file's time in the small images: the same inputs, the same bytes
RECIPE = 1  # raise when what this module writes changes


class ImageBuildError(BuildError):
    """An image could not be built; the message says which and why."""


@dataclass(frozen=True)
class NodeImage:
    name: str  # the image reference the kubelet asks for
    archive: Path  # an OCI archive for `ctr images import`


@dataclass(frozen=True)
class File:
    """A file of a one-layer image: ``path`` in the image, from ``source`` (or a symlink to
    ``link``), with ``mode``."""

    path: str
    source: Path | None = None
    mode: int = 0o755
    link: str = ""


# --- writing an OCI archive -----------------------------------------------------------------


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layer(files: Iterable[File]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for f in sorted(files, key=lambda f: f.path):
            parts = f.path.strip("/").split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    tar.addfile(_info(d, tarfile.DIRTYPE, 0o755))
            if f.link:
                info = _info(f.path.strip("/"), tarfile.SYMTYPE, 0o777)
                info.linkname = f.link
                tar.addfile(info)
            elif f.source is None:
                tar.addfile(_info(f.path.strip("/"), tarfile.DIRTYPE, f.mode))
            else:
                data = f.source.read_bytes()
                info = _info(f.path.strip("/"), tarfile.REGTYPE, f.mode)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _info(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, mode, EPOCH
    return info


def write_archive(
    out: Path, name: str, files: Iterable[File], entrypoint: list[str], env: list[str]
) -> None:
    """A one-layer OCI image ``name`` as an OCI archive at ``out``."""
    layer = _layer(files)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "2023-11-14T22:13:20Z",
            "config": {"Entrypoint": entrypoint, "Env": env, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
            "history": [
                {"created": "2023-11-14T22:13:20Z", "created_by": "devtools/nodeimages.py"}
            ],
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": _descriptor("application/vnd.oci.image.config.v1+json", config),
            "layers": [_descriptor("application/vnd.oci.image.layer.v1.tar", layer)],
        },
        sort_keys=True,
    ).encode()
    _pack(out, name, manifest, {_digest(b): b for b in (layer, config, manifest)})


def _descriptor(media_type: str, data: bytes) -> dict[str, object]:
    return {"mediaType": media_type, "digest": _digest(data), "size": len(data)}


def _pack(out: Path, name: str, manifest: bytes, blobs: dict[str, bytes | Path]) -> None:
    """The archive: ``oci-layout``, an ``index.json`` naming ``manifest`` ``name`` (the
    annotation containerd's import takes the name from), and the blobs."""
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                **_descriptor("application/vnd.oci.image.manifest.v1+json", manifest),
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                },
            }
        ],
    }
    tmp = out.with_suffix(".partial")
    with tarfile.open(tmp, "w") as tar:
        for member, data in (
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            ("index.json", json.dumps(index).encode()),
        ):
            info = _info(member, tarfile.REGTYPE, 0o644)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for digest, blob in sorted(blobs.items()):
            path = "blobs/" + digest.replace(":", "/")
            if isinstance(blob, Path):
                tar.add(blob, path)
            else:
                info = _info(path, tarfile.REGTYPE, 0o644)
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    tmp.rename(out)


# --- the images -----------------------------------------------------------------------------


def _key(*inputs: object) -> str:
    h = hashlib.sha256(json.dumps([RECIPE, *map(str, inputs)]).encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:12]


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def pause() -> NodeImage:
    source = _kubernetes_dir() / "build" / "pause" / "linux" / "pause.c"

    def build(tmp: Path) -> None:
        binary = tmp / "pause"
        _run(["gcc", "-Os", "-static", "-o", str(binary), str(source)], "gcc pause.c")
        write_archive(tmp / "image.tar", PAUSE, [File("/pause", binary)], ["/pause"], [])

    out = cached_build(CACHE / f"pause-{_key(source.read_bytes())}", build, kind="pause")
    return NodeImage(PAUSE, out / "image.tar")


def _kubernetes_dir() -> Path:
    """The pinned k8s.io/kubernetes module's source folder (in Go's module cache)."""
    res = subprocess.run(
        [gobuild._go(), "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"],
        cwd=gobuild.GOMOD / "k8s", env=gobuild.go_env(), capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    if res.returncode != 0 or not res.stdout.strip():
        raise ImageBuildError(f"pause: the k8s.io/kubernetes module is not at hand: {res.stderr}")
    return Path(res.stdout.strip())


def busybox() -> NodeImage:
    """Debian's busybox-static with a link per applet; ``sh`` as the entry point."""
    debs = CACHE / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    with locked(debs / ".lock"):
        found = sorted(debs.glob("busybox-static_*.deb"))
        if not found:
            say("nodeimages: apt-get download busybox-static")
            _run(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", "busybox-static"],
                 "apt-get download busybox-static", cwd=debs)  # fmt: skip
            found = sorted(debs.glob("busybox-static_*.deb"))
    deb = found[-1]
    # the Debian version as a tag ([A-Za-z0-9_.-]): 1%3a1.35.0-4+deb12u1 -> 1.35.0-4-deb12u1
    version = re.sub(r"[^A-Za-z0-9_.-]", "-", deb.name.split("_")[1].split("%3a")[-1])
    name = f"{LOCAL}/busybox:{version}"

    def build(tmp: Path) -> None:
        root = tmp / "root"
        _run(["dpkg-deb", "-x", str(deb), str(root)], f"dpkg-deb -x {deb.name}")
        binary = root / "bin" / "busybox"
        applets = _run([str(binary), "--list-full"], "busybox --list-full").split()
        files = [File("/bin/busybox", binary)]
        files += [File("/" + a, link="/bin/busybox") for a in applets if a != "bin/busybox"]
        files += [File("/tmp", mode=0o1777), File("/root", mode=0o700)]
        write_archive(tmp / "image.tar", name, files, ["/bin/sh"], [_PATH])
        shutil.rmtree(root)

    out = cached_build(CACHE / f"busybox-{_key(deb.name)}", build, kind="busybox")
    return NodeImage(name, out / "image.tar")


_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sidecar(name: str) -> NodeImage:
    """A CSI sidecar's static binary at ``/<name>``, tagged with its pinned version."""
    binary = gobuild.ensure(name)[name]
    pkg = next(p for g in gobuild.GROUPS for n, p in g.binaries.items() if n == name)
    image = f"{LOCAL}/{name}:{gobuild.versions()[pkg]}"

    def build(tmp: Path) -> None:
        files = [File(f"/{name}", binary), File("/tmp", mode=0o1777)]
        write_archive(tmp / "image.tar", image, files, [f"/{name}"], [_PATH])

    out = cached_build(CACHE / f"{name}-{_key(image, _stamp(binary))}", build, kind=name)
    return NodeImage(image, out / "image.tar")


def topolvm(repository: str = "ghcr.io/topolvm-py/topolvm") -> NodeImage:
    """The project's image (built by devtools.image if needed) as ``repository:<version>``."""
    from devtools import image_build
    from devtools.image_oci import blob, manifest_of

    info = image_build.build()
    layout = Path(info.layout)
    name = f"{repository}:{info.tag}"

    def build(tmp: Path) -> None:
        digest, manifest = manifest_of(layout, info.tag)
        raw = blob(layout, digest).read_bytes()
        parts = [manifest["config"], *manifest["layers"]]
        blobs: dict[str, bytes | Path] = {p["digest"]: blob(layout, p["digest"]) for p in parts}
        blobs[digest] = raw
        _pack(tmp / "image.tar", name, raw, blobs)

    out = cached_build(CACHE / f"topolvm-{_key(name, info.digest)}", build, kind="topolvm")
    return NodeImage(name, out / "image.tar")


def workload_images() -> list[NodeImage]:
    """What every node imports at boot: the sandbox image and the workloads' busybox."""
    return [pause(), busybox()]


def sidecars() -> list[NodeImage]:
    return [sidecar(s) for s in SIDECARS]


def driver_images() -> list[NodeImage]:
    """What the chart's pods run: the project's image and the CSI sidecars."""
    return [topolvm(), *sidecars()]


def all_images() -> list[NodeImage]:
    return workload_images() + driver_images()


def _run(argv: list[str], what: str, cwd: Path | None = None) -> str:
    res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise ImageBuildError(f"nodeimages: {what} failed ({res.returncode}): {res.stderr[-2000:]}")
    return res.stdout


def main() -> int:
    try:
        images = all_images()
    except BuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    for image in images:
        print(f"{image.name}\t{image.archive}\t{os.path.getsize(image.archive)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

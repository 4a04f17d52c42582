"""The system disk every Kubernetes node of the test bed boots on: an ext4 image whose
``/var/lib/containerd`` already holds every node image (devtools/nodeimages.py), made once in a
UML guest by the pinned containerd (``ctr images import``) and cached in
``~/.cache/topolvm/nodeimages/system-<key>/disk.img`` by a hash of the images, containerd and
this recipe.

Each node gets a copy-on-write layer of it (devtools/uml.py, ``Disk``), so a node starts with the
images unpacked (importing the project's image alone takes about 100 s inside UML) and what it
writes (containers, the kubelet's root) stays its own.

    python -m devtools.testbed.systemdisk      # build it if needed; print its path
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from pathlib import Path

from devtools import gobuild, nodeimages, uml
from devtools.buildcache import BuildError, cached_build, say
from devtools.nodeimages import NodeImage
from devtools.testbed.kubenode import CONTAINERD_SOCKET, containerd_config

SIZE = 8 << 30  # sparse: only what the images take is written
RECIPE = 1  # raise when the script below changes what the disk holds
BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "bridge")


def _script(config: Path, images: list[NodeImage], bins: dict[str, Path]) -> str:
    ctr = f"{bins['ctr']} --address={CONTAINERD_SOCKET} -n k8s.io"
    imports = "\n".join(
        f"{ctr} images import {shlex.quote(str(i.archive))} >/dev/null" for i in images
    )
    return f"""\
set -eu
mkfs.ext4 -q -F -L node-system /dev/ubdb
mount -o noatime /dev/ubdb /var/lib
mkdir -p /var/lib/containerd /var/lib/kubelet
mount -t cgroup2 cgroup2 /sys/fs/cgroup
{bins["containerd"]} --config={config} >/run/tmp/containerd.log 2>&1 &
containerd=$!
for i in $(seq 200); do test -S {CONTAINERD_SOCKET} && break; sleep 0.3; done
{imports}
{ctr} images ls -q
kill $containerd
wait $containerd || true
umount /var/lib
"""


ATTEMPTS = (600.0, 1200.0)  # seconds each boot of the import may take


def template(images: list[NodeImage] | None = None) -> Path:
    """The system disk's template with ``images`` (default: every node image), built if the
    cache lacks it."""
    images = images if images is not None else nodeimages.all_images()
    bins = gobuild.ensure(*BINARIES)
    key = hashlib.sha256(
        json.dumps(
            [
                RECIPE,
                SIZE,
                sorted((i.name, str(i.archive)) for i in images),
                str(bins["containerd"].parent),
            ]
        ).encode()
    ).hexdigest()[:12]

    def build(tmp: Path) -> None:
        say(f"systemdisk: importing {len(images)} images into a node's system disk (a few min)")
        config = tmp / "containerd.toml"
        config.write_text(containerd_config(bins))
        script = tmp / "build.sh"
        script.write_text(_script(config, images, bins))
        # about 3 minutes on 2 shared cores; a guest that hung (seen once: the CPU spun,
        # nothing was written) is killed and booted once more, not waited on for half an hour
        for limit in ATTEMPTS:
            try:
                res = uml.run(["sh", str(script)], disks=(SIZE,), capture=True, images=tmp,
                              timeout=limit)  # fmt: skip
                break
            except uml.UmlError as exc:
                if limit == ATTEMPTS[-1]:
                    raise
                say(f"systemdisk: {exc}; booting the guest once more")
        if res.returncode != 0:
            raise BuildError(f"systemdisk: the import failed ({res.returncode}):\n"
                             f"{res.console[-3000:]}")  # fmt: skip
        listed = set(res.console.split())
        missing = [i.name for i in images if i.name not in listed]
        if missing:
            raise BuildError(f"systemdisk: containerd does not list {missing}:\n"
                             f"{res.console[-3000:]}")  # fmt: skip
        (tmp / "disk0.img").rename(tmp / "disk.img")
        (tmp / "images.json").write_text(json.dumps([i.name for i in images], indent=2))
        config.unlink()
        script.unlink()

    try:
        # keep 3: the workload-only and the all-images template of this tree side by side (keep=0
        # made each evict the other, so every session built both again), and one of another clone
        out = cached_build(nodeimages.CACHE / f"system-{key}", build, kind="system", keep=3)
    except uml.UmlError as exc:
        raise BuildError(f"systemdisk: {exc}") from exc
    return out / "disk.img"


def main() -> int:
    try:
        print(template())
    except BuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

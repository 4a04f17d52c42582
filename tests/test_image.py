"""The OCI image (devtools/image.py): built (or reused), unpacked, and run from its own root.

The image tests need root (chroot, mmdebstrap), Debian's mirror and PyPI for a cold build
(about 1.5 minutes; a warm one reuses build/image/). The last one boots User-Mode Linux and
runs lvmd, LVM and mkfs from the image against a real disk.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from devtools import image_app, image_build, image_common, image_oci, uml
from devtools import image_recipe as recipe

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"


# -- the recipe: one package list, one set of pins, the Dockerfile in step ---------------------


def final_stage() -> str:
    return DOCKERFILE.read_text().rsplit("\nFROM ", 1)[1]


def test_dockerfile_installs_the_same_debian_packages() -> None:
    m = re.search(r"apt-get install -y --no-install-recommends \\\n(.*?)&&", final_stage(), re.S)
    assert m, "no apt-get install in the Dockerfile's last stage"
    packages = [w for w in m.group(1).split() if w != "\\"]
    assert packages == list(recipe.DEBIAN_PACKAGES)


def test_dockerfile_matches_paths_entrypoint_and_pins() -> None:
    text = DOCKERFILE.read_text()
    stage = final_stage()
    assert f"COPY --from=build {recipe.VENV} {recipe.VENV}" in stage
    assert f"ln -s {recipe.VENV}/bin/topolvm /usr/local/bin/topolvm" in stage
    links = re.search(r"for name in ([^;]+); do", stage)
    assert links and tuple(links.group(1).split()) == recipe.COMMAND_LINKS
    assert f"ENV PATH={recipe.PATH} " in stage
    assert f'ENTRYPOINT ["{recipe.ENTRYPOINT}"]' in stage
    assert f"python3 -m venv {recipe.VENV}" in text
    assert "devtools/image_recipe.py --requirements > /tmp/requirements.txt" in text
    assert "devtools/image_recipe.py --build-constraints > /tmp/build-constraints.txt" in text
    assert "PIP_CONSTRAINT=/tmp/build-constraints.txt" in text
    assert "--no-deps \\\n      -r /tmp/requirements.txt ." in text
    # what the Dockerfile copies is not excluded from the build context
    allowed = {
        line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }  # fmt: skip
    for copied in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):
        assert set(copied.split()) <= allowed, copied


def test_python_pins_are_the_runtime_closure_of_pyproject() -> None:
    pinned = dict(r.split("==") for r in recipe.requirements())
    pinned = {canonicalize_name(n): v for n, v in pinned.items()}
    closure = {canonicalize_name(r.split("==")[0]) for r in recipe.freeze()}
    assert set(pinned) == closure, (
        "PYTHON_REQUIREMENTS in devtools/image_recipe.py differ from the dependencies' closure; "
        "update it from `python -m devtools.image --freeze`"
    )
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"]:
        req = Requirement(spec)
        assert req.specifier.contains(pinned[canonicalize_name(req.name)]), spec


def test_wheel_tags_fit_bookworm() -> None:
    tags = image_app.wheel_tags("amd64")
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in tags


# -- the image itself -----------------------------------------------------------------------


# The network namespace the session started in, held open from collection on: `make test` then
# moves the session into a private one for its cluster tests (tests/conftest.py), where Debian's
# mirror and PyPI are out of reach. A cold image build goes back to this one, as the Go tools
# are built before the move.
START_NETNS = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)


def moved_network() -> bool:
    return os.stat("/proc/self/ns/net").st_ino != os.fstat(START_NETNS).st_ino


@pytest.fixture(scope="module")
def built() -> image_build.ImageInfo:
    """The image from build/image/ (no network needed while the caches are warm), else built."""
    if os.geteuid() != 0:
        pytest.skip("building the image needs root (chroot, mmdebstrap --mode=root)")
    try:
        return image_build.build()
    except image_common.ImageError as exc:
        if not moved_network():
            pytest.fail(f"image build failed: {exc}")
    proc = subprocess.run(
        ["nsenter", f"--net=/proc/self/fd/{START_NETNS}", "--",
         sys.executable, "-m", "devtools.image", "--json"],
        cwd=REPO, pass_fds=(START_NETNS,), capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        pytest.fail(
            f"image build (in the session's first network namespace) failed:\n{proc.stderr}"
        )
    return image_build.ImageInfo(**json.loads(proc.stdout))


@pytest.fixture(scope="module")
def rootfs(built: image_build.ImageInfo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return image_build.unpack(built, tmp_path_factory.mktemp("image") / "rootfs")


def in_image(root: Path, *argv: str) -> str:
    rc, out = image_build.run_in_root(root, argv)
    assert rc == 0, f"{' '.join(argv)} exited {rc}:\n{out}"
    return out


@pytest.mark.image
@pytest.mark.parametrize("argv", image_build.CHECKS, ids=lambda a: " ".join(a)[:30])
def test_image_runs_its_binaries(rootfs: Path, argv: tuple[str, ...]) -> None:
    in_image(rootfs, *argv)


@pytest.mark.image
def test_image_has_topolvm_of_this_repo_on_bookworm_python(rootfs: Path) -> None:
    assert in_image(rootfs, "python3", "--version").startswith("Python 3.11.")
    out = in_image(rootfs, "python3", "-c", "import sys, topolvm; print(sys.prefix)")
    assert out.strip() == recipe.VENV
    code = "import importlib.metadata as m; print(m.version('topolvm'))"
    assert in_image(rootfs, "python3", "-c", code).strip() == recipe.project_version()
    in_image(rootfs, "python3", "-c", "import topolvm.proto.lvmd_pb2, topolvm.cli, grpc")
    assert "Debian" in (rootfs / "etc/os-release").read_text()
    assert "VERSION_CODENAME=bookworm" in (rootfs / "etc/os-release").read_text()


@pytest.mark.image
def test_component_names_dispatch_to_their_subcommand(rootfs: Path) -> None:
    subcommands = {"lvmd": "lvmd", "topolvm-node": "node", "topolvm-controller": "controller",
                   "topolvm-scheduler": "scheduler"}  # fmt: skip
    assert set(subcommands) == set(recipe.COMMAND_LINKS)
    for name, sub in subcommands.items():
        assert f"usage: topolvm {sub} " in in_image(rootfs, f"/{name}", "--help")


@pytest.mark.image
def test_image_config_and_record(built: image_build.ImageInfo) -> None:
    layout = Path(built.layout)
    digest, manifest = image_oci.manifest_of(layout, built.tag)
    assert digest == built.digest
    assert json.loads((layout / "oci-layout").read_text())["imageLayoutVersion"] == "1.0.0"
    assert [layer["size"] for layer in manifest["layers"]] == built.layer_bytes
    config = image_oci.config_of(layout, built.tag)
    assert config["config"]["Entrypoint"] == [recipe.ENTRYPOINT]
    assert f"PATH={recipe.PATH}" in config["config"]["Env"]
    assert config["os"] == "linux" and config["architecture"] == image_common.debian_arch()
    assert config["config"]["Labels"]["org.opencontainers.image.revision"] == built.revision
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(built.source_date_epoch))
    assert config["created"] == created  # SOURCE_DATE_EPOCH, not the build's time
    assert {h["created"] for h in config["history"]} == {created}
    assert len(config["rootfs"]["diff_ids"]) == 2
    assert built.tag == recipe.project_version()
    assert 0 < built.compressed_bytes < built.rootfs_bytes < 400 << 20
    names = {p.split("=")[0] for p in built.debian_packages}
    assert set(recipe.DEBIAN_PACKAGES) <= names
    assert not names & {"apt", "perl", "usrmerge", "systemd"}, "unexpected packages"
    assert any(p.startswith("topolvm==") for p in built.python_packages)


@pytest.mark.image
def test_image_root_has_no_build_host_files(rootfs: Path) -> None:
    assert list((rootfs / "dev").iterdir()) == []
    for host_file in ("etc/resolv.conf", "etc/hostname", "tmp/topolvm-install"):
        assert not (rootfs / host_file).exists(), host_file
    assert not list((rootfs / "opt/topolvm/bin").glob("pip*")), "pip was left in the venv"
    assert (rootfs / "usr/local/bin/topolvm").readlink() == Path(f"{recipe.VENV}/bin/topolvm")


# -- the image's lvmd, LVM and mkfs against a real disk, in User-Mode Linux -----------------

UML_SCRIPT = """\
set -eu
root=$1
mount --rbind /dev "$root/dev"
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --rbind /run "$root/run"   # the guest's LVM config (LVM_SYSTEM_DIR) and locks
export PATH={path} TOPOLVM_LOG_FORMAT=text
img() {{ chroot "$root" "$@"; }}
disk=${{TOPOLVM_UML_DISKS%% *}}
img lvm pvcreate -q -y "$disk"
img lvm vgcreate -q -s 4m imagevg "$disk"
chroot "$root" /lvmd > /run/image-lvmd.log 2>&1 &  # $! is lvmd (chroot execs it)
lvmd=$!
tries=0
until img /lvmd health > /dev/null 2>&1; do
  tries=$((tries + 1))
  if [ $tries -gt 240 ] || ! kill -0 $lvmd 2>/dev/null; then
    echo "lvmd did not start"; cat /run/image-lvmd.log; exit 1
  fi
  sleep 0.5
done
img python3 - create <<'EOF'
{client}
EOF
img mkfs.xfs -q /dev/imagevg/imagelv
img mount /dev/imagevg/imagelv /mnt
echo written-in-uml > "$root/mnt/probe"
img umount /mnt
img mount -o ro /dev/imagevg/imagelv /mnt
img cat /mnt/probe
img umount /mnt
img python3 - remove <<'EOF'
{client}
EOF
kill -TERM $lvmd
wait $lvmd || {{ echo "lvmd exited $?"; cat /run/image-lvmd.log; exit 1; }}
echo IMAGE-LVMD-OK
"""

UML_CLIENT = """\
import sys, urllib.request
import grpc
from topolvm.proto import lvmd_pb2 as pb, lvmd_pb2_grpc as rpc

channel = grpc.insecure_channel("unix:/run/topolvm/lvmd.sock")
vg, lv = rpc.VGServiceStub(channel), rpc.LVServiceStub(channel)
names = lambda: [v.name for v in vg.GetLVList(pb.GetLVListRequest(device_class="ssd")).volumes]
if sys.argv[1] == "create":
    free = vg.GetFreeBytes(pb.GetFreeBytesRequest(device_class="ssd")).free_bytes
    assert free > 1 << 30, free
    made = lv.CreateLV(pb.CreateLVRequest(name="imagelv", size_bytes=512 << 20,
                                          device_class="ssd")).volume
    assert made.size_bytes == 512 << 20 and names() == ["imagelv"], (made, names())
    metrics = urllib.request.urlopen("http://127.0.0.1:8080/metrics", timeout=30).read()
    assert b"process_" in metrics or b"python_" in metrics
    print("created", made.name, made.size_bytes)
else:
    lv.RemoveLV(pb.RemoveLVRequest(name="imagelv", device_class="ssd"))
    assert names() == [], names()
    print("removed")
"""

LVMD_CONFIG = """\
socket-name: /run/topolvm/lvmd.sock
lvm-command-prefix: [/sbin/lvm]
device-classes:
- {name: ssd, volume-group: imagevg, default: true, spare-gb: 0}
"""


@pytest.mark.image
def test_image_lvmd_lvm_and_mkfs_on_a_real_disk_in_uml(rootfs: Path) -> None:
    """The image's root as the guest's chroot: its lvmd (started by upstream's /lvmd name) over
    gRPC, its LVM on a real block device, its mkfs.xfs and mount."""
    reason = uml.available()
    if reason:
        pytest.skip(f"User-Mode Linux is not available: {reason}")
    (rootfs / "etc/topolvm").mkdir(exist_ok=True)
    (rootfs / "etc/topolvm/lvmd.yaml").write_text(LVMD_CONFIG)
    script = UML_SCRIPT.format(path=recipe.PATH, client=UML_CLIENT)
    try:
        res = uml.run(
            ["sh", "-c", script, "sh", str(rootfs)],
            disks=(2 << 30,), mem_mb=768, capture=True, timeout=600,
        )  # fmt: skip
    except uml.UmlError as exc:
        pytest.fail(f"UML: {exc}\n{exc.console[-4000:]}")
    assert res.returncode == 0, res.console[-6000:]
    for line in ("created imagelv 536870912", "written-in-uml", "removed", "IMAGE-LVMD-OK"):
        assert line in res.console, res.console[-6000:]

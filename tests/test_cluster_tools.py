"""The pinned Go-built tools: each runs and reports the pinned version; the VolumeSnapshot CRDs
from the snapshotter's client module are accepted by the real API server."""

from __future__ import annotations

import subprocess

import pytest

from devtools import gobuild
from devtools.testbed.controlplane import ControlPlane

pytestmark = pytest.mark.cluster

SIDECARS = ["csi-provisioner", "csi-resizer", "csi-snapshotter", "snapshot-controller"]


def test_every_group_is_cached_under_its_pinned_key() -> None:
    for group in gobuild.GROUPS:
        if group.on_demand:  # built only when named (crictl): no test needs it
            continue
        folder = gobuild.cache_dir(group)
        assert (folder / ".complete").exists(), f"{group.name} not built at {folder}"
        for name in group.binaries:
            assert (folder / name).stat().st_mode & 0o111, name


@pytest.mark.parametrize("tool", SIDECARS)
def test_sidecar_runs_and_reports_its_pinned_version(tool: str) -> None:
    path = gobuild.ensure(tool)[tool]
    proc = subprocess.run(
        [str(path), "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    pinned = {
        pkg.split("/")[-1]: ver for pkg, ver in gobuild.versions().items()
    }  # e.g. csi-provisioner -> v6.4.0
    assert pinned[tool] in output, output


def test_csi_sanity_runs() -> None:
    path = gobuild.ensure("csi-sanity")["csi-sanity"]
    proc = subprocess.run(
        [str(path), "--help"], capture_output=True, text=True, timeout=30, check=False
    )
    assert "csi.endpoint" in proc.stdout + proc.stderr


def test_volumesnapshot_crds_are_established(control_plane: ControlPlane) -> None:
    crds = gobuild.ensure("snapshot-crds")["snapshot-crds"]
    files = sorted(str(p) for p in crds.glob("snapshot.storage.k8s.io_*.yaml"))
    assert files, f"no CRDs in {crds}"
    for f in files:
        control_plane.kubectl("apply", "--server-side", "-f", f)
    for crd in (
        "volumesnapshots.snapshot.storage.k8s.io",
        "volumesnapshotcontents.snapshot.storage.k8s.io",
        "volumesnapshotclasses.snapshot.storage.k8s.io",
    ):
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")

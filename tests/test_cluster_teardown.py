"""A failing cluster test leaves nothing running behind: run one in a separate pytest session
(its own network namespace, control plane and UML node) and look at what is left after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parent.parent

FAILING_TEST = """
import json, os
from pathlib import Path
import pytest

pytestmark = pytest.mark.cluster

def test_fails_with_everything_running(control_plane, uml_nodes):
    (node,) = uml_nodes(1, vg_gib=[2])
    ssd = {"name": "ssd", "volume-group": "vg1", "default": True}
    node.start_topolvm_node(control_plane, [ssd])
    pids = [c.proc.pid for c in control_plane.children.values()] + [node._proc.pid]
    Path(os.environ["TEARDOWN_REPORT"]).write_text(json.dumps(
        {"pids": pids, "workdir": str(control_plane.workdir), "tap": node.tap}
    ))
    assert False, "deliberate failure with the control plane and a UML node running"
"""


def shm_entries() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("topolvm-uml-")}


def uml_run_dirs() -> set[str]:
    folder = REPO / ".uml"
    return {p.name for p in folder.glob("run-*")} if folder.exists() else set()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def test_a_failing_test_leaves_no_process_disk_or_mount_behind(tmp_path: Path) -> None:
    test_file = tmp_path / "test_deliberately_failing.py"
    test_file.write_text(FAILING_TEST)
    report = tmp_path / "report.json"
    shm_before, runs_before = shm_entries(), uml_run_dirs()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"),
         f"--rootdir={REPO}", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q",
         f"--basetemp={tmp_path / 'inner'}", str(test_file)],
        cwd=REPO, env={**os.environ, "TEARDOWN_REPORT": str(report)},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    output = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 1, output  # the test failed, as it should
    assert "deliberate failure" in output
    seen = json.loads(report.read_text())
    assert len(seen["pids"]) >= 5  # etcd, apiserver, controller-manager, scheduler, UML
    assert [pid for pid in seen["pids"] if alive(pid)] == []
    assert shm_entries() - shm_before == set()  # UML disk images and memory files
    assert uml_run_dirs() - runs_before == set()  # UML init scripts
    assert not (Path(seen["workdir"]) / "etcd").exists()  # the logs stay, etcd's data does not
    assert (Path(seen["workdir"]) / "logs" / "kube-apiserver.log").exists()
    mounts = Path("/proc/self/mounts").read_text()
    assert str(tmp_path) not in mounts
    # The inner session's network namespace (and the TAP device in it) died with it; ours never
    # had that device.
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    assert seen["tap"] not in links.stdout

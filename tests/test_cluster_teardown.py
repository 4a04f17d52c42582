"""A failing cluster test leaves nothing running behind: run one in a separate pytest session
(its own network namespace, control plane and UML node) and look at what is left after it.
(The namespace, and the TAP devices in it, end with that session's last process.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtools import uml

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parent.parent

FAILING_TEST = """
import json, os
from pathlib import Path
import pytest

from devtools import uml

pytestmark = pytest.mark.cluster

def test_fails_with_everything_running(control_plane, uml_nodes):
    (node,) = uml_nodes(1, vg_gib=[2])
    ssd = {"name": "ssd", "volume-group": "vg1", "default": True}
    node.start_topolvm_node(control_plane, [ssd])
    pids = [c.proc.pid for c in control_plane.children.values()] + [node._proc.pid]
    Path(os.environ["TEARDOWN_REPORT"]).write_text(json.dumps(
        {"pids": pids, "workdir": str(control_plane.workdir)}
    ))
    if os.environ.get("TEARDOWN_MODE") == "hang":
        import time
        time.sleep(600)  # the outer test SIGKILLs this session
    assert False, "deliberate failure with the control plane and a UML node running"
"""


def shm_entries() -> set[str]:
    # only folders of ended processes: the inner session's; a live one's is another run's
    # (make test's other xdist worker boots guests meanwhile)
    prefix = uml.FAST_PREFIX
    return {p.name for p in Path("/dev/shm").iterdir()
            if p.name.startswith(prefix) and uml.owner_gone(p.name, prefix)}  # fmt: skip


def uml_run_dirs() -> set[str]:
    folder = REPO / ".uml"
    runs = folder.glob("run-*") if folder.exists() else []
    return {p.name for p in runs if uml.owner_gone(p.name, uml.RUN_PREFIX)}


def group_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid`` (each component runs in a group of its own,
    UML with its helper processes)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def inner_session(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], Path]:
    test_file = tmp_path / "test_deliberately_failing.py"
    test_file.write_text(FAILING_TEST)
    report = tmp_path / "report.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"),
         f"--rootdir={REPO}", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q",
         f"--basetemp={tmp_path / 'inner'}", str(test_file)],
        cwd=REPO, env={**os.environ, "TEARDOWN_REPORT": str(report), "TEARDOWN_MODE": mode},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    return proc, report


def test_a_failing_test_leaves_no_process_disk_or_folder_behind(tmp_path: Path) -> None:
    shm_before, runs_before = shm_entries(), uml_run_dirs()
    proc, report = inner_session(tmp_path, "fail")
    output = proc.communicate(timeout=600)[0][-4000:]
    assert proc.returncode == 1, output  # the test failed, as it should
    assert "deliberate failure" in output
    seen = json.loads(report.read_text())
    assert len(seen["pids"]) >= 5  # etcd, apiserver, controller-manager, scheduler, UML
    assert [(pid, group_members(pid)) for pid in seen["pids"] if group_members(pid)] == []
    assert shm_entries() - shm_before == set()  # UML disk images and memory files
    assert uml_run_dirs() - runs_before == set()  # UML init scripts
    assert not (Path(seen["workdir"]) / "etcd").exists()  # the logs stay, etcd's data does not
    assert (Path(seen["workdir"]) / "logs" / "kube-apiserver.log").exists()


def test_a_killed_session_takes_its_components_along(tmp_path: Path) -> None:
    shm_before, runs_before = shm_entries(), uml_run_dirs()
    proc, report = inner_session(tmp_path, "hang")
    deadline = time.monotonic() + 300
    while not report.exists():
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        assert time.monotonic() < deadline, "the inner session never got its node up"
        time.sleep(0.5)
    seen = json.loads(report.read_text())
    assert all(group_members(pid) for pid in seen["pids"])  # all up before the kill
    proc.kill()  # SIGKILL: no fixture teardown runs
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while any(group_members(pid) for pid in seen["pids"]):  # PR_SET_PDEATHSIG
        assert time.monotonic() < deadline, [group_members(pid) for pid in seen["pids"]]
        time.sleep(0.2)
    # Its UML disk images and init folder could not be removed by it; the next UML start
    # sweeps them.
    left = shm_entries() - shm_before
    left_runs = uml_run_dirs() - runs_before
    uml._sweep_stale(Path("/dev/shm"), uml.FAST_PREFIX)
    uml._sweep_stale(REPO / ".uml", uml.RUN_PREFIX)
    assert left and shm_entries() - shm_before == set()
    assert left_runs and uml_run_dirs() - runs_before == set()

"""Whether a node can put IO limits in force, from its cgroup files (topolvm.node.podcgroup's
support, topolvm.node.iocondition's read_support), and the Node condition that says it."""

from __future__ import annotations

from pathlib import Path

from topolvm.iolimits import NODE_CONDITION
from topolvm.node import podcgroup
from topolvm.node.iocondition import condition_patch, read_support


def cgroup_tree(root: Path, *, controllers: str = "cpu io memory pids", pods: str | None = None,
                pods_controllers: str = "cpu io memory", io_max: bool = True) -> Path:  # fmt: skip
    """A cgroup v2 root as a node shows it: ``pods`` names the kubelet's folder (None: none)."""
    root.mkdir(exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    if pods is not None:
        folder = root / pods
        folder.mkdir()
        (folder / "cgroup.controllers").write_text(pods_controllers + "\n")
        if io_max:
            (folder / "io.max").write_text("")
    return root


def test_each_reason_a_node_cannot_limit_and_what_it_says(tmp_path: Path) -> None:
    off = read_support("n1", None)
    assert (off.ok, off.reason) == (False, podcgroup.TURNED_OFF)
    assert "--cgroup-root" in off.message and "node.ioLimits.enabled" in off.message

    v1 = tmp_path / "v1"
    v1.mkdir()  # a cgroup v1 mount has no cgroup.controllers
    said = read_support("n1", v1)
    assert (said.ok, said.reason) == (False, podcgroup.CGROUP_V1)
    assert str(v1) in said.message

    no_io = cgroup_tree(tmp_path / "no-io", controllers="cpu memory", pods="kubepods")
    said = read_support("n1", no_io)
    assert (said.ok, said.reason) == (False, podcgroup.NO_IO)
    assert "cpu memory" in said.message

    not_for_pods = cgroup_tree(tmp_path / "pods-no-io", pods="kubepods.slice",
                               pods_controllers="cpu memory")  # fmt: skip
    said = read_support("n1", not_for_pods)
    assert (said.ok, said.reason) == (False, podcgroup.NO_IO)
    assert "kubepods.slice" in said.message

    no_throttling = cgroup_tree(tmp_path / "no-thr", pods="kubepods", io_max=False)
    said = read_support("n1", no_throttling)
    assert (said.ok, said.reason) == (False, podcgroup.NO_THROTTLING)
    assert "CONFIG_BLK_DEV_THROTTLING" in said.message
    assert all("volumes work without limits" in s.message for s in (off, said))


def test_a_node_that_can_limit_and_one_whose_pods_were_not_seen_yet(tmp_path: Path) -> None:
    good = cgroup_tree(tmp_path / "good", pods="kubepods.slice")
    assert read_support("n1", good).reason == podcgroup.SUPPORTED
    assert read_support("n1", good).ok

    early = cgroup_tree(tmp_path / "early")  # no kubelet pods yet (or a --cgroup-root elsewhere)
    said = read_support("n1", early)
    assert (said.ok, said.reason) == (True, podcgroup.UNCHECKED)

    # one pod's folder, checked when a limit is written there
    pod = early / "custom" / "kubepods" / "podX"
    pod.mkdir(parents=True)
    (pod / "cgroup.controllers").write_text("io\n")
    assert read_support("n1", early, pod).reason == podcgroup.NO_THROTTLING
    (pod / "io.max").write_text("")
    assert read_support("n1", early, pod).reason == podcgroup.SUPPORTED


def test_the_condition_changes_only_when_the_answer_does() -> None:
    off = podcgroup.support("n1", None)
    first = condition_patch(off, [{"type": "Ready", "status": "True"}], "2026-11-29T10:00:00Z")
    assert first is not None
    (entry,) = first["status"]["conditions"]  # only its own entry: a strategic merge keeps Ready
    assert entry == {
        "type": NODE_CONDITION, "status": "True", "reason": podcgroup.TURNED_OFF,
        "message": off.message, "lastHeartbeatTime": "2026-11-29T10:00:00Z",
        "lastTransitionTime": "2026-11-29T10:00:00Z",
    }  # fmt: skip
    assert condition_patch(off, [entry], "2026-11-29T11:00:00Z") is None

    # the same status for another reason: the message changes, the transition time stays
    v1 = podcgroup.support("n1", "/sys/fs/cgroup", v2=False)
    second = condition_patch(v1, [entry], "2026-11-29T11:00:00Z")
    assert second is not None
    (moved,) = second["status"]["conditions"]
    assert (moved["reason"], moved["lastTransitionTime"]) == (podcgroup.CGROUP_V1,
                                                              "2026-11-29T10:00:00Z")  # fmt: skip
    # limits possible again: status False, and it moved now
    ok = podcgroup.support("n1", "/sys/fs/cgroup", controllers="io", folder="/k",
                           folder_controllers="io", folder_io_max=True)  # fmt: skip
    third = condition_patch(ok, [moved], "2026-11-29T12:00:00Z")
    assert third is not None
    (back,) = third["status"]["conditions"]
    assert (back["status"], back["lastTransitionTime"]) == ("False", "2026-11-29T12:00:00Z")

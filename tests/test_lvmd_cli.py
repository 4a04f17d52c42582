"""``topolvm lvmd`` as a process: config errors, start-up failures, health, metrics, SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import free_port
from tests.lvm_fixtures import THICK_DC, VolumeGroups, lvmd_config, write_config

TOPOLVM = [sys.executable, "-m", "topolvm"]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TOPOLVM, "--log-format", "text", *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


# -- host-side: nothing here reaches LVM ------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("device-classes:\n- {name: a, volume-group: v, spare-gb: -3}\n",
         ["device-classes[0].spare-gb", "-3"]),
        ("device-classes:\n- {name: a, volume-group: v, type: thinn}\n",
         ["device-classes[0].type", "thinn"]),
        ("device-classes:\n- {name: a, volume-group: v, spare_gb: 5}\n",
         ["device-classes[0].spare_gb", "unknown key"]),
        ("device-classes: []\n", ["device-classes", "at least one"]),
        ("device-classes:\n- {name: a, volume-group: v, default: true}\n"
         "- {name: b, volume-group: w, default: true}\n", ["device-classes[1].default", "'b'"]),
        ("- just a list\n", ["expected a mapping"]),
        ("device-classes: [\n", ["not valid YAML"]),
    ],
)  # fmt: skip
def test_bad_config_exits_non_zero_naming_key_and_value(
    tmp_path: Path, body: str, expected: list[str]
) -> None:
    cfg = tmp_path / "lvmd.yaml"
    cfg.write_text(body)
    res = run_cli("lvmd", "--config", str(cfg), "--metrics-bind-address", "0")
    assert res.returncode == 1
    assert str(cfg) in res.stderr
    for text in expected:
        assert text in res.stderr, res.stderr


def test_missing_config_file(tmp_path: Path) -> None:
    res = run_cli("lvmd", "--config", str(tmp_path / "absent.yaml"))
    assert res.returncode == 1 and "absent.yaml" in res.stderr and "No such file" in res.stderr


def test_lvm_path_conflicts_with_prefix(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", lvmd_config(tmp_path / "s", [THICK_DC]))
    res = run_cli("lvmd", "--config", str(cfg), "--lvm-path", "/usr/sbin/lvm")
    assert res.returncode == 1
    assert "cannot set both --lvm-path and lvm-command-prefix" in res.stderr


def test_bad_flags_are_usage_errors(tmp_path: Path) -> None:
    res = run_cli("lvmd", "--refresh-interval", "-1")
    assert res.returncode == 2 and "--refresh-interval" in res.stderr
    res = run_cli("lvmd", "--metrics-bind-address", "nonsense")
    assert res.returncode == 2 and "--metrics-bind-address" in res.stderr
    res = run_cli()
    assert res.returncode == 2 and "lvmd" in res.stderr


def test_health_without_lvmd_fails(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", lvmd_config(tmp_path / "none.sock", [THICK_DC]))
    res = run_cli("lvmd", "health", "--config", str(cfg), timeout=60)
    assert res.returncode == 1 and "lvmd does not working" in res.stderr


# -- inside UML: the real daemon -------------------------------------------------------------


def start(cfg: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*TOPOLVM, "--log-format", "json", "lvmd", "--config", str(cfg), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for_socket(path: Path, proc: subprocess.Popen[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and stat.S_ISSOCK(path.lstat().st_mode):
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(str(path))
                    return
                except OSError:
                    pass  # a stale socket, not yet replaced
        if proc.poll() is not None:
            raise AssertionError(f"lvmd exited {proc.returncode}: {proc.communicate()[1]}")
        time.sleep(0.05)
    raise AssertionError("lvmd did not create its socket")


@pytest.mark.uml
def test_daemon_health_metrics_and_sigterm(vgs: VolumeGroups, tmp_path: Path) -> None:
    vgs.create("vg1", size_gib=4)
    sock = tmp_path / "run" / "lvmd.sock"  # parent directory is created by lvmd
    cfg = write_config(tmp_path / "c.yaml", lvmd_config(sock, [THICK_DC]))
    port = free_port()
    proc = start(cfg, "--metrics-bind-address", f"127.0.0.1:{port}")
    try:
        wait_for_socket(sock, proc)
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        res = run_cli("lvmd", "health", "--config", str(cfg))
        assert res.returncode == 0 and res.stdout.strip() == "SERVING", res.stderr
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert b"process_cpu_seconds_total" in r.read()
        second = start(cfg, "--metrics-bind-address", "0")  # the socket is in use
        _, err = second.communicate(timeout=60)
        assert second.returncode == 1 and "in use" in err
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert '"msg": "lvmd stopped"' in err
    assert not sock.exists()


@pytest.mark.uml
def test_stale_socket_is_replaced_and_other_files_are_not(
    vgs: VolumeGroups, tmp_path: Path
) -> None:
    vgs.create("vg1", size_gib=4)
    sock = tmp_path / "lvmd.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock))  # bound, never listening: what a crashed lvmd leaves behind
    stale.close()
    cfg = write_config(tmp_path / "c.yaml", lvmd_config(sock, [THICK_DC]))
    proc = start(cfg, "--metrics-bind-address", "0")
    try:
        wait_for_socket(sock, proc)
        assert run_cli("lvmd", "health", "--config", str(cfg)).returncode == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    regular = tmp_path / "file.sock"
    regular.write_text("precious")
    cfg2 = write_config(tmp_path / "c2.yaml", lvmd_config(regular, [THICK_DC]))
    res = run_cli("lvmd", "--config", str(cfg2), "--metrics-bind-address", "0")
    assert res.returncode == 1 and "not a socket" in res.stderr
    assert regular.read_text() == "precious"


@pytest.mark.uml
def test_missing_vg_exits_naming_it(vgs: VolumeGroups, tmp_path: Path) -> None:
    vgs.create("vg1", size_gib=4)
    thin: dict[str, Any] = {
        "name": "t", "volume-group": "vg1", "type": "thin",
        "thin-pool": {"name": "missingpool", "overprovision-ratio": 2},
    }  # fmt: skip
    classes = [{**THICK_DC, "volume-group": "missingvg"}, thin]
    cfg = write_config(tmp_path / "c.yaml", lvmd_config(tmp_path / "s.sock", classes))
    res = run_cli("lvmd", "--config", str(cfg), "--metrics-bind-address", "0")
    assert res.returncode == 1
    assert "'missingvg'" in res.stderr and "'missingpool'" in res.stderr
    assert not (tmp_path / "s.sock").exists()
    assert os.listdir(tmp_path) == ["c.yaml"]

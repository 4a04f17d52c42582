"""``topolvm scheduler`` as a process: config errors, print-config, serving, SIGTERM; the bench."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from bench import scheduler_bench
from tests.helpers import first_answer, free_port, http_status

TOPOLVM = [sys.executable, "-m", "topolvm", "--log-format", "text"]
DATA = Path(__file__).parent / "data" / "scheduler"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TOPOLVM, *args], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_bad_config_exits_1_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "scheduler.yaml"
    cfg.write_text("divisors: {ssd: 0}\n")
    r = run_cli("scheduler", "--config", str(cfg))
    assert r.returncode == 1
    assert "topolvm scheduler: invalid configuration" in r.stderr
    assert "invalid divisor for device-class 'ssd'" in r.stderr
    r = run_cli("scheduler", "--config", str(tmp_path / "missing.yaml"))
    assert r.returncode == 1 and "cannot read scheduler config" in r.stderr
    r = run_cli("scheduler", "--listen", "nope")
    assert r.returncode == 1 and "--listen" in r.stderr


def test_print_config_modes() -> None:
    r = run_cli("scheduler", "print-config")
    assert r.returncode == 0, r.stderr
    ext = yaml.safe_load(r.stdout)["extenders"][0]
    assert "managedResources" not in ext
    assert ext["ignorable"] is True and ext["nodeCacheCapable"] is False
    r = run_cli(
        "scheduler", "print-config", "--node-cache", "--managed-resource", "--extender-only",
        "--url", "http://10.0.0.1:9251", env={"USE_LEGACY": "1"},
    )  # fmt: skip
    ext = yaml.safe_load(r.stdout)[0]
    assert ext["urlPrefix"] == "http://10.0.0.1:9251"
    assert ext["nodeCacheCapable"] is True
    assert ext["managedResources"] == [
        {"name": "topolvm.cybozu.com/capacity", "ignoredByScheduler": True}
    ]
    assert run_cli("scheduler", "print-config", "--weight", "0").returncode == 2


def test_serves_until_sigterm_with_access_log(tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "scheduler.yaml"
    cfg.write_text(f"listen: 127.0.0.1:{port}\ndivisors: {{ssd: 2}}\n")
    proc = subprocess.Popen(
        [*TOPOLVM, "scheduler", "--config", str(cfg), "--managed-resource"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        status, body = first_answer(f"http://127.0.0.1:{port}/status", proc)
        assert status == 200
        assert json.loads(body)["mode"] == "managed-resource"
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/prioritize",
            data=(DATA / "predicate-pascal.json").read_bytes(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            # divisor 2: 240 GiB → log2(120) → 6
            assert json.loads(r.read())[0] == {"Host": "node-a", "Score": 6}
        assert http_status(f"http://127.0.0.1:{port}/predicate")[0] == 405
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "topolvm-scheduler started" in err
    assert "managed-resource mode: pods carrying topolvm.io/capacity stay Pending" in err
    assert "topolvm.scheduler.access: access" in err and "url='/prioritize'" in err
    assert "status=405" in err


def test_listen_address_in_use_exits_1() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_cli("scheduler", "--listen", f"127.0.0.1:{port}")
    assert r.returncode == 1
    assert "cannot listen" in r.stderr


def test_bench_runs_at_a_tiny_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        scheduler_bench.main(
            ["--sizes", "3,7", "--rounds", "3", "--cache-nodes", "9", "--cache-rounds", "4"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "(f+p)/dec" in out
    lines = [line.split() for line in out.splitlines()]
    # the medians' table, then the tails' (p50, p99 and their ratio per verb)
    assert [row[0] for row in lines if row and row[0] in ("3", "7")] == ["3", "7", "3", "7"]
    assert "tails of the same rounds" in out
    assert any(row[:2] == ["predicate", "4"] for row in lines)
    assert any(row[:2] == ["prioritize", "4"] for row in lines)

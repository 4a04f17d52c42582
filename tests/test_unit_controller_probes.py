"""topolvm-controller answers kubelet's probes from its start: while it still waits for an
unreachable API server, /healthz says alive (a liveness probe must not restart a process that
waits) and /readyz says why it is not ready."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import first_answer, free_port, http_status

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:%d"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def test_probes_answer_while_the_api_server_is_unreachable(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG % free_port())  # nothing listens there
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "topolvm", "controller", f"--kubeconfig={kubeconfig}",
         f"--health-probe-bind-address=127.0.0.1:{port}", "--metrics-bind-address=0",
         "--leader-election=false", "--enable-webhooks=false",
         f"--csi-socket={tmp_path / 'csi.sock'}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        health = first_answer(f"http://127.0.0.1:{port}/healthz", proc)
        ready = http_status(f"http://127.0.0.1:{port}/readyz")
        assert proc.stdout is not None
        waiting = ""  # it says so every second, and gives up after 30 attempts (EOF)
        while "waiting for the API server" not in waiting and (line := proc.stdout.readline()):
            waiting = line
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert health == (200, b"ok")
    assert ready == (503, b"informer caches are not synced yet")
    assert "cannot reach the Kubernetes API" in waiting

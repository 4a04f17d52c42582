"""Log output: the Kubernetes client's per-request lines only for failed requests."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import http.server, sys, threading
    import httpx2
    from topolvm import logs

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            codes = {"/ok": 200, "/missing": 404}
            self.send_response(codes.get(self.path, 403))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    logs.setup(sys.argv[1], "text")
    base = f"http://127.0.0.1:{server.server_address[1]}"
    with httpx2.Client() as client:
        client.get(base + "/ok")
        client.get(base + "/forbidden")
        client.get(base + "/missing")
    """
)


@pytest.mark.parametrize("level", ["info", "debug"])
def test_successful_requests_are_logged_only_at_debug(level: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, level],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if "HTTP Request" in line]
    assert any("/forbidden" in line and "403" in line for line in lines), out.stderr
    assert any("/ok" in line for line in lines) == (level == "debug"), out.stderr
    # a lookup of what is not there is its caller's to tell
    assert any("/missing" in line for line in lines) == (level == "debug"), out.stderr

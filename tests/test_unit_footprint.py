"""What the per-node daemons load (issue 24): ``topolvm node`` and ``topolvm lvmd`` run the
same program as the scheduler and the controller, and must not pay for their HTTP servers.
The node's resident memory itself is checked in tests/test_cluster_node_process.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("aiohttp", "cryptography", "jsonpatch")  # the extender's and webhook's, ~15 MB
# grpcio's C core: ~18 MB and a thread pool that wakes every second (rpc/transport.py)
GRPC_C_CORE = ("grpc",)
# ~8 MB of validators for two small YAML files; they are decoded with msgspec (config/decode.py)
PYDANTIC = ("pydantic", "pydantic_core")
FORBIDDEN = HEAVY + GRPC_C_CORE + PYDANTIC


@pytest.mark.parametrize("entry", ["topolvm.node.app", "topolvm.lvmd.server"])
def test_a_per_node_daemon_loads_no_http_framework_no_grpc_c_core_no_pydantic(entry: str) -> None:
    # What `python -m topolvm node|lvmd` imports: the command line of every component, then the
    # daemon's own modules.
    code = (
        f"import sys, topolvm.cli, {entry}\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

"""``topolvm node`` as a process: flag errors and start-up failures with clear messages (host)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.kube_fixtures import write_kubeconfig

TOPOLVM = [sys.executable, "-m", "topolvm", "--log-format", "text"]


async def run_node(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *TOPOLVM, "node", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_missing_node_name() -> None:
    code, out = await run_node("--metrics-bind-address", "0")
    assert code == 1
    assert "node name is not given" in out


async def test_node_name_from_env_and_unreachable_api(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:9")  # nothing listens
    code, out = await run_node(
        "--kubeconfig", str(kubeconfig), "--metrics-bind-address", "0",
        "--csi-socket", str(tmp_path / "csi.sock"), env={"NODE_NAME": "n1"},
    )  # fmt: skip
    assert code == 1
    assert "cannot reach the Kubernetes API" in out


async def test_bad_kubeconfig_file(tmp_path: Path) -> None:
    code, out = await run_node(
        "--nodename", "n1", "--kubeconfig", str(tmp_path / "missing"),
        "--metrics-bind-address", "0",
    )  # fmt: skip
    assert code == 1
    assert "cannot load Kubernetes client configuration" in out


async def test_bad_flag_values() -> None:
    code, out = await run_node("--nodename", "n1", "--metrics-bind-address", "localhost")
    assert code == 2 and "expected [host]:port" in out
    code, out = await run_node("--nodename", "n1", "--lvm-path", "/sbin/lvm")
    assert code == 1 and "--lvm-path only applies with --embed-lvmd" in out
    code, out = await run_node("--nodename", "n1", "--command-timeout", "8")
    assert code == 1 and "--command-timeout only applies with --embed-lvmd" in out
    code, out = await run_node("--nodename", "n1", "--embed-lvmd", "--command-timeout", "0")
    assert code == 2 and "--command-timeout" in out
    code, out = await run_node("--nodename", "n1", "--lv-accounting-interval", "0")
    assert code == 2 and "--lv-accounting-interval" in out


async def test_bad_kubelet_registration_and_health_flags() -> None:
    code, out = await run_node("--nodename", "n1", "--kubelet-registration-path", "/x.sock")
    assert code == 1
    assert "--kubelet-registration-path only applies with --register-with-kubelet" in out
    code, out = await run_node(
        "--nodename", "n1", "--register-with-kubelet", "--plugin-registration-path", "registry"
    )  # fmt: skip
    assert code == 1
    assert "--plugin-registration-path must be an absolute path, got 'registry'" in out
    code, out = await run_node("--nodename", "n1", "--register-with-kubelet=maybe")
    assert code == 2 and "not a boolean: 'maybe'" in out
    code, out = await run_node("--nodename", "n1", "--health-probe-bind-address", "localhost")
    assert code == 2 and "expected [host]:port" in out


async def test_embedded_lvmd_config_errors_are_reported(tmp_path: Path) -> None:
    cfg = tmp_path / "lvmd.yaml"
    cfg.write_text("device-classes: []\n")
    code, out = await run_node("--nodename", "n1", "--embed-lvmd", "--config", str(cfg))
    assert code == 1
    assert "device-classes" in out and "at least one" in out


async def test_component_names_as_argv0(tmp_path: Path) -> None:
    """Upstream's image symlinks each component name to one binary; so can ours."""
    script = Path(sys.executable).parent / "topolvm"
    for name, sub in (
        ("lvmd", "lvmd"),
        ("topolvm-node", "node"),
        ("topolvm-scheduler", "scheduler"),
    ):
        link = tmp_path / name
        link.symlink_to(script)
        proc = await asyncio.create_subprocess_exec(
            str(link), "--help", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, _ = await proc.communicate()
        assert proc.returncode == 0
        assert out.decode().startswith(f"usage: topolvm {sub} ")

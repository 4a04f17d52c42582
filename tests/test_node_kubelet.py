"""topolvm-node without the csi-node-driver-registrar and livenessprobe sidecars (host): its
plugin registration socket called as the kubelet calls it (``--register-with-kubelet``), and its
own ``/healthz`` (``--health-probe-bind-address``). The listeners run as a process of their own,
started from the real ``topolvm node`` flags (tests/node_kubelet_helpers.py)."""

from __future__ import annotations

import shutil
import socket
import stat
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from tests.helpers import eventually, free_port
from tests.node_kubelet_helpers import NodeProcess, kubelet_get_info, kubelet_notify
from topolvm.constants import names
from topolvm.csi.identity import IdentityService
from topolvm.daemon import Parts, serve_health
from topolvm.proto import csi_pb2 as csi
from topolvm.proto import csi_pb2_grpc as csi_grpc
from topolvm.proto import pluginregistration_pb2 as reg

REG = "topolvm.io-reg.sock"


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short folder: a socket's path must fit AF_UNIX's 108 bytes, and pytest's own folder
    for a test in an xdist worker (``/tmp/pytest-of-root/pytest-N/popen-gw1/<test>0/``) leaves
    too little of them for the kubelet's plugin paths."""
    folder = Path(tempfile.mkdtemp(prefix="topolvm-kubelet-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Callable[..., NodeProcess]]:
    """Makes helper processes with the given ``topolvm node`` flags; kills what still runs."""
    made: list[NodeProcess] = []

    def make(*args: str) -> NodeProcess:
        folder = tmp_path / f"node{len(made)}"
        folder.mkdir()
        made.append(NodeProcess(folder, list(args)))
        return made[-1]

    yield make
    for p in made:
        await p.kill()


def sockets(tmp_path: Path) -> tuple[Path, Path]:
    """The CSI socket where the chart puts it, and the kubelet's registration folder."""
    return tmp_path / "plugins/topolvm.io/node/csi-topolvm.sock", tmp_path / "plugins_registry"


async def plugin_name(endpoint: str) -> str:
    async with grpc.aio.insecure_channel(f"unix:{endpoint}") as channel:
        info = await csi_grpc.IdentityStub(channel).GetPluginInfo(csi.GetPluginInfoRequest())
        return info.name


async def test_the_kubelet_registers_the_driver_and_a_stop_unregisters_it(
    tmp_path: Path, node: Callable[..., NodeProcess]
) -> None:
    csi_socket, registry = sockets(tmp_path)
    n = node(f"--csi-socket={csi_socket}", "--register-with-kubelet",
             f"--plugin-registration-path={registry}")  # fmt: skip
    await n.start(wait_for=registry / REG)

    info = await kubelet_get_info(registry / REG)
    assert (info.type, info.name, info.endpoint) == ("CSIPlugin", "topolvm.io", str(csi_socket))
    assert list(info.supported_versions) == ["1.0.0"]
    assert await plugin_name(info.endpoint) == "topolvm.io"  # what the kubelet calls next
    assert stat.S_IMODE((registry / REG).stat().st_mode) == 0o600
    await kubelet_notify(registry / REG, registered=True)

    assert await n.terminate() == 0, n.output
    assert not (registry / REG).exists(), "the registration socket outlives a graceful stop"
    assert not csi_socket.exists()
    assert "registered with the kubelet" in n.output
    assert f"socket='{registry / REG}'" in n.output  # the log line says which socket


async def test_legacy_name_and_the_kubelets_own_path_of_the_csi_socket(
    tmp_path: Path, node: Callable[..., NodeProcess]
) -> None:
    csi_socket, registry = sockets(tmp_path)
    on_host = "/var/lib/kubelet/plugins/topolvm.cybozu.com/node/csi-topolvm.sock"
    n = node(f"--csi-socket={csi_socket}", "--legacy", "--register-with-kubelet",
             f"--plugin-registration-path={registry}",
             f"--kubelet-registration-path={on_host}")  # fmt: skip
    legacy_socket = registry / "topolvm.cybozu.com-reg.sock"
    await n.start(wait_for=legacy_socket)
    info = await kubelet_get_info(legacy_socket)
    assert (info.name, info.endpoint) == ("topolvm.cybozu.com", on_host)
    assert await n.terminate() == 0, n.output


async def test_a_rejected_registration_ends_the_process_with_the_kubelets_error(
    tmp_path: Path, node: Callable[..., NodeProcess]
) -> None:
    csi_socket, registry = sockets(tmp_path)
    n = node(f"--csi-socket={csi_socket}", "--register-with-kubelet",
             f"--plugin-registration-path={registry}")  # fmt: skip
    await n.start(wait_for=registry / REG)
    await kubelet_get_info(registry / REG)
    why = "none of the versions specified [2.0.0] are supported"
    await kubelet_notify(registry / REG, registered=False, error=why)

    assert await n.wait() == 1, n.output  # the kubelet restarts the container
    assert f"the kubelet rejected the plugin registration: {why}" in n.output
    assert "topolvm-node cannot start: a part of topolvm-node failed: the kubelet rejected" in (
        n.output
    )
    assert not (registry / REG).exists() and not csi_socket.exists()


async def served_info(socket_path: Path) -> reg.PluginInfo | None:
    """GetInfo's answer, or None while nothing serves ``socket_path``."""
    try:
        return await kubelet_get_info(socket_path)
    except grpc.aio.AioRpcError:
        return None


async def test_a_stale_socket_is_replaced_and_a_live_one_is_refused(
    tmp_path: Path, node: Callable[..., NodeProcess]
) -> None:
    csi_socket, registry = sockets(tmp_path)
    registry.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as crashed:  # left behind: nobody listens on it
        crashed.bind(str(registry / REG))
    first = node(f"--csi-socket={csi_socket}", "--register-with-kubelet",
                 f"--plugin-registration-path={registry}")  # fmt: skip
    await first.start(wait_for=csi_socket)
    info = await eventually("GetInfo served in place of the stale socket",
                            lambda: served_info(registry / REG))  # fmt: skip
    assert info.name == "topolvm.io"

    # A second registrant for the driver (say, the csi-node-driver-registrar sidecar left on)
    # fails with the reason, and leaves the first one's socket alone.
    second = node(f"--csi-socket={tmp_path / 'other.sock'}", "--register-with-kubelet",
                  f"--plugin-registration-path={registry}")  # fmt: skip
    await second.start(wait_for=None)
    assert await second.wait() == 1
    assert f"socket {registry / REG} is in use by another process" in second.output
    assert (await kubelet_get_info(registry / REG)).name == "topolvm.io"
    assert await first.terminate() == 0, first.output


async def test_without_the_flag_there_is_no_registration_socket(
    tmp_path: Path, node: Callable[..., NodeProcess]
) -> None:
    csi_socket, registry = sockets(tmp_path)
    n = node(f"--csi-socket={csi_socket}")
    await n.start(wait_for=csi_socket)
    assert await plugin_name(str(csi_socket)) == "topolvm.io"
    assert await n.terminate() == 0, n.output
    assert not registry.exists()


async def test_healthz_answers_what_the_csi_probe_answers(
    tmp_path: Path, node: Callable[..., NodeProcess]
) -> None:
    csi_socket, _ = sockets(tmp_path)
    port = free_port()
    n = node(f"--csi-socket={csi_socket}", f"--health-probe-bind-address=127.0.0.1:{port}")
    n.check_file.write_text("lvmd is not serving")
    await n.start(wait_for=csi_socket)

    async def probe() -> tuple[str, bool]:
        async with grpc.aio.insecure_channel(f"unix:{csi_socket}") as channel:
            try:
                resp = await csi_grpc.IdentityStub(channel).Probe(csi.ProbeRequest())
            except grpc.aio.AioRpcError as e:
                return f"{e.code().name}: {e.details()}", False
            return "OK", resp.ready.value

    assert await eventually("503", lambda: healthz_is(port, 503)) == "lvmd is not serving"
    assert await probe() == ("FAILED_PRECONDITION: lvmd is not serving", False)
    n.check_file.write_text("")
    assert await eventually("200", lambda: healthz_is(port, 200)) == "ok"
    assert await probe() == ("OK", True)
    n.check_file.write_text("CSIDriver topolvm.io not found")  # a later round fails
    assert await eventually("503", lambda: healthz_is(port, 503)) == (
        "CSIDriver topolvm.io not found"
    )
    assert await n.terminate() == 0, n.output


async def healthz(port: int) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz") as r:
        return r.status, await r.text()


async def healthz_is(port: int, status: int) -> str | None:
    """The body once ``/healthz`` answers ``status``, else None."""
    try:
        got, body = await healthz(port)
    except aiohttp.ClientConnectionError:
        return None
    return body if got == status else None


async def test_healthz_before_the_first_round_of_checks() -> None:
    """Probe says ready: false until the first round passed; /healthz says 503 with why."""
    identity = IdentityService(names(False), [])
    parts, port = Parts("topolvm-node"), free_port()
    await serve_health(parts, ("127.0.0.1", port), {"/healthz": identity.checker.status})
    try:
        assert await healthz(port) == (503, "readiness checks have not passed yet")
        await identity.checker.check_once()
        assert await healthz(port) == (200, "ok")
    finally:
        await parts.stop()


def test_the_registration_api_is_the_kubelets_on_the_wire() -> None:
    """Package, service, methods and field numbers of k8s.io/kubelet/pkg/apis/
    pluginregistration/v1 (api.proto), checked on encoded bytes."""
    service = reg.DESCRIPTOR.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    methods = {m.name: (m.input_type.full_name, m.output_type.full_name) for m in service.methods}
    assert methods == {
        "GetInfo": ("pluginregistration.InfoRequest", "pluginregistration.PluginInfo"),
        "NotifyRegistrationStatus": (
            "pluginregistration.RegistrationStatus",
            "pluginregistration.RegistrationStatusResponse",
        ),
    }
    info = reg.PluginInfo(type="CSIPlugin", name="t.io", endpoint="/e", supported_versions=["1"])
    assert info.SerializeToString() == (
        b"\x0a\x09CSIPlugin\x12\x04t.io\x1a\x02/e\x22\x011"
    )  # fields 1-4, length-delimited
    status = reg.RegistrationStatus.FromString(b"\x08\x00\x12\x03bad")  # bool 1, string 2
    assert (status.plugin_registered, status.error) == (False, "bad")
    assert reg.RegistrationStatus.FromString(b"\x08\x01").plugin_registered

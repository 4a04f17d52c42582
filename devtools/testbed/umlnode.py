"""A Kubernetes node played by a User-Mode Linux guest with its own disks and real LVM.

The guest boots with the host filesystem as root, gets a TAP link to the host inside the
caller's (private) network namespace, and runs ``devtools.testbed.agent``. Through the agent the
host creates VGs, starts ``topolvm node`` (embedded lvmd) against the real API server and reads
LVM and mount state; the CSI socket is reachable over TCP at ``csi_target``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devtools import uml
from devtools.testbed.controlplane import (
    API_PORT,
    ControlPlane,
    guest_address,
    host_address,
)
from devtools.testbed.process import HarnessError, http_get, kill_group, tail

REPO = Path(__file__).resolve().parents[2]
AGENT_PORT = 9000
CSI_PORT = 9100
CSI_SOCKET = "/run/topolvm/csi-topolvm.sock"
LVM = "/sbin/lvm"
GiB = 1 << 30


@dataclass
class Exec:
    rc: int
    stdout: str
    stderr: str


@dataclass
class UmlNode:
    """Start with :meth:`start`; ``index`` (from 1) picks the TAP link and the addresses."""

    name: str
    index: int
    workdir: Path
    disks: tuple[int, ...] = (16 * GiB, 16 * GiB)
    mem_mb: int = 768
    labels: dict[str, str] = field(default_factory=dict)  # extra Node labels
    lvmd_options: dict[str, Any] = field(default_factory=dict)  # more lvmd config keys
    system_disk: uml.Disk = 0  # a disk after the data disks for the node's system (0: none)
    routed: list[str] = field(default_factory=list)  # subnets the host routes to this guest
    kubelet: bool = False  # a real Kubernetes node: topolvm-node registers with its kubelet
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _boot: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)
    _images: Path | None = field(default=None, repr=False)
    # what spawn() started: name -> (argv, env); lvmd's sockets by daemon name
    _spawned: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict, repr=False)
    _sockets: dict[str, str] = field(default_factory=dict, repr=False)
    pids: dict[str, int] = field(default_factory=dict, repr=False)  # daemon name -> guest pid
    _boot_steps: list[list[str]] = field(default_factory=list, repr=False)

    @property
    def tap(self) -> str:
        return f"tltap{self.index}"

    @property
    def address(self) -> str:
        return guest_address(self.index)

    @property
    def csi_target(self) -> str:
        return f"{self.address}:{CSI_PORT}"

    @property
    def console(self) -> Path:
        return self.workdir / f"{self.name}.console.log"

    @property
    def disk_devices(self) -> list[str]:
        """The data disks (for VGs)."""
        return uml.disk_devices(len(self.disks))

    @property
    def system_device(self) -> str | None:
        """The system disk's device, after the data disks (see ``system_disk``)."""
        return uml.disk_devices(len(self.disks) + 1)[-1] if self.system_disk else None

    @property
    def spawned(self) -> list[str]:
        """The daemons :meth:`spawn` started, in order."""
        return list(self._spawned)

    def start(self, timeout: float = 120) -> UmlNode:
        self.workdir.mkdir(parents=True, exist_ok=True)
        host = host_address(self.index)
        try:
            _ip("tuntap", "add", "dev", self.tap, "mode", "tap")
            self._stack.callback(_ip, "link", "del", self.tap, check=False)
            _ip("addr", "add", f"{host}/24", "dev", self.tap)
            _ip("link", "set", self.tap, "up")
            for subnet in self.routed:  # the link goes, and its routes with it
                _ip("route", "add", subnet, "via", self.address, "dev", self.tap)
            self._images = self._stack.enter_context(uml.disk_folder())
            self._stack.callback(self._boot.close)
            self._power_on(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _power_on(self, timeout: float) -> None:
        agent = [
            sys.executable, "-m", "devtools.testbed.agent", f"--listen={self.address}",
            f"--port={AGENT_PORT}", f"--bridge={CSI_PORT}:{CSI_SOCKET}",
        ]  # fmt: skip
        self._proc = self._boot.enter_context(
            uml.running(
                agent,
                console=self.console,
                disks=(*self.disks, self.system_disk) if self.system_disk else self.disks,
                mem_mb=self.mem_mb,
                cwd=REPO,
                network=uml.Network(self.tap, f"{self.address}/24", host_address(self.index)),
                env={"TOPOLVM_NODE": self.name},
                images=self._images,
            )
        )
        try:  # a panic or an exited UML is reported at once, not after the timeout
            uml.wait_ready(self._proc, self.console, self._healthy, timeout)
        except uml.UmlError as exc:
            raise HarnessError(
                f"UML node {self.name}: agent not reachable: {exc}\nconsole "
                f"{self.console}:\n{tail(self.console)}"
            ) from exc

    def power_cycle(self, timeout: float = 120) -> str:
        """A power loss and a boot: UML is SIGKILLed (what the guest had not written to its
        disks is lost, its tmpfs /run with it), booted again on the same disks, its VGs'
        LVs activated (what the distribution's boot does: LVM autoactivation), and the
        daemons started by :meth:`spawn` started again in their order. Returns what the
        activation printed if an LV could not be activated ("" if all were): a boot goes on
        without that LV, and so does this."""
        if self._proc is not None:
            kill_group(self._proc.pid)
        self._boot.close()
        self._proc = None
        self._power_on(timeout)
        activation = self.exec(LVM, "vgchange", "-ay", check=False)
        self.exec("mkdir", "-p", "/run/topolvm")  # the chart's hostPath, DirectoryOrCreate
        for step in self._boot_steps:
            self.exec(*step)
        for name, (argv, env) in list(self._spawned.items()):
            self.spawn(name, argv, env)
            if name in self._sockets:
                self._wait_socket(name, self._sockets[name])
        return activation.stderr.strip() if activation.rc else ""

    def on_boot(self, argv: list[str]) -> None:
        """Run ``argv`` after every later boot (:meth:`power_cycle`), before the daemons."""
        self._boot_steps.append(argv)

    def stop(self) -> None:
        self._stack.close()
        self._boot.close()
        self._proc = None

    def _healthy(self) -> bool:
        return http_get(self._url("/healthz"), timeout=2) == b"ok"

    def _url(self, path: str) -> str:
        return f"http://{self.address}:{AGENT_PORT}{path}"

    def _call(self, path: str, body: dict[str, Any] | None = None, timeout: float = 180) -> Any:
        """A call to the guest agent; any error (from the agent or the link) raises
        :class:`HarnessError` with the agent's reason."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self._url(path), data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            raw = exc.read().decode(errors="replace")
            try:
                reason = json.loads(raw).get("error", raw)
            except ValueError:
                reason = raw
            raise HarnessError(f"{self.name}: agent {path}: HTTP {exc.code}: {reason}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise HarnessError(f"{self.name}: agent {path} unreachable: {exc}") from exc

    # --- commands and daemons -----------------------------------------------------------

    def exec(self, *argv: str, check: bool = True, timeout: float = 120) -> Exec:
        res = Exec(**self._call("/exec", {"argv": list(argv), "timeout": timeout}, timeout + 10))
        if check and res.rc != 0:
            raise HarnessError(f"{self.name}: {' '.join(argv)} exited {res.rc}: {res.stderr}")
        return res

    async def aexec(self, *argv: str, check: bool = True, timeout: float = 120) -> Exec:
        return await asyncio.to_thread(self.exec, *argv, check=check, timeout=timeout)

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        """Start a daemon in the guest; returns its process id there."""
        res = self._call("/spawn", {"name": name, "argv": argv, "env": env or {}})
        self._spawned[name] = (argv, env or {})
        self.pids[name] = int(res["pid"])
        return self.pids[name]

    def respawn(self, name: str) -> None:
        """Start a daemon that :meth:`spawn` started before (after it exited or was killed)
        with the same command; for lvmd, wait for its socket."""
        argv, env = self._spawned[name]
        if name in self._sockets:  # a killed lvmd leaves its socket file; wait for the new one
            self.exec("rm", "-f", self._sockets[name])
        self.spawn(name, argv, env)
        if name in self._sockets:
            self._wait_socket(name, self._sockets[name])

    def signal(self, name: str, sig: str = "SIGTERM", wait: float = 30) -> dict[str, Any]:
        res: dict[str, Any] = self._call("/signal", {"name": name, "signal": sig, "wait": wait})
        return res

    def daemon(self, name: str, lines: int = 60, timeout: float = 180) -> dict[str, Any]:
        """{"running", "rc", "log"}: the daemon's state and its last ``lines`` (0: all)."""
        res: dict[str, Any] = self._call(f"/daemon/{name}?lines={lines}", timeout=timeout)
        return res

    def memory_mb(self, name: str) -> dict[str, float]:
        """A running daemon's resident memory (``rss_mb``) and the private (anonymous) part of
        it (``private_mb``), from the guest's ``/proc/<pid>/smaps_rollup``."""
        rollup: dict[str, int] = {}
        text = self.exec("cat", f"/proc/{self.pids[name]}/smaps_rollup").stdout
        for line in text.splitlines()[1:]:
            key, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                rollup[key] = int(rest.split()[0])
        return {"rss_mb": round(rollup["Rss"] / 1024, 1),
                "private_mb": round(rollup["Anonymous"] / 1024, 1)}  # fmt: skip

    def http_get(self, port: int, path: str) -> str:
        """GET a guest daemon's HTTP endpoint (say, topolvm-node's /metrics on 8080)."""
        with urllib.request.urlopen(f"http://{self.address}:{port}{path}", timeout=10) as r:
            return str(r.read().decode())

    # --- LVM and topolvm-node -----------------------------------------------------------

    def lvm(self, *args: str, check: bool = True) -> str:
        return self.exec(LVM, *args, check=check).stdout

    def make_vg(self, vg: str, size_gib: float, disk: int = 0) -> None:
        """A VG named ``vg`` of ``size_gib`` on the guest's disk number ``disk``."""
        dev = self.disk_devices[disk]
        size = int(size_gib * GiB) // 512 * 512  # lvm takes whole sectors only
        self.lvm("pvcreate", "-ff", "-y", "--setphysicalvolumesize", f"{size}b", dev)
        self.lvm("vgcreate", "-s", "4m", vg, dev)

    def lvs(self, vg: str) -> dict[str, dict[str, str]]:
        out = self.lvm(
            "lvs", vg, "--reportformat", "json", "--units", "b", "--nosuffix",
            "-o", "lv_name,lv_size,lv_attr,origin,pool_lv",
        )  # fmt: skip
        return {r["lv_name"]: r for r in json.loads(out)["report"][0]["lv"]}

    def mounts(self) -> dict[str, dict[str, str]]:
        """Mount points in the guest: target -> {source, fstype}."""
        out = self.exec("findmnt", "-J", "-l", "-o", "TARGET,SOURCE,FSTYPE").stdout
        return {m["target"]: m for m in json.loads(out)["filesystems"]}

    def _config(self, name: str, device_classes: list[dict[str, Any]]) -> Path:
        folder = self.workdir / self.name
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / f"{name}-lvmd.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "socket-name": f"/run/topolvm/{name}-lvmd.sock",
                    "device-classes": device_classes,
                    "lvm-command-prefix": [LVM],
                    **self.lvmd_options,
                }
            )
        )
        self.exec("mkdir", "-p", "/run/topolvm")
        return config

    def start_lvmd(
        self, device_classes: list[dict[str, Any]], name: str = "lvmd", *extra: str
    ) -> str:
        """A separate ``topolvm lvmd`` daemon in the guest (``extra``: more of its flags, say
        ``--command-timeout=5``); returns its socket path."""
        config = self._config(name, device_classes)
        self.spawn(
            name,
            [sys.executable, "-m", "topolvm", "lvmd", f"--config={config}",
             "--metrics-bind-address=:8081", *extra],
        )  # fmt: skip
        socket = f"/run/topolvm/{name}-lvmd.sock"
        self.serves_on(name, socket)
        self._wait_socket(name, socket)
        return socket

    def serves_on(self, name: str, socket: str) -> None:
        """Daemon ``name`` is up once ``socket`` exists: after a power cycle the daemons after
        it in :meth:`spawn` order start only then (the kubelet needs containerd's socket)."""
        self._sockets[name] = socket

    def _wait_socket(self, name: str, socket: str) -> None:
        deadline = time.monotonic() + 60
        while self.exec("test", "-S", socket, check=False).rc != 0:
            if time.monotonic() > deadline or not self.daemon(name)["running"]:
                raise HarnessError(f"{self.name}: {name} did not start:\n"
                                   f"{self.daemon(name)['log']}")  # fmt: skip
            time.sleep(0.3)

    def start_topolvm_node(
        self,
        cp: ControlPlane,
        device_classes: list[dict[str, Any]],
        *extra: str,
        name: str = "topolvm-node",
        lvmd_socket: str | None = None,
        token: str | None = None,
        server: str | None = None,
    ) -> None:
        """``topolvm node`` for this node against the host's API server (or ``server``, say a
        fault proxy's URL): with lvmd embedded (``device_classes``), or using the lvmd at
        ``lvmd_socket``; as admin, or with ``token`` (a ServiceAccount's). On a Kubernetes node
        it registers itself with the kubelet."""
        folder = self.workdir / self.name
        folder.mkdir(parents=True, exist_ok=True)
        server = server or f"https://{host_address(self.index)}:{API_PORT}"
        kubeconfig = cp.write_kubeconfig(folder / f"kubeconfig-{name}", server, token)
        if lvmd_socket:
            self.exec("mkdir", "-p", "/run/topolvm")
            lvmd = [f"--lvmd-socket={lvmd_socket}"]
        else:
            lvmd = ["--embed-lvmd", f"--config={self._config(name, device_classes)}"]
        # the transfer port (docs/mobility.md): reached at the guest's address, and the account
        # whose tokens it makes (TokenRequest, bound to its Node) and accepts
        transfer = [
            f"--transfer-advertise-address={self.address}",
            f"--transfer-peer={':'.join(cp.transfer_account())}",
        ]
        argv = [
            sys.executable, "-m", "topolvm", "--log-format", "text", "node",
            f"--nodename={self.name}", *lvmd, f"--kubeconfig={kubeconfig}",
            f"--csi-socket={CSI_SOCKET}", "--metrics-bind-address=:8080",
            *(["--register-with-kubelet"] if self.kubelet else []), *transfer, *extra,
        ]  # fmt: skip
        self.spawn(name, argv)

    def stop_topolvm_node(self, name: str = "topolvm-node", sig: str = "SIGTERM") -> None:
        res = self.signal(name, sig, wait=60)
        if res.get("running"):
            self.signal(name, "SIGKILL", wait=10)

    def node_log(self, name: str = "topolvm-node", lines: int = 60, timeout: float = 180) -> str:
        return str(self.daemon(name, lines, timeout).get("log", ""))


def _ip(*args: str, check: bool = True) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise HarnessError(f"ip {' '.join(args)}: {proc.stderr.strip()}")

"""The test bed's control plane (and optionally Kubernetes nodes in UML guests with real LVM,
running the chart) by hand.

    python -m devtools.cluster up [--nodes N]   start it in network namespace topolvm-dev
    python -m devtools.cluster env              the KUBECONFIG and PATH lines to use it
    python -m devtools.cluster shell            a shell inside the namespace, ready for kubectl
    python -m devtools.cluster logs [NAME]      list the logs, or show one component's tail
    python -m devtools.cluster down             stop everything, delete the namespace

With ``--nodes N`` the nodes are real Kubernetes nodes (containerd, the kubelet, kube-proxy:
devtools/testbed/kubenode.py) and charts/topolvm is installed with helm as release ``topolvm``
in ``topolvm-system`` (devtools/testbed/chart.py: the test bed's image values, lvmd embedded in
topolvm-node, device class ``ssd`` on each node's ``vg1``); ``up`` returns once its pods run.
The snapshot CRDs and snapshot-controller run as cluster add-ons.

Everything runs inside the network namespace, the same set-up as the pytest fixture: reach it
with ``ip netns exec topolvm-dev ...`` (``shell`` does that for you). Run as root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from devtools import gobuild, nodeimages, umlkernel
from devtools.helm import helm
from devtools.testbed import chart, systemdisk
from devtools.testbed.bed import THICK, Testbed
from devtools.testbed.process import HarnessError, tail

NETNS = "topolvm-dev"
WORKDIR = gobuild.ROOT / ".cache" / "cluster"
STATE = WORKDIR / "state.json"
PIDFILE = WORKDIR / "serve.pid"  # the process group of `serve`
RELEASE, RELEASE_NS = "topolvm", "topolvm-system"
VALUES = {
    "lvmd": {"managed": False, "deviceClasses": [THICK]},
    "node": {"lvmdEmbedded": True},
    "controller": {"replicaCount": 1},
}


def _netns_exists() -> bool:
    return Path(f"/run/netns/{NETNS}").exists()


def up(nodes: int, vg_gib: float) -> int:
    if STATE.exists():
        print(f"already up ({STATE}); `python -m devtools.cluster down` first", file=sys.stderr)
        return 1
    gobuild.ensure()  # builds before entering the namespace (needs the module proxy)
    if nodes:
        umlkernel.kernel()  # and the nodes' kernel (its source comes from Debian's archive)
        systemdisk.template(nodeimages.all_images())  # their images (Debian's archive, PyPI)
        helm()  # (PyPI)
    if not _netns_exists():
        subprocess.run(["ip", "netns", "add", NETNS], check=True)
        subprocess.run(["ip", "netns", "exec", NETNS, "ip", "link", "set", "lo", "up"], check=True)
    WORKDIR.mkdir(parents=True, exist_ok=True)
    log = WORKDIR / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", NETNS, sys.executable, "-m", "devtools.cluster", "serve",
             f"--nodes={nodes}", f"--vg-gib={vg_gib}"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=gobuild.ROOT, start_new_session=True,
        )  # fmt: skip
    PIDFILE.write_text(str(proc.pid))
    what = f" and {nodes} Kubernetes nodes in UML, then the chart" if nodes else ""
    print(f"starting the control plane{what} ...")
    while not STATE.exists():
        if proc.poll() is not None:
            print(f"failed; {log}:\n{tail(log, 40)}", file=sys.stderr)
            subprocess.run(["ip", "netns", "delete", NETNS], check=False)
            return 1
        time.sleep(0.5)
    print(tail(log, 40))
    print()
    return env()


def serve(nodes: int, vg_gib: float) -> int:
    """Inside the namespace: start, write the state file, wait for SIGTERM, stop."""
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    bed = Testbed(WORKDIR, gobuild.ensure())
    t0 = time.monotonic()
    try:
        cp = bed.start_control_plane(crds=not nodes)  # else the chart installs the CRDs
        print(f"control plane up in {cp.started_in:.1f}s", flush=True)
        bed.start_snapshot_controller()
        print("add-ons: VolumeSnapshot CRDs, snapshot-controller", flush=True)
        for i in range(1, nodes + 1):
            node = bed.start_node(f"uml-{i}", i, vg_gib, kubelet=True, driver_images=True)
            print(f"Kubernetes node {node.name} at {node.address} Ready: vg1 {vg_gib} GiB, "
                  "containerd, kubelet, kube-proxy", flush=True)  # fmt: skip
        if nodes:
            release = chart.Release(cp, RELEASE, RELEASE_NS)
            release.install(chart.merged(VALUES, chart.testbed_values({})))
            pods = release.wait_running(nodes + 1, timeout=600)  # topolvm-node on each, controller
            print(f"helm release {RELEASE} in {RELEASE_NS}: {len(pods)} pods Running, "
                  f"{time.monotonic() - t0:.0f}s after the start", flush=True)  # fmt: skip
        print(cp.describe(), flush=True)
        STATE.write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "kubeconfig": str(cp.kubeconfig),
                    "bins": str(cp.bins["kubectl"].parent),
                    "nodes": [n.name for n in bed.nodes],
                }
            )
        )
        while not stop:
            time.sleep(0.5)
    except HarnessError as exc:
        print(f"error: {exc}", flush=True)
        return 1
    finally:
        bed.teardown(warn=lambda line: print(line, flush=True))
        STATE.unlink(missing_ok=True)
    return 0


def _state() -> dict[str, object] | None:
    try:
        state: dict[str, object] = json.loads(STATE.read_text())
        return state
    except (OSError, ValueError):
        return None


def env() -> int:
    state = _state()
    if state is None:
        print("not up: `python -m devtools.cluster up`", file=sys.stderr)
        return 1
    print(f"export KUBECONFIG={state['kubeconfig']}")
    print(f"export PATH={state['bins']}:$PATH")
    print(f"# the API server is inside network namespace {NETNS}; run commands there:")
    print(f"#   ip netns exec {NETNS} kubectl get nodes    (or: python -m devtools.cluster shell)")
    return 0


def shell() -> int:
    state = _state()
    if state is None:
        print("not up: `python -m devtools.cluster up`", file=sys.stderr)
        return 1
    environ = dict(os.environ, KUBECONFIG=str(state["kubeconfig"]))
    environ["PATH"] = f"{state['bins']}:{environ.get('PATH', '')}"
    environ["PS1"] = f"({NETNS}) \\w# "
    sh = os.environ.get("SHELL", "/bin/bash")
    return subprocess.run(["ip", "netns", "exec", NETNS, sh], env=environ, check=False).returncode


def logs(name: str | None) -> int:
    folder = WORKDIR / "controlplane" / "logs"
    files = sorted(folder.glob("*.log")) + sorted((WORKDIR / "nodes").glob("*.console.log"))
    files.append(WORKDIR / "serve.log")
    if name is None:
        for f in files:
            print(f)
        return 0
    match = [f for f in files if f.name.startswith(name)]
    if not match:
        print(f"no log for {name!r}; have: {', '.join(f.name for f in files)}", file=sys.stderr)
        return 1
    print(tail(match[0], 80))
    return 0


def down() -> int:
    """Stop `serve` (its whole process group; components die with it), then clean up."""
    try:
        pgid = int(PIDFILE.read_text())
    except (OSError, ValueError):
        pgid = 0
    if pgid:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        for _ in range(120):  # serve stops UML nodes and the control plane, then exits
            if not Path(f"/proc/{pgid}").exists():
                break
            time.sleep(0.5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    if _netns_exists():
        subprocess.run(["ip", "netns", "delete", NETNS], check=False)
    shutil.rmtree(WORKDIR, ignore_errors=True)
    print("down")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("up", "serve"):
        p = sub.add_parser(name)
        p.add_argument("--nodes", type=int, default=0, help="UML Kubernetes nodes (max 16)")
        p.add_argument("--vg-gib", type=float, default=10.0, help="size of each node's vg1")
    sub.add_parser("env")
    sub.add_parser("shell")
    sub.add_parser("down")
    lp = sub.add_parser("logs")
    lp.add_argument("name", nargs="?")
    args = parser.parse_args()
    if args.cmd == "up":
        return up(args.nodes, args.vg_gib)
    if args.cmd == "serve":
        return serve(args.nodes, args.vg_gib)
    if args.cmd == "env":
        return env()
    if args.cmd == "shell":
        return shell()
    if args.cmd == "logs":
        return logs(args.name)
    return down()


if __name__ == "__main__":
    sys.exit(main())

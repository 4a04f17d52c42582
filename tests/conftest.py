"""Shared fixtures. Tests marked ``uml`` run inside User-Mode Linux (see tests/uml_tier.py)."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from devtools import gobuild, nodeimages, umlkernel
from devtools.buildcache import BuildError
from devtools.testbed import process, systemdisk
from tests import uml_tier
from tests.cluster_fixtures import *  # noqa: F403  (fixtures for the real-control-plane tier)
from tests.cluster_fixtures import report_stats
from tests.lvm_fixtures import *  # noqa: F403  (fixtures for the real-LVM tier)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    if uml_tier.IN_UML:
        return
    uml_tier.proxy_items(items, by_share=uml_tier.WORKER is not None)
    if uml_tier.WORKER is not None:
        items.sort(key=_rank)


# The modules that take longest in make test (seconds on one worker, 2026-11-29), longest first:
# placed first, so that the other worker fills in beside them. A name that is gone only ranks
# nothing; a new long module belongs here.
LONGEST = (
    "tests/test_cluster_transfer.py",  # 600
    "tests/test_cluster_chaos.py",  # 409
    "tests/test_cluster_chart.py",  # 317
    "tests/test_cluster_faults.py",  # 271
    "tests/test_cluster_csi_sanity.py",  # 265
    "tests/test_cluster_faults_lvm.py",  # 200
    "tests/test_cluster_move_leftovers.py",  # 230 (2 rounds; 905 before the pre-pull skip)
    "tests/test_cluster_transfer_faults.py",  # 175
    "tests/test_cluster_burst.py",  # 160
    "tests/test_cluster_kubelet.py",  # 160
    "tests/test_cluster_provisioning.py",  # 157
    "tests/test_cluster_doctor_scale.py",  # 132
)


def _rank(item: pytest.Item) -> tuple[int, int]:
    """``make test``'s workers take modules in this order: the real-LVM tier's shares, the
    longest modules (LONGEST), the other real control plane and image modules, the host's
    quick ones last: no long module starts at the end."""
    if isinstance(item, uml_tier.UmlProxy):
        return 0, 0
    module = item.nodeid.split("::", 1)[0]
    if module in LONGEST:
        return 1, LONGEST.index(module)
    return (2 if item.get_closest_marker("cluster") or item.get_closest_marker("image") else 3), 0


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """A module at a time per worker, the real-LVM tier by guest's share."""
    from tests.xdist_scheduling import ModuleScheduling  # xdist only where it runs

    return ModuleScheduling(config, log)


def pytest_collection_finish(session: pytest.Session) -> None:
    """After deselection (``-m``): only a run that has ``cluster`` tests builds and isolates."""
    if not uml_tier.IN_UML and any(i.get_closest_marker("cluster") for i in session.items):
        _prepare_cluster_tier(session.config)


def _prepare_cluster_tier(config: pytest.Config) -> None:
    """Build the pinned Kubernetes binaries (needs the module proxy), then move this process
    into a private network namespace: every packet of the session stays inside it."""
    capman = config.pluginmanager.get_plugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        try:
            gobuild.ensure()  # every group: inside the namespace there is no module proxy
            umlkernel.kernel()  # the nodes' kernel (its source comes from Debian's archive)
            # the Kubernetes nodes' images (Debian's archive, PyPI) and their system disks
            systemdisk.template(nodeimages.workload_images())
            systemdisk.template(nodeimages.all_images())
        except BuildError as exc:
            raise pytest.UsageError(f"cannot build the real control plane: {exc}") from exc
    threads = os.listdir("/proc/self/task")
    # An xdist worker has one more thread, execnet's, which only passes the controller's
    # messages over the worker's pipes: it stays outside the namespace and sends no packet.
    allowed = 2 if uml_tier.WORKER is not None and threading.active_count() == 1 else 1
    if len(threads) > allowed:
        raise pytest.UsageError(
            f"the cluster tier must enter its network namespace while pytest has one thread "
            f"(found {len(threads)})"
        )
    try:
        process.enter_private_netns()
    except process.HarnessError as exc:
        raise pytest.UsageError(f"the cluster tier needs its own network namespace: {exc}") from exc


_worker_lines: list[str] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker hands its figures (control plane, chaos campaign) to the controller."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["topolvm_stats"] = report_stats() or ""


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    line = (getattr(node, "workeroutput", None) or {}).get("topolvm_stats")
    if line:
        _worker_lines.append(f"[{node.gateway.id}] {line}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in [report_stats(), *_worker_lines]:
        if line:
            terminalreporter.write_line(line)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if uml_tier.IN_UML:
        uml_tier.record(report)


@pytest.fixture(autouse=True)
def _hang_report() -> Iterator[None]:
    """If a test (with its teardown) runs for over 3 minutes (90 s in UML), print every pending
    asyncio task's stack, so a hang inside UML says where it is instead of only timing out the
    whole run."""
    # in UML before the host's stall watch (uml_tier.STALL_SECONDS) kills a silent guest, so a
    # test that hangs there says where before the guest goes
    default = "90" if uml_tier.IN_UML else "180"
    seconds = float(os.environ.get("TOPOLVM_HANG_SECONDS", default))
    timer = threading.Timer(seconds, _dump_tasks, args=(seconds,))
    timer.daemon = True
    timer.start()
    # A hang in C code that holds the GIL stops the timer too; faulthandler's watchdog is a C
    # thread that still dumps every Python thread's stack.
    faulthandler.dump_traceback_later(seconds + 5, file=sys.__stderr__ or sys.stderr)
    try:
        yield
    finally:
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()


def _dump_tasks(seconds: float) -> None:
    """The pending tasks' stacks, printed by each task's own loop: walking the frames of
    coroutines from this thread while the loop's thread runs them can crash the interpreter
    (a CI worker died at this report). A loop stuck in blocking code never prints them;
    faulthandler's dump, 5 s later, then shows every thread's stack."""
    out = sys.__stderr__
    tasks = [o for o in gc.get_objects() if isinstance(o, asyncio.Task) and not o.done()]
    print(f"\n=== test running for over {seconds:.0f} s; {len(tasks)} pending asyncio tasks ===",
          file=out)  # fmt: skip
    for loop in {task.get_loop() for task in tasks}:
        with contextlib.suppress(RuntimeError):  # closed meanwhile
            loop.call_soon_threadsafe(_print_stacks, loop)
    if uml_tier.IN_UML:  # a suspended device-mapper table hangs every LVM command and I/O
        try:
            dm = subprocess.run(
                ["dmsetup", "info", "-c"], check=False, capture_output=True, text=True, timeout=10
            )
            print(dm.stdout + dm.stderr, file=out)
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"dmsetup info: {e}", file=out)
    if out is not None:
        out.flush()


def _print_stacks(loop: asyncio.AbstractEventLoop) -> None:
    """In ``loop``'s thread, between its callbacks: no coroutine of it runs meanwhile."""
    out = sys.__stderr__
    for task in asyncio.all_tasks(loop):
        print(repr(task), file=out)
        try:
            task.print_stack(file=out)
        except Exception as e:  # a frame of compiled code (grpc's server) has no line number
            print(f"  (no stack: {type(e).__name__}: {e})", file=out)
    if out is not None:
        out.flush()

"""pytest plumbing for the real-LVM tier.

On the host, every test marked ``uml`` is replaced by a proxy item with the same node id, and
the proxies run first. The first proxy to run boots User-Mode Linux guests (one per host core, at
most 2, each with whole modules) and runs pytest inside them on all proxied node ids; the inner
runs write one JSON line per test phase, and each proxy then passes, skips or fails with the
inner report, so failures read like ordinary test failures.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools import uml

IN_UML = os.environ.get("TOPOLVM_IN_UML") == "1"
RESULTS_ENV = "TOPOLVM_UML_RESULTS"
REPO = Path(__file__).resolve().parent.parent
UML_TIMEOUT = 1500.0
# No new result line for this long means the guest stopped making progress (the slowest test
# phase takes well under a minute; in the stalls seen, not even faulthandler's watchdog printed,
# so waiting for the conftest hang report at 180 s only cost CI time).
STALL_SECONDS = float(os.environ.get("TOPOLVM_UML_STALL_SECONDS", "120"))
# Booting, starting pytest in the guest and collecting come before the first result line; on a
# loaded host that alone took more than a short STALL_SECONDS (CI, 2026-11-26), so it has its own.
BOOT_SECONDS = max(STALL_SECONDS, 300.0)
GUEST_SETTINGS = ("TOPOLVM_FUZZ_EXAMPLES", "TOPOLVM_HANG_SECONDS")
# Per share (None: the whole tier in one host process; a number: one xdist worker's share).
_results_key = pytest.StashKey[dict[int | None, dict[str, list[dict[str, Any]]]]]()
_error_key = pytest.StashKey[dict[int | None, str]]()
WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # set in a pytest-xdist worker (make test)
SHARE = "@uml-"  # a proxy's name ends in it and its share's number, under xdist
# Set when the host's run is interrupted (Ctrl-C): every running guest is then killed at its
# next progress check instead of running its share to the end.
_interrupted = threading.Event()


class UmlFailure(Exception):
    """The test failed inside UML; the message is the inner report."""


class UmlProxy(pytest.Item):
    """Stands for a ``uml`` test on the host and reports its result from inside UML."""

    def __init__(
        self, *, location: tuple[str, int | None, str], inner_id: str, share: int | None,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(**kwargs)
        self._location = location
        self.inner_id = inner_id  # the test's node id inside the guest
        self.share = share  # the guest's share it runs in (xdist), None: all in one process

    def reportinfo(self) -> tuple[str, int | None, str]:
        return self._location

    def runtest(self) -> None:
        results = _run_all(self.session, self.share)
        reports = results.get(self.inner_id)
        if not reports:
            error = self.session.stash.get(_error_key, {}).get(self.share, "")
            raise UmlFailure(f"no result from inside UML for {self.inner_id}\n{error}")
        failed = [r for r in reports if r["outcome"] == "failed"]
        if failed:
            text = "\n".join(f"[inside UML, {r['when']}]\n{r['longrepr']}" for r in failed)
            sections = "".join(
                f"\n----- {name} -----\n{content}"
                for r in failed
                for name, content in r["sections"]
            )
            raise UmlFailure(text + sections)
        skipped = [r for r in reports if r["outcome"] == "skipped"]
        if skipped:
            pytest.skip(f"inside UML: {skipped[0]['longrepr']}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, UmlFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


def proxy_items(items: list[pytest.Item], by_share: bool = False) -> None:
    """Replace ``uml`` items by proxies (host side), and run them first: the guests then have
    the host's cores to themselves, before the cluster tier's control plane (which runs for
    the rest of the session) is started. Behind it, in a full run, one guest took about 600 s
    for 72 of the tier's tests; first and in two guests, the whole tier takes about 175 s.

    ``by_share`` (a pytest-xdist worker, as ``make test`` runs): the tier is split into guests'
    shares up front, a proxy's name ending in its share (``...@uml-1``) that the scheduler
    (tests/xdist_scheduling.py) sends whole to one worker; each worker then boots one guest
    for one share, both at the start, as one process boots its guests side by side."""
    tier = [item for item in items if item.get_closest_marker("uml") is not None]
    others = [item for item in items if item.get_closest_marker("uml") is None]
    where: dict[str, int] = {}
    if by_share and tier:
        try:
            guests = guest_count(os.environ.get("TOPOLVM_UML_GUESTS"), os.cpu_count())
        except ValueError:  # reported by the run, with the tests
            guests = 1
        shares = shard([item.nodeid for item in tier], guests)
        where = {nodeid: i for i, share in enumerate(shares) for nodeid in share}
    proxies: list[UmlProxy] = []
    for item in tier:
        assert item.parent is not None
        share = where.get(item.nodeid)
        proxy = UmlProxy.from_parent(
            item.parent, name=item.name if share is None else f"{item.name}{SHARE}{share}",
            location=item.location, inner_id=item.nodeid, share=share,
        )  # fmt: skip
        proxy.own_markers.extend(m for m in item.own_markers if m.name != "parametrize")
        proxies.append(proxy)
    proxies.sort(key=lambda p: p.share or 0)
    items[:] = proxies + others


def share_of(nodeid: str) -> str | None:
    """The guest's share a proxy's node id names (``uml-1``), None for any other test."""
    _, sep, share = nodeid.rpartition(SHARE)
    return f"uml-{share}" if sep and share.isdigit() else None


def _run_all(session: pytest.Session, share: int | None) -> dict[str, list[dict[str, Any]]]:
    """Run the tier's tests (``share``: only that share's, in one guest) once; their results."""
    done = session.stash.setdefault(_results_key, {})
    if share in done:
        return done[share]
    errors_of = session.stash.setdefault(_error_key, {})
    nodeids = [
        item.inner_id
        for item in session.items
        if isinstance(item, UmlProxy) and item.share == share
    ]
    results: dict[str, list[dict[str, Any]]] = {}
    done[share] = results
    reason = uml.available()
    if reason:
        errors_of[share] = f"User-Mode Linux is not available: {reason}"
        return results
    try:
        guests = guest_count(os.environ.get("TOPOLVM_UML_GUESTS"), os.cpu_count())
    except ValueError as e:
        errors_of[share] = str(e)
        return results
    if share is not None:
        guests = 1
    (REPO / ".uml").mkdir(exist_ok=True)
    shards = shard(nodeids, guests)
    sizes = " + ".join(str(len(s)) for s in shards)
    where = f" in {len(shards)} guests ({sizes})" if len(shards) > 1 else ""
    _say(session, f"booting User-Mode Linux for {len(nodeids)} real-LVM tests{where}")
    # One guest runs on one host core (UML is uniprocessor): a guest per core runs the tier in
    # about half the time. Each guest has its own disks, memory file and results file.
    _interrupted.clear()
    with concurrent.futures.ThreadPoolExecutor(len(shards)) as pool:
        try:
            outcomes = list(pool.map(_run_shard_safely, shards))
        except BaseException:
            _interrupted.set()  # the pool's exit waits for the guests: make them stop now
            raise
    errors = []
    for shard_results, notes, error in outcomes:
        results.update(shard_results)
        for note in notes:
            _say(session, note)
        if error:
            errors.append(error)
    if errors:
        errors_of[share] = "\n".join(errors)
    return results


def guest_count(setting: str | None, cores: int | None) -> int:
    """How many guests run the tier side by side: ``TOPOLVM_UML_GUESTS`` if set, else one per
    host core (UML is uniprocessor), at most 2."""
    if setting is None or not setting.strip():
        return max(1, min(2, cores or 1))
    try:
        guests = int(setting)
    except ValueError:
        guests = 0
    if guests < 1:
        raise ValueError(
            f"TOPOLVM_UML_GUESTS must be a whole number of guests, 1 or more; got {setting!r}"
        )
    return guests


def shard(nodeids: list[str], guests: int) -> list[list[str]]:
    """Split ``nodeids`` over at most ``guests`` guests, whole modules each (their module
    fixtures stay in one guest), the largest modules first onto the guest with fewest tests."""
    modules: dict[str, list[str]] = {}
    for nodeid in nodeids:
        modules.setdefault(nodeid.split("::", 1)[0], []).append(nodeid)
    shards: list[list[str]] = [[] for _ in range(max(1, min(guests, len(modules))))]
    for tests in sorted(modules.values(), key=len, reverse=True):
        min(shards, key=len).extend(tests)
    order = {nodeid: i for i, nodeid in enumerate(nodeids)}
    return [sorted(s, key=order.__getitem__) for s in shards]


def _run_shard_safely(
    nodeids: list[str],
) -> tuple[dict[str, list[dict[str, Any]]], list[str], str]:
    """``_run_shard``, with a failure of the host-side plumbing turned into that shard's error:
    the other guest's results still count, and this shard's tests fail with the traceback."""
    try:
        return _run_shard(nodeids)
    except Exception:
        return {}, [], "running the guest failed on the host:\n" + traceback.format_exc()


def _run_shard(nodeids: list[str]) -> tuple[dict[str, list[dict[str, Any]]], list[str], str]:
    """One guest's share: a boot, and one more for the tests without a result if it stalled.
    Returns the results, lines to print, and an error for tests without a result."""
    results: dict[str, list[dict[str, Any]]] = {}
    notes: list[str] = []
    error = ""
    with tempfile.NamedTemporaryFile(
        "r", dir=REPO / ".uml", prefix="results-", suffix=".jsonl"
    ) as out:
        remaining = list(nodeids)
        for boot in (1, 2):
            started, booted = time.monotonic(), len(remaining)
            res = _boot(remaining, out.name)
            error = ""  # what the last boot left without a result
            for line in out:
                rec = json.loads(line)
                results.setdefault(rec["nodeid"], []).append(rec)
            done = {n for n, recs in results.items() if any(r["when"] == "teardown" for r in recs)}
            remaining = [n for n in remaining if n not in done]
            if isinstance(res, uml.UmlError):
                error = str(res)
            elif res.returncode not in (0, 1):
                error = f"inner pytest exit {res.returncode}:\n{res.console[-6000:]}"
            else:
                tail = res.console.strip().splitlines()[-1:] or [""]
                notes.append(
                    f"UML run of {booted} tests finished in {time.monotonic() - started:.0f}s"
                    f" (inner pytest exit {res.returncode}): {tail[0]}"
                )
            if _interrupted.is_set():
                error = "the run was interrupted; the guest was killed"
                break
            if not isinstance(res, uml.UmlStalled) or not remaining or boot == 2:
                break
            # The guest stopped making progress (seen rarely, inside a test's teardown; the
            # cause is not found): boot once more for the tests without a result, and say so.
            stuck = remaining[0]
            notes.append("the guest's last output:\n" + res.console[-5000:])
            notes.append(
                f"WARNING: the UML guest made no progress for {STALL_SECONDS:.0f}s during "
                f"{stuck} ({[r['when'] for r in results.get(stuck, [])] or ['setup']} done); "
                f"killed it, booting again for the {len(remaining)} tests without a result"
            )
            for n in remaining:
                results.pop(n, None)
            notes.append(f"booting User-Mode Linux for {len(remaining)} real-LVM tests")
    return results, notes, error


def _boot(nodeids: list[str], results_file: str) -> uml.UmlResult | uml.UmlError:
    """One UML boot running pytest on ``nodeids``; returns the result or the UmlError."""
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "addopts=",
        "--basetemp=/run/tmp/pytest-uml", *nodeids,
    ]  # fmt: skip
    started = time.monotonic()
    progress = {"size": os.path.getsize(results_file), "at": started}

    def stalled() -> bool:
        if _interrupted.is_set():
            return True
        size = os.path.getsize(results_file)
        now = time.monotonic()
        if size != progress["size"]:
            progress.update(size=size, at=now)
        if progress["at"] == started:  # no result yet from this boot
            return now - started > BOOT_SECONDS
        return now - progress["at"] > STALL_SECONDS

    # The guest gets a clean environment; these settings of the host's run go in with it.
    passed_on = {k: v for k, v in os.environ.items() if k in GUEST_SETTINGS}
    try:
        return uml.run(
            command, env={RESULTS_ENV: results_file, **passed_on}, cwd=REPO, capture=True,
            timeout=UML_TIMEOUT, stalled=stalled,
        )  # fmt: skip
    except uml.UmlError as e:
        return e


def _say(session: pytest.Session, line: str) -> None:
    """Print to the terminal even while pytest captures the running test's output (an xdist
    worker's terminal writes to /dev/null: it writes to stderr, which is the run's)."""
    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    capman = session.config.pluginmanager.get_plugin("capturemanager")
    if capman is None or (terminal is None and WORKER is None):
        return
    with capman.global_and_fixture_disabled():
        if terminal is None or WORKER is not None:
            print(f"\n[{WORKER}] {line}", file=sys.stderr, flush=True)
        else:
            terminal.write_line(f"\n{line}")


def record(report: pytest.TestReport) -> None:
    """Inside UML: append one phase's result for the host."""
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    if report.skipped and isinstance(report.longrepr, tuple):
        longrepr = str(report.longrepr[2])
    else:
        longrepr = str(report.longrepr) if report.longrepr else ""
    rec = {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "longrepr": longrepr,
        "duration": report.duration,
        "sections": [list(s) for s in report.sections] if report.failed else [],
    }
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def guest_disks() -> Iterator[str]:
    yield from os.environ.get("TOPOLVM_UML_DISKS", "").split()

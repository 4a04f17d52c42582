"""What the test bed's builders share (devtools.gobuild for the Go tools, devtools.umlkernel for
the User-Mode Linux kernel, devtools.image_base and devtools.image_app for the image's Debian
layer and wheels): a folder per build, named by a hash of its inputs, built once under
a lock into a ``.partial`` folder that is renamed when complete; older builds of the same thing
pruned; a long build shows progress on stderr, since stdout carries only the results' paths."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TextIO

COMPLETE = ".complete"


class BuildError(RuntimeError):
    """A build failed; the message carries the command and the tail of its output."""


def say(line: str = "", stream: TextIO | None = None) -> None:
    """One line for a person, at once. A build's progress goes to stderr (the default): stdout
    carries only the built files' paths. The demos tell their story on ``stream=sys.stdout``."""
    print(line, file=sys.stderr if stream is None else stream, flush=True)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created if missing) against other processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def cached_build(
    out: Path,
    build: Callable[[Path], None],
    *,
    kind: str,
    keep: int = 0,
    rebuild: bool = False,
) -> Path:
    """Return ``out``, first running ``build(partial)`` to fill it if it is not complete (or if
    ``rebuild``: a complete ``out`` then stays until the new build replaces it).

    ``out`` is named ``<kind>-<12 hex digits hashing the inputs>``; once it is complete, every
    other folder so named beside it (a build of earlier inputs) is removed but the ``keep``
    newest. A lock serialises builds of the same kind from other processes (another clone's
    session, say)."""
    if (out / COMPLETE).exists() and not rebuild:
        return out
    ours = re.compile(rf"{re.escape(kind)}-[0-9a-f]{{12}}(\.partial)?")
    if not ours.fullmatch(out.name):
        raise ValueError(f"{out.name}: not named <kind>-<12 hex digits>")
    with locked(out.parent / f".{kind}.lock"):
        if (out / COMPLETE).exists() and not rebuild:
            return out
        tmp = out.with_name(out.name + ".partial")
        for stale in out.parent.glob(f"{kind}-*.partial"):  # a build that was killed
            if ours.fullmatch(stale.name):
                shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            build(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        (tmp / COMPLETE).write_text(json.dumps({"built": time.time()}))
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        older = [
            old
            for old in out.parent.glob(f"{kind}-*")
            if old != out and old.is_dir() and ours.fullmatch(old.name)
        ]
        older.sort(key=lambda old: old.stat().st_mtime, reverse=True)
        for old in older[keep:]:
            shutil.rmtree(old, ignore_errors=True)
    return out


def run_with_progress(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None,
    label: str,
    counted: Callable[[str], bool],
    unit: str,
) -> None:
    """Run ``argv``; every 15 s say how many output lines ``counted`` (``unit`` done so far).
    A non-zero exit raises :class:`BuildError` with the output's last 30 lines."""
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env) if env is not None else dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    lines: list[str] = []
    count = 0
    done = threading.Event()

    def ticker() -> None:
        while not done.wait(15):
            say(f"{label}: {count} {unit}, {time.monotonic() - start:.0f}s")

    t = threading.Thread(target=ticker, daemon=True)
    t.start()
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip()
            count += counted(line)
            lines.append(line)
            del lines[:-200]
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        done.set()
        t.join()  # no thread outlives the build (pytest then enters its network namespace)
    if rc != 0:
        tail = "\n".join(lines[-30:])
        raise BuildError(f"{label}: `{' '.join(argv)}` exited {rc} in {cwd}:\n{tail}")
    say(f"{label}: done in {time.monotonic() - start:.0f}s")

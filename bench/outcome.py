"""How a bench that runs a test bed ends: its failures and Ctrl-C told with where the logs are
kept, its results written as JSON; and where a bench's large files go."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devtools import gobuild
from devtools.testbed.process import HarnessError

SHM = Path("/dev/shm")


def run_kept(workdir: Path, run: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any] | None, int]:
    """``run()``'s results and exit status 0; on a harness failure or Ctrl-C (its test bed
    cleaned up, its logs kept in ``workdir``), None and the exit status (1 or 130)."""
    try:
        return run(), 0
    except HarnessError as exc:
        print(f"error: {exc}\nlogs kept in {workdir}", file=sys.stderr)
        return None, 1
    except KeyboardInterrupt:
        print(f"interrupted; cleaned up, logs kept in {workdir}", file=sys.stderr)
        return None, 130


def save(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {path}")


def memory_or_cache(need: int, *under: str) -> Path:
    """Memory (/dev/shm) when it has more than ``need`` bytes free, else ``.cache/<under>`` of
    the checkout (made if missing): a bench whose files memory cannot hold with room to spare
    would swap the host (and its guests) to a halt."""
    if SHM.is_dir() and shutil.disk_usage(SHM).free > need:
        return SHM
    folder = gobuild.ROOT.joinpath(".cache", *under)
    folder.mkdir(parents=True, exist_ok=True)  # a fresh clone has none yet
    return folder

"""How a bench that runs a test bed ends: its failures and Ctrl-C told with where the logs are
kept, its results written as JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devtools.testbed.process import HarnessError


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

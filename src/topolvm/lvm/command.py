"""Running LVM commands: no shell, validated argv, LC_ALL=C, timeouts, stderr kept in errors."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from topolvm.lvm.errors import LvmError, LvmTimeout, ReportError
from topolvm.process import CommandTimedOut, run_captured, run_lines

log = logging.getLogger(__name__)

DEFAULT_PREFIX = ("/usr/bin/nsenter", "-m", "-u", "-i", "-n", "-p", "-t", "1", "/sbin/lvm")
DEFAULT_TIMEOUT = 120.0


class LvmRunner:
    """Executes ``<prefix> <subcommand> <args>`` and returns stdout.

    The prefix comes from configuration (``lvm-command-prefix``); every other argument is built by
    the callers from validated values. Commands are never run through a shell.
    """

    def __init__(self, prefix: Sequence[str] = DEFAULT_PREFIX, timeout: float = DEFAULT_TIMEOUT):
        if not prefix:
            raise ValueError("the LVM command prefix must name the lvm binary")
        self.prefix = tuple(prefix)
        self.timeout = timeout
        self._env = dict(os.environ, LC_ALL="C")
        self.calls = 0  # commands started, for diagnostics and tests

    async def run(self, *args: str, timeout: float | None = None) -> str:
        argv = [*self.prefix, *args]
        limit = self.timeout if timeout is None else timeout
        self.calls += 1
        started = time.monotonic()
        try:
            rc, out, err = await run_captured(argv, limit, self._env)
        except CommandTimedOut as e:
            raise LvmTimeout(
                argv,
                None,
                e.stderr.decode(errors="replace"),
                f"timed out after {limit}s {e.reason}",
            ) from None
        elapsed = time.monotonic() - started
        stderr = err.decode(errors="replace")
        if rc != 0:
            log.debug("lvm failed", extra={"argv": argv, "rc": rc, "secs": elapsed})
            raise LvmError(argv, rc, stderr)
        log.debug("lvm ok", extra={"argv": argv, "secs": round(elapsed, 4)})
        return out.decode(errors="replace")

    def tool_argv(self, tool: str, *args: str) -> list[str]:
        """Another device-mapper tool (``dmsetup``, ``thin_dump``) run the way LVM is: the
        prefix without its last word (the lvm binary), so ``nsenter ... /sbin/lvm`` runs
        ``nsenter ... dmsetup`` in the host's namespaces, found on ``PATH`` there."""
        return [*self.prefix[:-1], tool, *args]

    async def run_tool(self, tool: str, *args: str) -> str:
        argv = self.tool_argv(tool, *args)
        self.calls += 1
        try:
            rc, out, err = await run_captured(argv, self.timeout, self._env)
        except CommandTimedOut as e:
            raise LvmTimeout(argv, None, e.stderr.decode(errors="replace"),
                             f"timed out after {self.timeout}s {e.reason}") from None  # fmt: skip
        except OSError as e:
            raise LvmError(argv, None, "", f"cannot run {tool}: {e}") from e
        if rc != 0:
            raise LvmError(argv, rc, err.decode(errors="replace"))
        return out.decode(errors="replace")

    async def tool_lines(self, tool: str, *args: str, on_line: Callable[[bytes], None]) -> None:
        """Run a read-only tool, its stdout handed to ``on_line`` a line at a time."""
        argv = self.tool_argv(tool, *args)
        self.calls += 1
        try:
            rc, err = await run_lines(argv, self.timeout, self._env, on_line)
        except CommandTimedOut as e:
            reason = f"timed out after {self.timeout}s and was killed"
            raise LvmTimeout(argv, None, e.stderr.decode(errors="replace"), reason) from None
        except OSError as e:
            raise LvmError(argv, None, "", f"cannot run {tool}: {e}") from e
        if rc != 0:
            raise LvmError(argv, rc, err.decode(errors="replace"))

    async def report(self, *args: str) -> dict[str, Any]:
        """Run a reporting command with JSON output and return the decoded document."""
        out = await self.run(*args, "--reportformat", "json", "--units", "b", "--nosuffix")
        try:
            doc = json.loads(out)
        except json.JSONDecodeError as e:
            raise ReportError(f"lvm {args[0]} printed invalid JSON: {e}: {out[:200]!r}") from e
        if not isinstance(doc, dict):
            raise ReportError(f"lvm {args[0]} printed JSON that is not an object")
        return doc

"""The host's nudge of a UML guest's timers (docs/testing.md, "When the UML guest stops making
progress")."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

from devtools.testbed.process import in_signal_mask

TIMER_NUDGE_SECONDS = 1.0


class TimerNudge:
    """Sends UML's kernel process a SIGALRM every :data:`TIMER_NUDGE_SECONDS` while it runs.

    A UML guest's timers sometimes stop for good: its one-shot host timer is never programmed
    again, expired hrtimers stay queued (``/proc/timer_list`` shows them in the past), and
    only I/O interrupts still drive the guest, so every sleep hangs (containerd hung with a CNI
    plugin waiting for its stdin; the real-LVM tier's "stalls"). The cause inside UML 6.12 is
    not found (docs/testing.md). A SIGALRM is what the host timer would have sent: UML runs
    its timer interrupt, handles what expired and programs the next event. One more timer
    interrupt than due costs nothing: the handler finds nothing expired. It is sent only once
    UML catches SIGALRM (before that, the signal would kill it)."""

    def __init__(self, unshare_pid: int) -> None:
        self.unshare_pid = unshare_pid  # UML runs as its child (a PID namespace of its own)
        self.pid: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="uml-timer-nudge", daemon=True)

    def __enter__(self) -> TimerNudge:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    @staticmethod
    def _catches_alarm(pid: int) -> bool:
        return in_signal_mask(pid, signal.SIGALRM, "SigCgt")

    def _kernel(self) -> int | None:
        """UML's kernel process: the child of ``unshare`` that catches SIGALRM."""
        path = Path(f"/proc/{self.unshare_pid}/task/{self.unshare_pid}/children")
        try:
            children = [int(p) for p in path.read_text().split()]
        except (OSError, ValueError):
            return None
        return next((c for c in children if self._catches_alarm(c)), None)

    def _run(self) -> None:
        while not self._stop.wait(TIMER_NUDGE_SECONDS):
            self.pid = self.pid or self._kernel()
            if self.pid is not None and self._catches_alarm(self.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGALRM)

"""Following a VolumeMove until it is done: a poll every second, shown as a progress bar on a
terminal or as one line per phase change."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, TextIO

from lightkube import AsyncClient

from topolvm.constants import Names
from topolvm.k8s import errors as kube
from topolvm.k8s.moveobject import VolumeMoveObject
from topolvm.ops import cluster
from topolvm.ops.render import percent, progress_line

POLL_SECONDS = 1.0


class Display(Protocol):
    def update(self, move: VolumeMoveObject) -> None: ...

    def note(self, text: str) -> None: ...

    def close(self) -> None: ...


class LineDisplay:
    """One line per phase change, with its message (logs, pipes); none with ``out`` None."""

    def __init__(self, out: TextIO | None, prefix: str = "") -> None:
        self.out, self.prefix, self.phase = out, prefix, ""

    def update(self, move: VolumeMoveObject) -> None:
        if move.status.phase != self.phase:
            self.phase = move.status.phase
            self.note(progress_line(move.status, self.prefix))

    def note(self, text: str) -> None:
        if self.out is not None:
            print(text, file=self.out, flush=True)

    def close(self) -> None:
        pass


class BarDisplay:
    """A progress bar (tqdm) of the copy in hand; phase changes are printed above it."""

    def __init__(self, out: TextIO) -> None:
        from tqdm import tqdm  # type: ignore[import-untyped]

        self.phase = ""
        self.bar: Any = tqdm(
            total=100, file=out, leave=False, dynamic_ncols=True,
            bar_format="{desc} {percentage:3.0f}%|{bar}| {elapsed}",
        )  # fmt: skip

    def update(self, move: VolumeMoveObject) -> None:
        status = move.status
        if status.phase != self.phase:
            self.phase = status.phase
            self.note(progress_line(status))
            self.bar.set_description_str(status.phase, refresh=False)
        pct = percent(status.done_bytes, status.total_bytes)
        self.bar.n = round(pct or 0.0, 1)
        self.bar.refresh()

    def note(self, text: str) -> None:
        self.bar.write(text, file=self.bar.fp)

    def close(self) -> None:
        self.bar.close()


class Timeout(Exception):
    """The move was not done in time (it goes on)."""

    def __init__(self, move: VolumeMoveObject | None) -> None:
        super().__init__("timed out")
        self.move = move


async def follow(
    client: AsyncClient, names: Names, namespace: str, name: str, display: Display,
    timeout: float | None = None,
) -> VolumeMoveObject | None:  # fmt: skip
    """Poll the VolumeMove until its phase is done; None when it was deleted. A passing
    failure to read is noted and retried; :class:`Timeout` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    move: VolumeMoveObject | None = None
    failing = False
    while True:
        try:
            move = await cluster.get_move(client, names, namespace, name)
            failing = False
        except kube.KubeError as e:
            if not kube.is_transient(e):
                raise
            if not failing:
                display.note(f"cannot read VolumeMove {namespace}/{name}: {e}; retrying")
            failing = True
        else:
            if move is None:
                return None
            display.update(move)
            if move.done:
                return move
        if deadline is not None and loop.time() >= deadline:
            raise Timeout(move)
        await asyncio.sleep(POLL_SECONDS)

"""A thin pool's components left active on their own, and the one retry that clears them.

An LVM command killed while it held a thin pool (lvmd SIGKILLed mid-``lvcreate``, seen in the
crash campaign: docs/reliability.md) can leave the pool's ``_tmeta`` or ``_tdata`` active alone.
LVM then refuses every activation of the pool and every thin resize ("Activation of logical
volume vg/pool is prohibited while logical volume vg/pool_tmeta is active") until they are
deactivated. Only this pool's components are ever touched.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from topolvm.lvm.errors import LvmError

log = logging.getLogger(__name__)

Run = Callable[..., Awaitable[str]]


def components(vg: str, thin_pool: str) -> tuple[str, str]:
    """``vg/lv`` names of a thin pool's metadata and data components."""
    return f"{vg}/{thin_pool}_tmeta", f"{vg}/{thin_pool}_tdata"


async def run_on_pool(run: Run, vg: str, thin_pool: str | None, argv: Sequence[str]) -> None:
    """Run ``argv``, a command that needs the pool active. Refused because a component of this
    thin pool is active on its own: deactivate both components and run it once more. The caller
    sees LVM's first refusal if the deactivation fails, else the retry's own error (chained to
    the refusal), so ``no_space`` and ``already exists`` keep their meaning."""
    try:
        await run(*argv)
        return
    except LvmError as e:
        if thin_pool is None or not e.component_active:
            raise
        ours = components(vg, thin_pool)
        if e.active_component not in (None, *ours):
            raise
        refusal = e
    log.warning(
        "a component of the thin pool was active on its own; deactivating it and retrying",
        extra={"components": ours, "argv": refusal.argv, "stderr": refusal.stderr},
    )
    try:
        await run("lvchange", "-an", *ours)
    except LvmError as undo:
        log.error(
            "could not deactivate the thin pool's components; the command stays refused",
            extra={"components": ours, "stderr": undo.stderr},
        )
        raise refusal from undo
    try:
        await run(*argv)
    except LvmError as again:
        log.error(
            "the command failed again after the pool's components were deactivated",
            extra={"argv": again.argv, "stderr": again.stderr, "first": refusal.stderr},
        )
        raise again from refusal

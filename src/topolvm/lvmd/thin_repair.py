"""Thin pools that an interrupted LVM command left inconsistent (the crash campaign found both:
docs/reliability.md), and what lvmd does about them. Only the pool at hand is ever touched.

- A component left active alone: an LVM command killed while it held the pool (lvmd SIGKILLed
  mid-``lvcreate``) can leave the pool's ``_tmeta`` or ``_tdata`` active on its own. LVM then
  refuses every activation of the pool and every thin resize ("Activation of logical volume
  vg/pool is prohibited while logical volume vg/pool_tmeta is active") until they are
  deactivated: :func:`run_on_pool` does that and runs the command once more.
- A thin volume the pool lost: power lost during a thin ``lvcreate`` can leave LVM's metadata
  with the new volume while the pool's own metadata never got its thin device. Activating it
  fails ("reload ioctl ... failed: No data available", ENODATA); with the pool healthy, the
  volume has no thin device and so no data: when a create of its name finds it
  (:func:`lost_thin`), lvmd removes it and creates it again.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence

from topolvm.lvm.errors import LvmError
from topolvm.lvm.report import LvRecord

log = logging.getLogger(__name__)

Run = Callable[..., Awaitable[str]]
# The thin target's answer when its pool has no thin device of the id LVM gives it (ENODATA).
# The kernel also says ENODATA for an unreadable metadata block, which puts the pool in a
# failed or read-only mode: the pool's health must be clean too (:func:`lost_thin`).
_NO_THIN_DEVICE = re.compile(r"reload ioctl on .*failed: No data available")


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
        log.warning(  # the caller decides (an existing LV, no space): not always an error
            "the command failed again after the pool's components were deactivated",
            extra={"argv": again.argv, "stderr": again.stderr, "first": refusal.stderr},
        )
        raise again from refusal


def inactive_thin(lv: LvRecord, thin_pool: str) -> bool:
    """``lv`` is a thin volume of ``thin_pool`` that is not active (as LVM last reported it;
    a record lvmd made itself carries no attributes and is never taken for one)."""
    return lv.is_thin_volume and lv.pool_lv == thin_pool and lv.attr[4:5] != "a"


async def lost_thin(run: Run, lv: LvRecord) -> bool:
    """Activate ``lv``, an :func:`inactive_thin` volume found by a create of its name. True
    when its pool lost it: the activation's reload answered ENODATA and the pool reports a
    clean health (not failed, read-only or needing a check). Any other failure is raised: the
    create must neither report a volume that cannot be used nor remove one that may hold data."""
    try:
        await run_on_pool(run, lv.vg_name, lv.pool_lv, ["lvchange", "-ay", "-K", lv.full_name])
        return False
    except LvmError as e:
        if not any(
            _NO_THIN_DEVICE.search(line) and not line.lstrip().startswith("WARNING:")
            for line in e.stderr.splitlines()
        ):
            raise
        lost = e
    pool = f"{lv.vg_name}/{lv.pool_lv}"
    health = (await run("lvs", "--noheadings", "-o", "lv_health_status", pool)).strip()
    if health:
        log.error(
            "a thin volume could not be activated and its pool is not healthy: the volume is "
            "kept (repair the pool: lvconvert --repair)",
            extra={"lv": lv.full_name, "pool": pool, "health": health, "stderr": lost.stderr},
        )
        raise lost
    log.warning(
        "the thin pool has no thin device for this volume (its creation never reached the "
        "pool's metadata, e.g. power lost mid-create): removing it to create it again",
        extra={"lv": lv.full_name, "pool": pool, "stderr": lost.stderr},
    )
    return True

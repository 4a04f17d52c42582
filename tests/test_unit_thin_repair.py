"""Thin pools left inconsistent by a killed LVM command (topolvm.lvmd.thin_repair): the retry
that clears a component left active alone, and a thin volume the pool lost."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from topolvm.lvm.errors import LvmError
from topolvm.lvm.report import LvRecord
from topolvm.lvmd.thin_repair import inactive_thin, lost_thin, run_on_pool

REFUSED = (
    "  Activation of logical volume vg1/pool0 is prohibited while logical volume "
    "vg1/pool0_tmeta is active.\n"
)
OTHER_POOL = REFUSED.replace("pool0_tmeta", "pool9_tmeta")
NO_SPACE = '  Volume group "vg1" has insufficient free space (10 extents): 20 required.\n'
CREATE = ("lvcreate", "-T", "vg1/pool0", "-n", "lv1", "-V", "1g")


class Out(str):
    """A scripted answer that succeeds and prints this."""


class Lvm:
    """Answers each command with the next scripted answer (an :class:`Out`, or a stderr that
    fails the command; "" succeeds), and records the argv."""

    def __init__(self, answers: Iterable[str]):
        self.answers = list(answers)
        self.calls: list[tuple[str, ...]] = []

    async def run(self, *argv: str) -> str:
        self.calls.append(argv)
        answer = self.answers.pop(0)
        if isinstance(answer, Out):
            return str(answer)
        if answer:
            raise LvmError(argv, 5, answer)
        return ""


DEACTIVATE = ("lvchange", "-an", "vg1/pool0_tmeta", "vg1/pool0_tdata")


async def test_the_components_are_deactivated_and_the_command_run_once_more() -> None:
    lvm = Lvm([REFUSED, "", ""])
    await run_on_pool(lvm.run, "vg1", "pool0", CREATE)
    assert lvm.calls == [CREATE, DEACTIVATE, CREATE]


async def test_another_pools_component_or_a_linear_class_is_left_alone() -> None:
    lvm = Lvm([OTHER_POOL])
    with pytest.raises(LvmError, match="pool9_tmeta"):
        await run_on_pool(lvm.run, "vg1", "pool0", CREATE)
    assert lvm.calls == [CREATE]
    lvm = Lvm([REFUSED])
    with pytest.raises(LvmError):
        await run_on_pool(lvm.run, "vg1", None, CREATE)
    assert lvm.calls == [CREATE]


async def test_another_failure_is_not_retried() -> None:
    lvm = Lvm([NO_SPACE])
    with pytest.raises(LvmError) as e:
        await run_on_pool(lvm.run, "vg1", "pool0", CREATE)
    assert e.value.no_space and lvm.calls == [CREATE]


async def test_a_failed_retry_raises_its_own_error_chained_to_the_refusal() -> None:
    lvm = Lvm([REFUSED, "", NO_SPACE])
    with pytest.raises(LvmError) as e:
        await run_on_pool(lvm.run, "vg1", "pool0", CREATE)
    assert e.value.no_space  # the caller still maps it to ResourceExhausted
    assert isinstance(e.value.__cause__, LvmError) and e.value.__cause__.component_active
    assert lvm.calls == [CREATE, DEACTIVATE, CREATE]


async def test_a_failed_deactivation_leaves_the_refusal_as_the_error() -> None:
    lvm = Lvm([REFUSED, "  Logical volume vg1/pool0_tmeta in use.\n"])
    with pytest.raises(LvmError) as e:
        await run_on_pool(lvm.run, "vg1", "pool0", CREATE)
    assert e.value.component_active and e.value.argv == list(CREATE)
    assert isinstance(e.value.__cause__, LvmError) and "in use" in e.value.__cause__.stderr
    assert lvm.calls == [CREATE, DEACTIVATE]


def thin(attr: str) -> LvRecord:
    return LvRecord(
        name="lv1", vg_name="vg1", uuid="", path="/dev/vg1/lv1", size=1 << 30, major=0,
        minor=0, origin="", pool_lv="pool0", tags=("",), attr=attr,
    )  # fmt: skip


LOST = (
    "  device-mapper: reload ioctl on  (253:9) failed: No data available\n  Failed to resume lv1.\n"
)
ACTIVATE = ("lvchange", "-ay", "-K", "vg1/lv1")


HEALTH = ("lvs", "--noheadings", "-o", "lv_health_status", "vg1/pool0")


async def test_a_thin_volume_the_pool_lost_is_named_lost() -> None:
    lvm = Lvm([LOST, Out("  \n")])
    assert await lost_thin(lvm.run, thin("Vwi---tz--"))
    assert lvm.calls == [ACTIVATE, HEALTH]


async def test_enodata_from_an_unhealthy_pool_keeps_the_volume() -> None:
    """ENODATA is also the kernel's word for an unreadable metadata block: a volume whose pool
    needs a check or failed may hold data, so it is never taken for lost."""
    for health in ("needs_check", "failed", "metadata_read_only"):
        lvm = Lvm([LOST, Out(f"  {health}\n")])
        with pytest.raises(LvmError, match="No data available"):
            await lost_thin(lvm.run, thin("Vwi---tz--"))
    lvm = Lvm(["  WARNING: reload ioctl on (253:9) failed: No data available\n  Failed.\n"])
    with pytest.raises(LvmError):  # a warning line is not the activation's answer
        await lost_thin(lvm.run, thin("Vwi---tz--"))
    assert lvm.calls == [ACTIVATE]


def test_only_an_inactive_thin_volume_of_the_pool_is_looked_at() -> None:
    assert inactive_thin(thin("Vwi---tz--"), "pool0")
    assert not inactive_thin(thin("Vwi-a-tz--"), "pool0")  # active
    assert not inactive_thin(thin("Vwi---tz--"), "pool9")  # another pool's
    assert not inactive_thin(thin("-wi-------"), "pool0")  # not thin
    assert not inactive_thin(thin(""), "pool0")  # lvmd's own record: no attributes yet


async def test_a_volume_that_activates_is_kept() -> None:
    lvm = Lvm([""])
    assert not await lost_thin(lvm.run, thin("Vwi---tz--"))
    assert lvm.calls == [ACTIVATE]


async def test_another_activation_failure_is_raised() -> None:
    lvm = Lvm(["  Volume group vg1 has insufficient free space.\n"])
    with pytest.raises(LvmError, match="insufficient"):
        await lost_thin(lvm.run, thin("Vwi---tz--"))

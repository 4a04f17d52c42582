"""Thin pools left inconsistent by a killed LVM command (topolvm.lvmd.thin_repair): the retry
that clears a component left active alone, and a thin volume the pool lost."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from topolvm.lvm.errors import LvmError
from topolvm.lvm.report import LvRecord
from topolvm.lvmd.thin_repair import lost_thin, run_on_pool

REFUSED = (
    "  Activation of logical volume vg1/pool0 is prohibited while logical volume "
    "vg1/pool0_tmeta is active.\n"
)
OTHER_POOL = REFUSED.replace("pool0_tmeta", "pool9_tmeta")
NO_SPACE = '  Volume group "vg1" has insufficient free space (10 extents): 20 required.\n'
CREATE = ("lvcreate", "-T", "vg1/pool0", "-n", "lv1", "-V", "1g")


class Lvm:
    """Answers each command with the next scripted stderr ("" = success), records the argv."""

    def __init__(self, answers: Iterable[str]):
        self.answers = list(answers)
        self.calls: list[tuple[str, ...]] = []

    async def run(self, *argv: str) -> str:
        self.calls.append(argv)
        stderr = self.answers.pop(0)
        if stderr:
            raise LvmError(argv, 5, stderr)
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


async def test_a_thin_volume_the_pool_lost_is_named_lost() -> None:
    lvm = Lvm([LOST])
    assert await lost_thin(lvm.run, thin("Vwi---tz--"))
    assert lvm.calls == [ACTIVATE]


async def test_an_active_or_activatable_volume_is_kept() -> None:
    lvm = Lvm([])
    assert not await lost_thin(lvm.run, thin("Vwi-a-tz--"))
    assert not await lost_thin(lvm.run, thin("-wi-------"))  # not thin: never touched
    assert lvm.calls == []
    lvm = Lvm([""])
    assert not await lost_thin(lvm.run, thin("Vwi---tz--"))
    assert lvm.calls == [ACTIVATE]


async def test_another_activation_failure_is_raised() -> None:
    lvm = Lvm(["  Volume group vg1 has insufficient free space.\n"])
    with pytest.raises(LvmError, match="insufficient"):
        await lost_thin(lvm.run, thin("Vwi---tz--"))

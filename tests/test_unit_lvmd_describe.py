"""lvmd's DescribeLV and OpenState read one LV from its model (lvmd/volumedata.py): they do not
wait for a change that runs (a publish waited 1.3 s behind two cuts' removal in a move's start),
and read LVM again only for an LV the model does not have, or a uuid it does not know."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from topolvm.config.lvmd import DeviceClass, LvmdConfig
from topolvm.lvmd.state import LvmState
from topolvm.lvmd.volumedata import VolumeDataService

DOC = json.loads((Path(__file__).parent / "data" / "fullreport.json").read_text())


class Runner:
    """LVM's fullreport, from the test data; counted."""

    def __init__(self) -> None:
        self.reports = 0

    async def report(self, *args: str) -> dict[str, Any]:
        self.reports += 1
        return dict(DOC)


@pytest.fixture
def service() -> VolumeDataService:
    dc = DeviceClass(name="ssd", volume_group="myvg1", default=True)
    state = LvmState(Runner(), devices=frozenset)  # type: ignore[arg-type]
    return VolumeDataService(LvmdConfig(device_classes=(dc,)), state)


async def test_an_lv_is_read_from_the_model_while_a_change_runs(service: VolumeDataService) -> None:
    dc = service.config.device_classes[0]
    await service.state.fresh()
    runner: Runner = service.state.runner  # type: ignore[assignment]
    async with service.state.lock:  # a change runs (an lvremove of another LV)
        _, lv = await asyncio.wait_for(service._known(dc, "thick1", False), 1)
    assert lv.full_name == "myvg1/thick1" and runner.reports == 1
    with pytest.raises(TimeoutError):  # an LV the model lacks waits for the change, then a report
        async with service.state.lock:
            service.state._dirty = True
            await asyncio.wait_for(service._known(dc, "not-yet", False), 0.2)

"""Helpers for the tests of the Kubernetes API emulator itself (tests/test_kube_emulator_*.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, Generic, TypeVar

import aiohttp
import pytest
from lightkube.generic_resource import create_global_resource
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node

LogicalVolume = create_global_resource("topolvm.io", "v1", "LogicalVolume", "logicalvolumes")

T = TypeVar("T")
JSON = dict[str, Any]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


class Collector(Generic[T]):
    """Consumes a lightkube watch in a task; ``next()`` returns events one by one."""

    def __init__(self, stream: AsyncIterable[tuple[str, T]]) -> None:
        self.queue: asyncio.Queue[tuple[str, T] | BaseException] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(stream))

    async def _run(self, stream: AsyncIterable[tuple[str, T]]) -> None:
        try:
            async for item in stream:
                self.queue.put_nowait(item)
        except Exception as e:
            self.queue.put_nowait(e)

    async def next(self, timeout: float = 5.0) -> tuple[str, T]:
        item = await asyncio.wait_for(self.queue.get(), timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    async def error(self, timeout: float = 5.0) -> BaseException:
        item = await asyncio.wait_for(self.queue.get(), timeout)
        assert isinstance(item, BaseException), item
        return item

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def node(name: str, labels: dict[str, str] | None = None) -> Node:
    return Node(metadata=ObjectMeta(name=name, labels=labels), spec=NodeSpec(podCIDR="10.0.0.0/24"))


def lv(name: str, node_name: str = "n1", size: str = "1Gi") -> Any:
    return LogicalVolume(
        metadata=ObjectMeta(name=name),
        spec={"name": name, "nodeName": node_name, "size": size},
    )


async def raw_events(resp: aiohttp.ClientResponse) -> list[JSON]:
    return [json.loads(line) async for line in resp.content if line.strip()]

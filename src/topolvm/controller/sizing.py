"""The controller's size and placement rules (spec §6.2, §15.2, §15.7), apart from any I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from topolvm.constants import SIZE_ALIGNMENT

GiB = 1 << 30


class SizingError(ValueError):
    """A capacity range that cannot be satisfied (the controller answers INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class MinimumAllocations:
    """Smallest volume per access type (``--minimum-allocation-*``): a smaller request is
    raised to it before rounding, so that mkfs and the filesystem's own overhead fit."""

    block: int = 8 << 20
    ext4: int = 32 << 20
    xfs: int = 300 << 20
    btrfs: int = 200 << 20

    def for_volume(self, *, block: bool, fs_type: str) -> int:
        if block:
            return self.block
        return {"ext4": self.ext4, "xfs": self.xfs, "btrfs": self.btrfs}.get(fs_type, 0)


def volume_size(required: int, limit: int) -> int:
    """Bytes to allocate for a CSI capacity range: 0/0 → 1 GiB (or the limit, aligned down,
    when it is smaller); otherwise ``required`` rounded up to 4096, which must stay within a
    non-zero ``limit``."""
    if required < 0 or limit < 0:
        raise SizingError(f"capacity must not be negative: required={required}, limit={limit}")
    if limit and required > limit:
        raise SizingError(f"required bytes {required} exceed the limit {limit}")
    if required == 0:
        if limit == 0 or limit >= GiB:
            return GiB
        size = limit // SIZE_ALIGNMENT * SIZE_ALIGNMENT
        if size == 0:
            raise SizingError(f"limit {limit} is smaller than one {SIZE_ALIGNMENT}-byte block")
        return size
    size = -(-required // SIZE_ALIGNMENT) * SIZE_ALIGNMENT
    if limit and size > limit:
        raise SizingError(f"required bytes {required} rounded up to {size} exceed limit {limit}")
    return size


def node_from_topology(
    preferred: Iterable[Mapping[str, str]],
    requisite: Iterable[Mapping[str, str]],
    topology_key: str,
) -> str | None:
    """The node of the first segment (preferred first, then requisite) that names one.

    With WaitForFirstConsumer, csi-provisioner puts the node kube-scheduler chose first in
    ``preferred``; with Immediate it rotates the requisite list per claim, which spreads them.
    """
    for segment in [*preferred, *requisite]:
        node = segment.get(topology_key)
        if node:
            return node
    return None


def largest(free_by_node: Mapping[str, int]) -> tuple[str, int] | None:
    """The node with the most free bytes (ties: the first name in order), None if no node."""
    if not free_by_node:
        return None
    name = min(free_by_node, key=lambda n: (-free_by_node[n], n))
    return name, free_by_node[name]

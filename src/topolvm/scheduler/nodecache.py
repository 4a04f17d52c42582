"""The extender's own cache of Node capacity annotations, for nodeCacheCapable mode.

With ``nodeCacheCapable: true`` kube-scheduler sends only node names, so the extender must know
each node's ``capacity.<plugin>/<dc>`` annotations itself. This class is that knowledge; a
Kubernetes watch on Nodes feeds it:

- after each (re)list: :meth:`replace` with every Node (it also marks the cache synced);
- on every ADDED/MODIFIED event: :meth:`upsert`; on DELETED: :meth:`delete`;
- if the watch cannot be re-established: :meth:`mark_unsynced`.

An entry is trusted for ``max_age`` seconds after its last upsert. kubelet updates its Node
status at least every 5 minutes (``nodeStatusReportFrequency``) and topolvm-node patches the
annotations after every volume change, so a healthy watch refreshes every entry well within the
default 15 minutes. Missing and stale entries, and every entry before the first sync, are
"unknown capacity": the node fails the filter with a reason saying so, never with a capacity of 0.
"""

from __future__ import annotations

import bisect
import operator
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import msgspec

from topolvm import capacity_annotations
from topolvm.constants import Names, names
from topolvm.scheduler.extender import (
    Capacity,
    HostPriority,
    available_bytes,
    bad_annotation_reason,
    capacity_score,
    missing_annotation_reason,
    out_of_space_prefix,
    unknown_reason,
)

DEFAULT_MAX_AGE = 900.0
MAX_FRAGMENT_SETS = 16
"""How many device-class combinations keep precomputed ``/prioritize`` reply fragments."""

_HOST_PRIORITY = msgspec.json.Encoder()
_BULK = 32
_SECOND = operator.itemgetter(1)
_THIRD = operator.itemgetter(2)


@dataclass(frozen=True)
class NodeEntry:
    name: str
    capacities: dict[str, tuple[int | None, str]]
    """Device class (annotation suffix) → (parsed bytes or None if invalid, raw value)."""
    updated_at: float

    def lookup(self, dc: str) -> Capacity:
        return self.capacities.get(dc)


class CapacityOrder:
    """One device class's nodes in ascending order of free bytes (-1 for a bad annotation), as
    (bytes, node, :func:`~topolvm.scheduler.extender.available_bytes`) triples, so that the
    nodes short of a requested capacity are found, with their reasons, without visiting the
    others.

    Additions wait in a list until the next :meth:`below`: the thousands of the first list of
    Nodes are then sorted at once, not inserted one by one.
    """

    def __init__(self) -> None:
        self._items: list[tuple[int, str, str]] = []
        self._added: list[tuple[int, str, str]] = []

    def add(self, name: str, value: int) -> None:
        self._added.append((value, name, available_bytes(value) if value >= 0 else ""))

    def remove(self, name: str, value: int) -> None:
        items = self._items
        i = bisect.bisect_left(items, (value, name))
        if i < len(items) and items[i][:2] == (value, name):
            del items[i]
        else:
            self._added = [item for item in self._added if item[1] != name]

    def below(self, requested: int) -> list[tuple[int, str, str]]:
        """The nodes with fewer than ``requested`` bytes, in ascending order."""
        items = self._items
        if self._added:
            if len(self._added) > _BULK:
                items.extend(self._added)
                items.sort()
            else:
                for item in self._added:
                    bisect.insort(items, item)
            self._added = []
        return items[: bisect.bisect_left(items, (requested,))]


def _own_copy(name: str) -> str:
    """A new string equal to ``name``. The cache keeps its own copies of node names, made
    together, rather than the strings of the decoded Nodes (each lying among its Node's many
    other objects): looking up a request's thousands of names then touches far fewer memory
    pages, which makes it markedly faster."""
    return name.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


def _not_in_cache(name: str) -> str:
    return f"node {name} is not in the scheduler extender's node cache"


@dataclass(frozen=True)
class CacheView:
    """The cache as one request sees it (one clock reading).

    ``unsynced`` is set when no entry can be trusted; ``stale`` names the entries that are too
    old. ``capacities(dc)`` maps node → bytes (-1 for an invalid annotation) and ``scores(dc)``
    node → score, for the nodes that have the annotation; both include stale entries, so
    callers exclude ``stale`` themselves.
    """

    cache: NodeCache
    now: float
    unsynced: str | None
    stale: frozenset[str]

    def capacities(self, dc: str) -> dict[str, int]:
        return self.cache._caps.get(dc, {})

    def scores(self, dc: str) -> dict[str, int]:
        return self.cache._scores.get(dc, {})

    def filter(
        self, node_names: list[str], requested: dict[str, int], plugin_names: Names
    ) -> tuple[list[str], dict[str, str]]:
        """The nodes that can host a pod requesting ``requested`` (in request order) and why
        each other node cannot, as :func:`~topolvm.scheduler.extender.filter_reason` and
        :meth:`get` decide. Needs a synced view."""
        why = self._failing(requested, plugin_names)
        entries = self.cache._entries
        passing: list[str] = []
        failed: dict[str, str] = {}
        append = passing.append
        for name in node_names:
            if name in why:
                failed[name] = why[name]
            elif name in entries:
                append(name)
            else:
                failed[name] = unknown_reason(requested, _not_in_cache(name))
        return passing, failed

    def _failing(self, requested: dict[str, int], plugin_names: Names) -> dict[str, str]:
        """Cached node → why it cannot host the pod, for every cached node that cannot.

        Only the failing nodes are visited (usually a small part of the cluster): per device
        class the nodes without its annotation, and the start of its :class:`CapacityOrder`.
        The device classes go in reverse order, so the first failing one gives the reason.
        """
        cache = self.cache
        entries = cache._entries
        why: dict[str, str] = {}
        for dc, req in reversed(requested.items()):
            caps = cache._caps.get(dc, {})
            if len(caps) < len(entries):
                reason = missing_annotation_reason(dc, req, plugin_names)
                why.update(dict.fromkeys(entries.keys() - caps.keys(), reason))
            order = cache._order.get(dc)
            if order is None:
                continue
            short = order.below(req)
            bad = 0
            while bad < len(short) and short[bad][0] < 0:
                name = short[bad][1]
                raw = entries[name].capacities[dc][1]
                why[name] = bad_annotation_reason(dc, req, raw, plugin_names)
                bad += 1
            del short[:bad]
            # why[name] = out_of_space_reason(...) for each of the others, built in C from the
            # available_bytes(...) ends the order keeps.
            prefix = out_of_space_prefix(dc, req)
            reasons = map(operator.add, repeat(prefix), map(_THIRD, short))
            why.update(zip(map(_SECOND, short), reasons, strict=True))
        for name in self.stale:
            why[name] = unknown_reason(requested, self._stale(entries[name]))
        return why

    def priorities(self, node_names: list[str], device_classes: tuple[str, ...]) -> bytes:
        """The encoded ``HostPriorityList`` for ``node_names``: each node's minimum score over
        the device classes it has, 0 if it has none of them or its capacity is unknown."""
        fragments = self.cache._fragments(device_classes)
        if not self.stale:
            try:
                return b"[" + b",".join(map(fragments.__getitem__, node_names)) + b"]"
            except KeyError:
                pass  # a node that is not cached
        stale = self.stale
        return (
            b"["
            + b",".join(
                fragments[n]
                if n in fragments and n not in stale
                else _HOST_PRIORITY.encode(HostPriority(n, 0))
                for n in node_names
            )
            + b"]"
        )

    def get(self, name: str) -> NodeEntry | str:
        """The entry for ``name``, or why its capacity is unknown."""
        if self.unsynced is not None:
            return self.unsynced
        entry = self.cache._entries.get(name)
        if entry is None:
            return _not_in_cache(name)
        if name in self.stale:
            return self._stale(entry)
        return entry

    def _stale(self, entry: NodeEntry) -> str:
        return (
            f"the node cache entry of {entry.name} is stale (last updated "
            f"{self.now - entry.updated_at:.0f}s ago, limit {self.cache.max_age:.0f}s)"
        )


class NodeCache:
    def __init__(
        self,
        plugin_names: Names | None = None,
        max_age: float = DEFAULT_MAX_AGE,
        clock: Callable[[], float] = time.monotonic,
        divisor: Callable[[str], float] = lambda _dc: 1.0,
    ) -> None:
        if not max_age > 0:
            raise ValueError(f"max_age must be > 0, got {max_age}")
        self.names = plugin_names or names()
        self.max_age = max_age
        self.clock = clock
        self._divisor = divisor
        # Ordered by last update, oldest first, so staleness is found without a full scan.
        self._entries: dict[str, NodeEntry] = {}
        # Indexes per device class: node → bytes (-1: a bad annotation), node → score, and the
        # nodes in order of bytes (see CacheView.filter).
        self._caps: dict[str, dict[str, int]] = {}
        self._scores: dict[str, dict[str, int]] = {}
        self._order: dict[str, CapacityOrder] = {}
        # Device classes of a request → node → its encoded ``HostPriority`` (see
        # :meth:`_fragments`), for the last MAX_FRAGMENT_SETS combinations asked for.
        self._priority_fragments: dict[tuple[str, ...], dict[str, bytes]] = {}
        self._synced_at: float | None = None
        self._unsynced_reason = "the node cache has not synced with the API server yet"

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def synced(self) -> bool:
        return self._synced_at is not None

    def use_divisor(self, divisor: Callable[[str], float]) -> None:
        """Score with ``divisor(device_class)`` (the extender's configuration) from now on."""
        self._divisor = divisor
        self._scores = {}
        self._priority_fragments = {}
        for entry in self._entries.values():
            self._index_scores(entry)

    def _fragments(self, device_classes: tuple[str, ...]) -> dict[str, bytes]:
        """Node → ``{"Host":...,"Score":...}`` for a pod requesting ``device_classes``, made on
        first use and then kept current by :meth:`upsert` and :meth:`delete`."""
        fragments = self._priority_fragments.get(device_classes)
        if fragments is None:
            if len(self._priority_fragments) >= MAX_FRAGMENT_SETS:
                del self._priority_fragments[next(iter(self._priority_fragments))]
            fragments = {name: self._fragment(name, device_classes) for name in self._entries}
            self._priority_fragments[device_classes] = fragments
        return fragments

    def _fragment(self, name: str, device_classes: tuple[str, ...]) -> bytes:
        scores = [
            self._scores[dc][name] for dc in device_classes if name in self._scores.get(dc, ())
        ]
        return _HOST_PRIORITY.encode(HostPriority(name, min(scores, default=0)))

    def _index_scores(self, entry: NodeEntry) -> None:
        for dc, (value, _raw) in entry.capacities.items():
            score = capacity_score(value or 0, self._divisor(dc))
            self._scores.setdefault(dc, {})[entry.name] = score

    def _unindex(self, name: str) -> None:
        old = self._entries.pop(name, None)
        if old is None:
            return
        for dc in old.capacities:
            self._order[dc].remove(name, self._caps[dc].pop(name))
            self._scores[dc].pop(name, None)
        for fragments in self._priority_fragments.values():
            fragments.pop(name, None)

    def upsert(self, node: Mapping[str, Any]) -> bool:
        """Store a Node (a dict as the API server returns it). Returns False, storing nothing, if
        it has no ``metadata.name``."""
        meta = node.get("metadata")
        if not isinstance(meta, Mapping):
            return False
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            return False
        annotations = meta.get("annotations")
        caps = capacity_annotations.decode_node(
            self.names, annotations if isinstance(annotations, Mapping) else None
        )
        old = self._entries.get(name)
        if old is not None and old.capacities == caps:  # most updates: only refresh the time
            del self._entries[old.name]
            self._entries[old.name] = NodeEntry(old.name, old.capacities, self.clock())
            return True
        name = _own_copy(name) if old is None else old.name
        self._unindex(name)
        entry = NodeEntry(name, caps, self.clock())
        self._entries[name] = entry
        for dc, (value, _raw) in caps.items():
            indexed = -1 if value is None else value
            self._caps.setdefault(dc, {})[name] = indexed
            self._order.setdefault(dc, CapacityOrder()).add(name, indexed)
        self._index_scores(entry)
        for device_classes, fragments in self._priority_fragments.items():
            fragments[name] = self._fragment(name, device_classes)
        return True

    def delete(self, name: str) -> None:
        self._unindex(name)

    def replace(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """Replace the whole content with a fresh list of Nodes, and mark the cache synced."""
        self._entries, self._caps, self._scores, self._order = {}, {}, {}, {}
        self._priority_fragments = {}
        for node in nodes:
            self.upsert(node)
        self.mark_synced()

    def mark_synced(self) -> None:
        self._synced_at = self.clock()

    def mark_unsynced(self, reason: str = "") -> None:
        """Stop trusting every entry until the next :meth:`mark_synced` (or :meth:`replace`)."""
        self._synced_at = None
        self._unsynced_reason = (
            f"the node cache lost its sync with the API server: {reason}"
            if reason
            else "the node cache lost its sync with the API server"
        )

    def view(self) -> CacheView:
        now = self.clock()
        if self._synced_at is None:
            return CacheView(self, now, self._unsynced_reason, frozenset())
        cutoff = now - self.max_age
        stale = []
        for entry in self._entries.values():
            if entry.updated_at >= cutoff:
                break
            stale.append(entry.name)
        return CacheView(self, now, None, frozenset(stale))

    def get(self, name: str) -> NodeEntry | str:
        """The entry for ``name``, or why its capacity is unknown."""
        return self.view().get(name)

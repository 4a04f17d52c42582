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

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from topolvm.constants import Names, names
from topolvm.scheduler.extender import Capacity, capacity_score, parse_node_capacity

DEFAULT_MAX_AGE = 900.0


@dataclass(frozen=True)
class NodeEntry:
    name: str
    capacities: dict[str, tuple[int | None, str]]
    """Device class (annotation suffix) → (parsed bytes or None if invalid, raw value)."""
    updated_at: float

    def lookup(self, dc: str) -> Capacity:
        return self.capacities.get(dc)


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

    def get(self, name: str) -> NodeEntry | str:
        """The entry for ``name``, or why its capacity is unknown."""
        if self.unsynced is not None:
            return self.unsynced
        entry = self.cache._entries.get(name)
        if entry is None:
            return _not_in_cache(name)
        if name in self.stale:
            return (
                f"the node cache entry of {name} is stale (last updated "
                f"{self.now - entry.updated_at:.0f}s ago, limit {self.cache.max_age:.0f}s)"
            )
        return entry


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
        # Indexes for one pass per device class over a request's node names.
        self._caps: dict[str, dict[str, int]] = {}
        self._scores: dict[str, dict[str, int]] = {}
        self._synced_at: float | None = None
        self._unsynced_reason = "the node cache has not synced with the API server yet"

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def synced(self) -> bool:
        return self._synced_at is not None

    @property
    def synced_at(self) -> float | None:
        """Clock time of the last :meth:`mark_synced` (``None`` while unsynced)."""
        return self._synced_at

    def use_divisor(self, divisor: Callable[[str], float]) -> None:
        """Score with ``divisor(device_class)`` (the extender's configuration) from now on."""
        self._divisor = divisor
        self._scores = {}
        for entry in self._entries.values():
            self._index_scores(entry)

    def _index_scores(self, entry: NodeEntry) -> None:
        for dc, (value, _raw) in entry.capacities.items():
            score = capacity_score(value or 0, self._divisor(dc))
            self._scores.setdefault(dc, {})[entry.name] = score

    def _unindex(self, name: str) -> None:
        old = self._entries.pop(name, None)
        if old is None:
            return
        for dc in old.capacities:
            self._caps[dc].pop(name, None)
            self._scores[dc].pop(name, None)

    def upsert(self, node: Mapping[str, Any]) -> bool:
        """Store a Node (a dict as the API server returns it). Returns False, storing nothing, if
        it has no ``metadata.name``."""
        meta = node.get("metadata")
        if not isinstance(meta, Mapping):
            return False
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            return False
        prefix = self.names.capacity_prefix
        caps: dict[str, tuple[int | None, str]] = {}
        annotations = meta.get("annotations")
        if isinstance(annotations, Mapping):
            for key, value in annotations.items():
                if isinstance(key, str) and key.startswith(prefix):
                    raw = value if isinstance(value, str) else str(value)
                    caps[key[len(prefix) :]] = (parse_node_capacity(raw), raw)
        self._unindex(name)
        entry = NodeEntry(name, caps, self.clock())
        self._entries[name] = entry
        for dc, (value, _raw) in caps.items():
            self._caps.setdefault(dc, {})[name] = -1 if value is None else value
        self._index_scores(entry)
        return True

    def delete(self, name: str) -> None:
        self._unindex(name)

    def replace(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """Replace the whole content with a fresh list of Nodes, and mark the cache synced."""
        self._entries, self._caps, self._scores = {}, {}, {}
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

"""The Node annotation ``<plugin>/orphan-lvs``: the LVs topolvm-node found on its node that no
LogicalVolume claims (docs/troubleshooting.md, "LVs that no LogicalVolume claims").
topolvm-node writes it (:mod:`topolvm.node.orphans`) and removes it when there are none;
``topolvm doctor`` reads it (it cannot run ``lvs`` on the nodes itself).

The value is JSON: ``{"count": N, "bytes": B, "lvs": [{"name", "vg", "deviceClass",
"sizeBytes", "kind"}, ...]}`` with at most :data:`LISTED` LVs listed (the largest first);
``count`` and ``bytes`` cover them all.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from topolvm.constants import Names

LISTED = 20


class Kind:
    """What an orphan LV looks like, by its name."""

    VOLUME = "volume"  # named like a LogicalVolume's UID: an old volume whose object went first
    CUT = "cut"  # a copy's cut (cut.<UID>) that this node did not tag as its own
    VERIFY_CUT = "verify-cut"  # a verification's cut (verify.<UID>) whose digest was reported


@dataclass(frozen=True, order=True)
class OrphanLv:
    name: str
    vg: str
    device_class: str
    size_bytes: int
    kind: str = Kind.VOLUME

    @property
    def full_name(self) -> str:
        return f"{self.vg}/{self.name}"


@dataclass(frozen=True)
class Orphans:
    """What the annotation says: the LVs listed, and how many there are in all (bytes too)."""

    lvs: tuple[OrphanLv, ...] = ()
    count: int = 0
    bytes: int = 0


def annotation(names: Names) -> str:
    return f"{names.plugin}/orphan-lvs"


def encode(found: Sequence[OrphanLv]) -> str | None:
    """The annotation's value; None (remove it) when nothing was found."""
    if not found:
        return None
    listed = sorted(found, key=lambda o: (-o.size_bytes, o.vg, o.name))[:LISTED]
    return json.dumps({
        "count": len(found), "bytes": sum(o.size_bytes for o in found),
        "lvs": [{"name": o.name, "vg": o.vg, "deviceClass": o.device_class,
                 "sizeBytes": o.size_bytes, "kind": o.kind} for o in listed],
    }, sort_keys=True)  # fmt: skip


def decode(raw: str) -> Orphans:
    """The annotation as written; ValueError if it is not (another writer, or damaged)."""
    try:
        doc = json.loads(raw)
        lvs = tuple(
            OrphanLv(str(e["name"]), str(e["vg"]), str(e.get("deviceClass") or ""),
                     int(e["sizeBytes"]), str(e.get("kind") or Kind.VOLUME))
            for e in doc["lvs"]
        )  # fmt: skip
        return Orphans(lvs, int(doc["count"]), int(doc["bytes"]))
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
        raise ValueError(f"not an orphan-lvs annotation: {e}") from e

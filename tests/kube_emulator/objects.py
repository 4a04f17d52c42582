"""The emulator's data model: served resource types, recorded requests, object helpers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

JSON = dict[str, Any]

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
CRD_DIR = REPO_ROOT / "deploy" / "crds"
DEFAULT_CRDS = ("logicalvolumes.topolvm.io.yaml", "logicalvolumes.topolvm.cybozu.com.yaml")

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what the apiserver uses for generateName


def now_rfc3339() -> str:
    """The current UTC time as a Kubernetes ``Time`` (second precision)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ResourceType:
    """One served resource (a group/version/plural)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool
    selectable_fields: tuple[str, ...] = ()
    custom: bool = False  # a CRD: no strategic merge patch, resourceVersion required on PUT
    status_on_create: bool = False  # keep a client-supplied status on create (nodes do)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        """``plural.group`` as used in error messages (just ``plural`` for core)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def store_key(self) -> tuple[str, str]:
        return (self.group, self.plural)


@dataclass
class RecordedRequest:
    """One request as received by the emulator."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any


def spec_of(obj: JSON) -> JSON:
    """Everything that counts for ``metadata.generation``."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def served(rtype: ResourceType, obj: JSON) -> JSON:
    """``obj`` as served under ``rtype``'s apiVersion and kind."""
    return {**obj, "apiVersion": rtype.api_version, "kind": rtype.kind}

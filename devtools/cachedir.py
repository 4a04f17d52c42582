"""Where the dev tools (and the fuzz tests' hypothesis cache) keep what they download or build:
outside the work tree, so every clone on this machine (CI clones afresh) shares it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(name: str, override_env: str | None = None) -> Path:
    """``$override_env`` if set, else ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/topolvm/<name>``."""
    override = os.environ.get(override_env) if override_env else None
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(override) if override else base / "topolvm" / name

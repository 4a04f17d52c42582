"""The package's version, as `topolvm --version` and CSI GetPluginInfo report it."""

from __future__ import annotations

from importlib import metadata

# What a source tree run without installing reports.
UNINSTALLED = "devel"


def version() -> str:
    try:
        return metadata.version("topolvm")
    except metadata.PackageNotFoundError:
        return UNINSTALLED

"""Readable configuration errors that name the key and the offending value."""

from __future__ import annotations


class ConfigError(Exception):
    """A configuration file or value is invalid; the message names the key and value."""


def invalid(key: str, message: str) -> ValueError:
    """What a validator raises: ``key`` (relative to the object validated) leads the message,
    so the decoder can join it to the object's path (see ``topolvm.config.decode``)."""
    return ValueError(f"{key}: {message}")

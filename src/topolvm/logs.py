"""Structured logging: one JSON object (or key=value line) per record, with context fields."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v!r}" for k, v in _fields(record).items())
        line = (
            f"{self.formatTime(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        )
        line = f"{line} {extra}" if extra else line
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class FailedRequestsOnly(logging.Filter):
    """The Kubernetes client's HTTP library logs every request at INFO, one line per API call:
    noise for an operator and CPU on a busy node. Keep the failed ones (status 400 and up, but
    404: a lookup of what may not exist, which its caller handles and says) and whatever else
    it logs; ``--log-level debug`` shows them all."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.levelno != logging.INFO or not str(record.msg).startswith("HTTP Request"):
            return True
        if not isinstance(args, tuple) or len(args) < 4 or not isinstance(args[3], int):
            return True
        return args[3] >= 400 and args[3] != 404


def setup(level: str = "info", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    if level.lower() != "debug":
        handler.addFilter(FailedRequestsOnly())
    logging.Formatter.converter = __import__("time").gmtime
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())

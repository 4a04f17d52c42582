"""Small helpers shared by test modules (and the demo)."""

from __future__ import annotations

import asyncio
import inspect
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_status(url: str, timeout: float = 5) -> tuple[int, bytes]:
    """(status, body) of a GET of ``url``, an HTTP error's too; OSError when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def first_answer(url: str, proc: subprocess.Popen[str], timeout: float = 30) -> tuple[int, bytes]:
    """:func:`http_status` of ``url`` once the server ``proc`` starts listens there; fails if
    it exits first or does not listen within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return http_status(url)
        except OSError as e:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError(f"nothing answered at {url} (exit {proc.poll()})") from e
            time.sleep(0.1)


async def eventually(
    what: str,
    check: Callable[[], Any],
    timeout: float = 60.0,
    *,
    gave_up: Callable[[], bool] = lambda: False,
    details: Callable[[], str] = lambda: "",
    interval: float = 0.05,
) -> Any:
    """Poll ``check()`` until it returns something truthy and return that. ``check`` may be a
    coroutine function (say, a read from the API server).

    Stops early once ``gave_up()`` is true (say, the process under test exited). On failure
    raises AssertionError naming ``what``, followed by ``details()`` (say, a log).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline or gave_up():
            extra = details()
            raise AssertionError(f"timed out waiting for {what}" + (f"; {extra}" if extra else ""))
        await asyncio.sleep(interval)


def der(pem: bytes) -> bytes:
    """A PEM certificate in DER form."""
    return x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)


async def served_cert(port: int, ca: bytes) -> bytes:
    """The DER certificate a TLS server on 127.0.0.1 presents, verified against ``ca``."""
    tls = ssl.create_default_context(cadata=ca.decode())
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    cert: bytes = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return cert

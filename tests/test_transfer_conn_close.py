"""A transfer connection whose TLS peer ends the session (close_notify) in the middle of a frame,
or while the receiver waits for its first frame: the receiver reports the connection closed at
once, instead of spinning on reads that return nothing (real TLS over a socket pair)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import pytest

from topolvm.transfer import wire
from topolvm.transfer.conn import Conn
from topolvm.transfer.errors import ConnectionLost
from topolvm.transfer.tls import client_context, server_context


@contextlib.contextmanager
def _peer_that_closes(partial: bytes) -> Iterator[Conn]:
    """A receiving Conn whose peer completes the handshake, sends ``partial`` plaintext and
    then a close_notify, keeping its socket open."""
    ctx, _ = server_context("node-a")
    ours, theirs = socket.socketpair()
    ours.settimeout(5)
    theirs.settimeout(5)
    done = threading.Event()

    def peer() -> None:
        # wrap_socket takes over ``theirs``: its TLS socket is the one to close
        with (
            contextlib.suppress(OSError, ssl.SSLError),
            ctx.wrap_socket(theirs, server_side=True) as tls,
        ):
            if partial:
                tls.sendall(partial)
            with contextlib.suppress(OSError, ssl.SSLError):
                tls.unwrap()  # sends close_notify, then waits for ours (which never comes)
            done.wait(10)  # the socket stays open: only TLS said the session is over

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    conn = Conn.tls(ours, client_context(), "node-a", server=False)
    try:
        yield conn
    finally:
        done.set()
        conn.close()
        thread.join(10)
        theirs.close()  # when the handshake failed before wrap_socket took it


def _ends(call: Callable[[], object]) -> BaseException | None:
    """What ``call`` raised, run in a thread given 5 s (a spinning read never returns)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as e:  # handed to the test
            raised.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive(), "the read did not end after the peer's close_notify"
    return raised[0] if raised else None


@pytest.mark.parametrize("partial", [b"", b"\x01\x02\x03"], ids=["no-byte", "mid-header"])
def test_a_close_notify_ends_a_receive_at_once(partial: bytes) -> None:
    with _peer_that_closes(partial) as conn:
        buf = memoryview(bytearray(wire.MAX_CONTROL))
        error = _ends(lambda: conn.recv(buf))
    assert isinstance(error, ConnectionLost) and "closed" in str(error), error


def test_a_close_notify_ends_the_wait_for_the_first_frame() -> None:
    with _peer_that_closes(b"") as conn:
        error = _ends(lambda: conn.wait(threading.Event(), 60.0))
    assert isinstance(error, ConnectionLost) and "closed" in str(error), error

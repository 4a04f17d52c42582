"""A verification's digest is read at the least CPU priority (node/verifyread.py): the moved pod
starts on the target node while its verification cut is read, and must not wait for the hash;
the rest of topolvm-node keeps its priority."""

from __future__ import annotations

import os
import threading

from topolvm.node.verifyread import NICE, in_background


def test_the_digest_thread_alone_yields_the_cpu() -> None:
    seen: list[int] = []

    def reader() -> None:
        in_background()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        in_background()  # the pool's thread again: still allowed, still the least
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    thread = threading.Thread(target=reader)
    thread.start()
    thread.join()
    assert seen == [NICE, NICE]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before

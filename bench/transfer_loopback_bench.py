"""``make bench``: the copy's own cost on the host, over loopback (docs/mobility.md,
"Performance"), apart from UML's: the real sender and receiver (TLS 1.3, the token step
stubbed), each in a process of its own as on two nodes, files standing in for the volumes
(read and written through the page cache, where a node uses ``O_DIRECT`` on its LVs). The files
are in memory (``/dev/shm``, when it has room) unless ``--dir`` says where: on this project's
machines the virtual disk writes about 1.2 GB/s, so on it the bench would time the disk's
flushes at the receiver's checkpoints more than the copy.

1. A copy of ``--gib`` GiB of random bytes: its rate and the CPU seconds per GiB on each side
   (each side's stream thread: what ``status.copy`` reports). Targets: >= 1.1 GB/s (10 GbE line
   rate) and <= 0.8 CPU-s/GiB on each side. Measured in one stream, and in ``--streams``
   (default: a node's default, one per CPU up to 4), the rate a node gets by default.
2. Compression on a slow link: the same size of log-like data (compresses about 5:1), sent
   through a sender capped at ``--link-mib`` MiB/s on the wire, with ``--transfer-compression
   zstd`` and without. Target: the compressed copy takes <= 0.7 of the plain one's time.
3. Compression on data that does not compress (the random bytes): the compressing sender's CPU
   per GiB against the plain sender's. Target: <= 1.2 (it soon stops trying).
4. A thick volume that is all zeros (a new or mostly empty one): the sender reads it whole and
   sends ZERO records; its CPU seconds per GiB of volume (shown, no target).

Results go to ``.cache/bench/transfer_loopback.json``; targets not met are marked OVER, never a
failure.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.outcome import memory_or_cache, save
from devtools import gobuild
from topolvm.transfer import messages
from topolvm.transfer.client import Endpoint, Outcome, receive
from topolvm.transfer.jobs import Job, Limits, VolumeInfo
from topolvm.transfer.metrics import TransferMetrics
from topolvm.transfer.server import TransferServer
from topolvm.transfer.streams import Parts, receive_parts

MiB = 1 << 20
GiB = 1 << 30
RESULTS = gobuild.ROOT / ".cache" / "bench" / "transfer_loopback.json"
UID = "0b4f5c7e-1111-4222-8333-123456789abc"
TARGETS = {"gb_per_second": (">=", 1.1), "gb_per_second_streams": (">=", 1.1),
           "sender_cpu_per_gib": ("<=", 0.8),
           "receiver_cpu_per_gib": ("<=", 0.8), "zstd_slow_link_time": ("<=", 0.7),
           "zstd_incompressible_cpu": ("<=", 1.2)}  # fmt: skip


class Files:
    """The sender's volumes: files, read whole."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths

    async def describe(self, name: str, device_class: str, with_uuid: bool = False) -> VolumeInfo:
        path = self.paths[name]
        return VolumeInfo(str(path), path.stat().st_size, False, 0, f"uuid-{name}")

    async def mapped(self, name: str, device_class: str) -> list[tuple[int, int]] | None:
        return None

    async def changed(self, name: str, base: str, device_class: str,
                      thin: bool = True) -> list[tuple[int, int]] | None:  # fmt: skip
        return None


def _random(path: Path, size: int) -> None:
    with path.open("wb") as f:
        for _ in range(size // (16 * MiB)):
            f.write(os.urandom(16 * MiB))


def _logs(path: Path, size: int) -> None:
    rng = random.Random(1)
    words = [f"{w} " for w in ("INFO", "WARN", "insert", "row", "commit", "fsync", "table",
                               "checkpoint", "id=", "ms")]  # fmt: skip
    block = bytearray()
    while len(block) < 16 * MiB:
        line = "".join(rng.choice(words) for _ in range(10)) + f"{rng.randrange(10**6)}\n"
        block += line.encode()
    with path.open("wb") as f:
        for i in range(size // (16 * MiB)):
            f.write(bytes(block[i % 7 :][: 16 * MiB]).ljust(16 * MiB, b"\n"))


def _serve(paths: dict[str, Path], source: str, limits: Limits, ready: Any) -> None:
    """The sender, in a process of its own as on a node of its own (no GIL shared with the
    receiver): serves until killed."""

    async def authorise(hello: messages.Hello) -> Job:
        return Job(UID, "pvc-target", "node-b", source, "ssd", "bench")

    async def run() -> None:
        server = TransferServer("node-a", authorise, Files(paths), limits,
                                TransferMetrics(None, "node-a"))  # fmt: skip
        await server.start("127.0.0.1", 0)
        ready.put((server.port, server.fingerprint))
        await asyncio.Event().wait()

    asyncio.run(run())


def _copy(source: str, files: Files, target: Path, limits: Limits,
          features: tuple[str, ...], streams: int = 1) -> tuple[float, Outcome]:  # fmt: skip
    ctx = multiprocessing.get_context("fork")  # before any thread of this process
    ready = ctx.Queue()
    child = ctx.Process(target=_serve, args=(files.paths, source, limits, ready), daemon=True)
    child.start()
    try:
        port, fingerprint = ready.get(timeout=60)
        size = files.paths[source].stat().st_size
        info = VolumeInfo(str(target), size, False, 0, "t")
        if streams > 1:
            features = (*features, messages.STREAMS)
        endpoint = Endpoint("node-a", "127.0.0.1", port, fingerprint, frozenset(features))
        hello = messages.Hello(version=1, token="t", job="pvc-target", job_uid=UID,
                               features=features)  # fmt: skip
        began = time.monotonic()
        if streams > 1:
            parts = Parts(streams, 16 * MiB)
            outcome = receive_parts(endpoint, hello, info, parts, {}, lambda i, c: None,
                                    lambda *a: None, threading.Event(), 60.0)  # fmt: skip
        else:
            outcome = receive(endpoint, hello, info, lambda c: None, lambda *a: None,
                              threading.Event(), 60.0)  # fmt: skip
        return time.monotonic() - began, outcome
    finally:
        child.kill()
        child.join()


def _cpu(outcome: Outcome) -> tuple[float, float]:
    gib = outcome.data_bytes / GiB
    return (outcome.sender_cpu_seconds or 0.0) / gib, outcome.cpu_seconds / gib


def measure(workdir: Path, size: int, rounds: int, link: int, streams: int) -> dict[str, Any]:
    files = Files({"random": workdir / "random", "logs": workdir / "logs",
                   "zeros": workdir / "zeros"})  # fmt: skip
    _random(files.paths["random"], size)
    with files.paths["zeros"].open("wb") as f:  # written, not sparse: as a thick LV reads
        for _ in range(size // (16 * MiB)):
            f.write(bytes(16 * MiB))
    _logs(files.paths["logs"], size)
    target = workdir / "target"
    target.write_bytes(b"")
    os.truncate(target, size)
    ask = (messages.SENDER_CPU, messages.COMPRESS)
    plain, zstd_random, slow_plain, slow_zstd, zeros, several = [], [], [], [], [], []
    for _ in range(rounds):
        zeros.append(_copy("zeros", files, target, Limits(), ask))
        plain.append(_copy("random", files, target, Limits(), ask))
        several.append(_copy("random", files, target, Limits(), ask, streams))
        zstd_random.append(_copy("random", files, target, Limits(compress=True), ask))
        slow_plain.append(_copy("logs", files, target, Limits(bandwidth=link), ask))
        slow_zstd.append(_copy("logs", files, target, Limits(bandwidth=link, compress=True), ask))
    med = statistics.median
    seconds = med(t for t, _ in plain)
    sender = med(_cpu(o)[0] for _, o in plain)
    receiver = med(_cpu(o)[1] for _, o in plain)
    zstd_sender = med(_cpu(o)[0] for _, o in zstd_random)
    wire = med(o.wire_bytes / o.data_bytes for _, o in slow_zstd)
    return {
        "size_bytes": size, "rounds": rounds, "link_bytes_per_second": link,
        "plain_seconds": [t for t, _ in plain], "streams": streams,
        "streams_seconds": [t for t, _ in several],
        "streams_cpu_per_gib": [med(_cpu(o)[0] for _, o in several),
                                med(_cpu(o)[1] for _, o in several)],
        "ratios": {
            "gb_per_second": size / seconds / 1e9,
            "gb_per_second_streams": size / med(t for t, _ in several) / 1e9,
            "sender_cpu_per_gib": sender,
            "receiver_cpu_per_gib": receiver,
            "zstd_slow_link_time": med(t for t, _ in slow_zstd) / med(t for t, _ in slow_plain),
            "zstd_incompressible_cpu": zstd_sender / sender,
        },
        "zstd_wire_share": wire,
        "zstd_receiver_cpu_per_gib": med(_cpu(o)[1] for _, o in slow_zstd),
        "zstd_sender_cpu_per_gib": med(_cpu(o)[0] for _, o in slow_zstd),
        "zero_volume_sender_cpu_per_gib": med((o.sender_cpu_seconds or 0.0) / (size / GiB)
                                              for _, o in zeros),
        "zero_volume_seconds": med(t for t, _ in zeros),
    }  # fmt: skip


def report(results: dict[str, Any]) -> None:
    r = results["ratios"]
    print(f"\n== the copy over loopback, {results['size_bytes'] / GiB:g} GiB, medians of "
          f"{results['rounds']} rounds (docs/mobility.md) ==")  # fmt: skip
    for key, (sign, target) in TARGETS.items():
        met = r[key] >= target if sign == ">=" else r[key] <= target
        print(f"  {key}: {r[key]:.2f} (target {sign} {target}) {'ok' if met else 'OVER'}")
    print(f"  zstd on log-like data: {results['zstd_wire_share']:.1%} of the bytes on the wire; "
          f"CPU s/GiB sender {results['zstd_sender_cpu_per_gib']:.2f}, receiver "
          f"{results['zstd_receiver_cpu_per_gib']:.2f}")  # fmt: skip
    print(f"  in {results['streams']} streams: CPU s/GiB sender "
          f"{results['streams_cpu_per_gib'][0]:.2f}, receiver "
          f"{results['streams_cpu_per_gib'][1]:.2f} (summed over the streams)")  # fmt: skip
    print(f"  a thick volume of zeros: {results['zero_volume_seconds']:.2f} s, sender CPU "
          f"{results['zero_volume_sender_cpu_per_gib']:.2f} s/GiB of volume")  # fmt: skip


def _where(chosen: Path | None, size: int) -> Path:
    """``chosen``, else memory when it holds the four files with room to spare, else .cache."""
    return chosen if chosen is not None else memory_or_cache(6 * size)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="data per copy (default 1 GiB)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (medians are reported)")
    parser.add_argument("--link-mib", type=int, default=100,
                        help="the slow link's MiB/s for step 2 (default 100)")  # fmt: skip
    parser.add_argument("--streams", type=int, default=min(os.cpu_count() or 1, 4),
                        help="streams of the second copy of step 1, at least 2 (default: one "
                        "per CPU, at most 4, as a node's default)")  # fmt: skip
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the volumes' files go (default: /dev/shm when it has room "
                        "for them, else .cache)")  # fmt: skip
    args = parser.parse_args()
    size = max(16 * MiB, int(args.gib * GiB) // (16 * MiB) * (16 * MiB))
    workdir = Path(tempfile.mkdtemp(prefix="transfer-loopback-", dir=_where(args.dir, size)))
    print(f"the volumes' files: {workdir}")
    try:
        results = measure(workdir, size, args.rounds, args.link_mib * MiB, max(2, args.streams))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["loadavg"] = list(os.getloadavg())
    results["files"] = str(workdir.parent)
    report(results)
    save(RESULTS, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Serve the emulator standalone: ``python -m tests.kube_emulator --port 8080``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from tests.kube_emulator.server import KubeEmulator


async def _serve(host: str, port: int) -> None:
    async with KubeEmulator(host=host, port=port) as emu:
        print(emu.url, flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the Kubernetes API emulator.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.host, args.port))


if __name__ == "__main__":
    main()

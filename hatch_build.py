"""Build hook: generate protobuf/gRPC modules and type stubs from src/topolvm/proto/*.proto."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _script(name: str) -> str:
    """Locate a console script of a build dependency (pip puts the build env's bin on PATH)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError(
            f"{name} not found: is mypy-protobuf installed in the build environment?"
        )
    return found


def generate(root: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) with the mypy-protobuf plugins; return the generated files."""
    from grpc_tools import protoc  # build-time dependency

    src = root / "src"
    protos = sorted((src / "topolvm" / "proto").glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    for proto in protos:
        args = [
            "grpc_tools.protoc",
            f"-I{src}",
            f"-I{include}",
            f"--python_out={src}",
            f"--grpc_python_out={src}",
            f"--mypy_out={src}",
            f"--mypy_grpc_out={src}",
            str(proto.relative_to(src)),
        ]
        for plugin in ("protoc-gen-mypy", "protoc-gen-mypy_grpc"):
            args.insert(1, f"--plugin={plugin}={_script(plugin)}")
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed for {proto}")
    return sorted((src / "topolvm" / "proto").glob("*_pb2*"))


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        generate(Path(self.root))


if __name__ == "__main__":
    for f in generate(Path(__file__).parent):
        print(f)

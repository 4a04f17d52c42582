"""``make image``: the topolvm OCI image, built without a Docker daemon.

Two layers, each a tar made reproducibly from the repo's inputs, packed by ``umoci`` into an
OCI image layout at ``build/image/oci`` (tag: the project's version):

1. **Debian base** -- ``mmdebstrap`` (variant ``essential``, no apt) installs
   :data:`DEBIAN_PACKAGES` from Debian bookworm (+ updates, security). Cached in
   ``~/.cache/topolvm/image/base-<key>/``, keyed by everything that goes into it.
2. **topolvm** -- a venv at ``/opt/topolvm`` made by the image's own ``python3`` (in a chroot):
   this repo's wheel (built offline with the pinned :data:`BUILD_CONSTRAINTS`) and
   :data:`PYTHON_REQUIREMENTS` (pinned; wheels from PyPI, installed offline with ``--no-deps``,
   then ``pip check``), ``/usr/local/bin/topolvm`` and upstream's component names ``/lvmd``,
   ``/topolvm-node``, ... (``topolvm`` dispatches on ``argv[0]``). Wheels are cached too: only
   a cold cache needs the network.

Usage::

    python -m devtools.image              # build (or reuse); print layout, digest, sizes
    python -m devtools.image --check      # ... then unpack it and run its binaries
    python -m devtools.image --refresh    # rebuild the Debian layer (new security updates)
    python -m devtools.image --requirements       # the pins, for the Dockerfile's pip install
    python -m devtools.image --build-constraints  # ... and for the wheel's build
    python -m devtools.image --freeze     # the pins as this venv has them (to update the list)

Needs root (chroot, device nodes), ``mmdebstrap`` and ``umoci`` (installed with apt-get when
missing), Debian's mirror and PyPI. This file is the command line. What goes into the image is
devtools/image_recipe.py (standard library only: the Dockerfile runs it alone for the pins);
the build is in devtools/image_common.py (what the steps share), image_base.py (the Debian
layer), image_app.py (the wheels and the topolvm layer), image_oci.py (umoci, and reading the
layout) and image_build.py (the build, its record and ``--check``). See docs/image.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from devtools.buildcache import say
from devtools.image_build import build, check, describe
from devtools.image_common import ImageError
from devtools.image_recipe import OUT, freeze, print_lists


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.image", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (build/image)")
    parser.add_argument("--check", action="store_true", help="run the image's binaries")
    parser.add_argument("--refresh", action="store_true", help="rebuild the Debian layer")
    parser.add_argument("--json", action="store_true", help="print the description as JSON")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--requirements", action="store_true", help="print the Python pins")
    what.add_argument(
        "--build-constraints", action="store_true", help="print the wheel build's pins"
    )
    what.add_argument("--packages", action="store_true", help="print the Debian packages")
    what.add_argument("--freeze", action="store_true", help="print the pins from this venv")
    args = parser.parse_args(argv)
    if args.requirements or args.build_constraints or args.packages:
        flag = next(f for f, on in (("--requirements", args.requirements),
                                    ("--build-constraints", args.build_constraints),
                                    ("--packages", args.packages)) if on)  # fmt: skip
        return print_lists([flag]) or 0
    if args.freeze:
        print("\n".join(freeze()))
        return 0
    try:
        info = build(args.out, refresh=args.refresh)
        print(info.as_json() if args.json else describe(info), flush=True)
        if args.check:
            failures = check(info)
            if failures:
                say("\n".join(failures))
                return 1
    except ImageError as exc:
        say(f"image build failed: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""csi-sanity's path commands, run in a UML guest through its agent.

csi-sanity creates the publish and staging folders before each case, checks what a path is
after NodePublishVolume/NodeUnpublishVolume, and removes the folders afterwards. By default it
does so on its own machine; here the driver's node service runs in a UML guest, so those paths
must exist in the guest. csi-sanity runs each ``--csi.*pathcmd`` as ``CMD PATH`` (one argument,
no shell), so :func:`write_commands` writes one small executable per action that calls this file
with the guest agent's address::

    guestpath.py AGENT mkdir PATH   # fails if PATH exists or its parent does not, as
                                    # csi-sanity's own os.Mkdir; prints PATH
    guestpath.py AGENT rmdir PATH   # fails if PATH is not an empty folder
    guestpath.py AGENT check PATH   # prints file, directory, not_found or other

``AGENT`` is ``host:port`` of ``devtools.testbed.agent`` in the guest. Only the standard
library is used, so that the file runs as a plain script, started anew for every call.
"""

from __future__ import annotations

import json
import shlex
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

# POSIX sh in the guest: what a path is, in csi-sanity's words (a dangling symlink is "other").
CHECK = (
    'if [ -d "$1" ]; then echo directory; elif [ -f "$1" ]; then echo file; '
    'elif [ -e "$1" ] || [ -L "$1" ]; then echo other; else echo not_found; fi'
)
ACTIONS: dict[str, Callable[[str], list[str]]] = {
    "mkdir": lambda p: ["mkdir", "--", p],
    "rmdir": lambda p: ["rmdir", "--", p],
    "check": lambda p: ["sh", "-c", CHECK, "sh", p],
}


def guest_exec(agent: str, argv: list[str], timeout: float = 30) -> tuple[int, str, str]:
    """Run ``argv`` in the guest; (exit status, stdout, stderr)."""
    req = urllib.request.Request(
        f"http://{agent}/exec",
        data=json.dumps({"argv": argv, "timeout": timeout}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout + 10) as r:
        res = json.loads(r.read())
    return int(res["rc"]), str(res["stdout"]), str(res["stderr"])


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ACTIONS or not argv[2].startswith("/"):
        print(f"usage: guestpath.py AGENT {{{','.join(ACTIONS)}}} /ABSOLUTE/PATH", file=sys.stderr)
        return 2
    agent, action, path = argv
    try:
        rc, out, err = guest_exec(agent, ACTIONS[action](path))
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        print(f"guestpath: agent {agent} unreachable or failed: {exc}", file=sys.stderr)
        return 1
    if rc != 0:
        print(
            f"guestpath: {action} {path} in the guest exited {rc}: {err.strip()}", file=sys.stderr
        )
        return 1
    print(path if action == "mkdir" else out.strip())
    return 0


def write_commands(folder: Path, agent: str, python: str = sys.executable) -> dict[str, Path]:
    """Executables ``folder/guest-{mkdir,rmdir,check}`` for csi-sanity's path command flags,
    bound to the agent at ``agent`` (``host:port``); returns them by action."""
    folder.mkdir(parents=True, exist_ok=True)
    made = {}
    for action in ACTIONS:
        script = folder / f"guest-{action}"
        cmd = shlex.join([python, "-I", "-S", str(Path(__file__).resolve()), agent, action])
        script.write_text(f'#!/bin/sh\nexec {cmd} "$1"\n')
        script.chmod(0o755)
        made[action] = script
    return made


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Which pod a publish target is for, where the kubelet keeps that pod's cgroup (cgroup v2),
and what its ``io.max`` and ``io.stat`` say (the line written is
:func:`topolvm.iolimits.io_max_line`'s): pure, for :mod:`topolvm.node.iolimiter`
(docs/qos.md).

The kubelet's pod cgroups, relative to the cgroup v2 root:

- cgroupfs driver: ``kubepods/pod<UID>``, ``kubepods/burstable/pod<UID>``,
  ``kubepods/besteffort/pod<UID>``;
- systemd driver: ``kubepods.slice/kubepods-pod<U>.slice``,
  ``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<U>.slice``, and the same
  with ``besteffort``, where ``<U>`` is the UID with ``_`` for ``-``.

A kubelet started with ``--cgroup-root`` puts these under another folder: :func:`is_pod_dir`
recognises a pod's folder by its name alone, for a search below the root.

Whether a node can put limits in force at all is :func:`support`'s answer, from what its
cgroup files say (the Node condition :data:`topolvm.iolimits.NODE_CONDITION`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from topolvm.iolimits import FIELDS

_UID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# a filesystem volume: <kubelet>/pods/<UID>/volumes/kubernetes.io~csi/<pv>/mount
_MOUNT_TARGET = re.compile(rf"/pods/({_UID})/volumes/")
# a block volume: <kubelet>/plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<UID>
_BLOCK_TARGET = re.compile(rf"/volumeDevices/publish/[^/]+/({_UID})/?$")
IO_KEYS = tuple(FIELDS.values())  # rbps, wbps, riops, wiops
PODS_PARENTS = ("kubepods.slice", "kubepods")  # below the root: systemd, cgroupfs driver


def pod_of_target(path: str) -> str | None:
    """The UID of the pod a NodePublishVolume target path is for (None: not a kubelet path)."""
    found = _MOUNT_TARGET.search(path) or _BLOCK_TARGET.search(path)
    return found.group(1) if found else None


def is_block_target(path: str) -> bool:
    """Whether a publish target is a block volume's (a device node bound from /dev)."""
    return _BLOCK_TARGET.search(path) is not None


def pod_dirs(uid: str) -> tuple[str, ...]:
    """Where the kubelet puts the cgroup of pod ``uid``, for each QoS class and driver."""
    u = uid.replace("-", "_")
    return (
        f"kubepods/burstable/pod{uid}",
        f"kubepods/besteffort/pod{uid}",
        f"kubepods/pod{uid}",
        f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice",
        f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice",
        f"kubepods.slice/kubepods-pod{u}.slice",
    )


def is_pod_dir(name: str, uid: str) -> bool:
    """Whether a cgroup folder called ``name`` is the pod ``uid``'s (either driver)."""
    u = uid.replace("-", "_")
    return name == f"pod{uid}" or (name.startswith("kubepods-") and name.endswith(f"pod{u}.slice"))


def parse_device_lines(text: str) -> dict[tuple[int, int], dict[str, str]]:
    """``io.max`` or ``io.stat``: per device, its ``key=value`` pairs (lines that do not
    parse are left out)."""
    out: dict[tuple[int, int], dict[str, str]] = {}
    for line in text.splitlines():
        device, _, rest = line.strip().partition(" ")
        major, sep, minor = device.partition(":")
        if not sep or not major.isdigit() or not minor.isdigit():
            continue
        out[(int(major), int(minor))] = _pairs(rest)
    return out


def _pairs(text: str) -> dict[str, str]:
    """The ``key=value`` words of a cgroup file's line."""
    return dict(p.split("=", 1) for p in text.split() if "=" in p)


def limits_in_force(text: str, major: int, minor: int) -> dict[str, int | None]:
    """What ``io.max`` says for one device: each key's limit, None for ``max`` or absent."""
    pairs = parse_device_lines(text).get((major, minor), {})
    return {k: int(v) if v.isdigit() else None for k in IO_KEYS if (v := pairs.get(k, "max"))}


def stalled_seconds(text: str) -> dict[str, float]:
    """``io.pressure`` (PSI): the time some (``some``) or all (``full``) of the cgroup's tasks
    were stalled on IO, in seconds, from its ``total=`` microseconds."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        kind, _, rest = line.strip().partition(" ")
        pairs = _pairs(rest)
        if kind in ("some", "full") and pairs.get("total", "").isdigit():
            out[kind] = int(pairs["total"]) / 1e6
    return out


def io_counters(text: str, major: int, minor: int) -> dict[str, int]:
    """``io.stat``'s counters for one device (rbytes, wbytes, rios, wios, ...)."""
    pairs = parse_device_lines(text).get((major, minor), {})
    return {k: int(v) for k, v in pairs.items() if v.isdigit()}


@dataclass(frozen=True)
class Support:
    """Whether this node can put IO limits in force, and why not: ``reason`` is the Node
    condition's (CamelCase), ``message`` tells the operator what to change."""

    ok: bool
    reason: str
    message: str


TURNED_OFF, CGROUP_V1, NO_IO, NO_THROTTLING = (
    "TurnedOff", "CgroupV1", "NoIOController", "NoBlockThrottling",
)  # fmt: skip
SUPPORTED, UNCHECKED = "CgroupV2IO", "PodsNotSeenYet"
_AFTER = "; volumes work without limits"


def support(
    node: str, root: str | None, *, v2: bool = True, controllers: str = "",
    folder: str | None = None, folder_controllers: str = "", folder_io_max: bool = False,
) -> Support:  # fmt: skip
    """What the files say: ``root`` the cgroup root topolvm-node sees (None: limits turned off),
    ``v2`` whether it has ``cgroup.controllers``, ``controllers`` that file's text; ``folder``
    the kubelet's pods' folder or one pod's (None: none seen yet), ``folder_controllers`` its
    ``cgroup.controllers`` (those its parent enabled for it) and ``folder_io_max`` whether it
    has ``io.max`` (the io controller with block throttling)."""
    if root is None:
        return Support(False, TURNED_OFF, f"IO limits are off on node {node}: its topolvm-node "
                       "runs with an empty --cgroup-root (chart: node.ioLimits.enabled "
                       "false)" + _AFTER)  # fmt: skip
    if not v2:
        return Support(
            False,
            CGROUP_V1,
            f"{root} on node {node} is not a cgroup v2 hierarchy "
            "(cgroup v1?): IO limits need cgroup v2 with the io controller" + _AFTER,
        )
    if "io" not in controllers.split():
        return Support(False, NO_IO, f"the kernel of node {node} offers no io controller "
                       f"(cgroup.controllers of {root}: {controllers.strip() or 'nothing'})"
                       + _AFTER)  # fmt: skip
    if folder is None:
        return Support(
            True,
            UNCHECKED,
            f"cgroup v2 with the io controller at {root}; the "
            "pods' cgroups are checked when a volume with limits is published",
        )
    enabled = folder_controllers.split()
    if "io" not in enabled:
        return Support(False, NO_IO, f"the io controller is not enabled for pods on node {node} "
                       f"(cgroup.controllers of {folder}: {' '.join(enabled) or 'nothing'})"
                       + _AFTER)  # fmt: skip
    if not folder_io_max:
        return Support(
            False,
            NO_THROTTLING,
            f"the kernel of node {node} has no block throttling "
            f"(CONFIG_BLK_DEV_THROTTLING): {folder} has no io.max" + _AFTER,
        )
    return Support(
        True,
        SUPPORTED,
        f"cgroup v2 with the io controller and block throttling ({folder} takes io.max)",
    )

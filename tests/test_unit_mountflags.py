"""Mount flags (a StorageClass's mountOptions) and target paths: what may reach `mount` as root."""

from __future__ import annotations

import pytest

from topolvm.csi.mountflags import check_mount_flags, check_path, split_options
from topolvm.rpc import status


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["noatime"],
        ["noatime,nodiratime", "discard"],
        ["data=ordered", "commit=60", "logbsize=256k", "compress=zstd:3", "uid=1000"],
        ['context="system_u:object_r:container_file_t:s0:c1,c2"'],
        [""],  # empty flags are dropped
    ],
)
def test_filesystem_options_pass(flags: list[str]) -> None:
    check_mount_flags(flags)


@pytest.mark.parametrize(
    "flag",
    [
        "remount",
        "noatime,bind",
        "rbind",
        "MOVE",
        "rshared",
        "x-mount.mkdir",
        "X-mount.owner=0",
        "helper=evil",
        "loop=/dev/loop7",
        "offset=4096",
    ],
)
def test_options_that_make_mount_do_more_are_refused(flag: str) -> None:
    with pytest.raises(status.InvalidArgument, match="not a filesystem option"):
        check_mount_flags([flag])


@pytest.mark.parametrize(
    "flag",
    ["noatime;reboot", "a b", "$(id)", "noatime\n/dev/sda /mnt", "`x`", "o=\x00", 'k="a"b'],
)
def test_shell_and_table_characters_are_refused(flag: str) -> None:
    with pytest.raises(status.InvalidArgument, match="only letters, digits"):
        check_mount_flags([flag])


def test_commas_inside_quotes_do_not_split() -> None:
    assert split_options('a,context="x,y",b') == ["a", 'context="x,y"', "b"]


@pytest.mark.parametrize(
    "path", ["/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv/mount", "/a b\tc/d", "/x..y"]
)
def test_paths_the_kubelet_makes_pass(path: str) -> None:
    check_path(path, "target_path")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("relative/mount", "absolute"),
        ("/var/lib/kubelet/pods/../../../etc", "'..'"),
        ("/var/lib/kubelet/pods/u/..", "'..'"),
        ("/var/lib/x\x00/etc", "NUL"),
    ],
)
def test_paths_that_escape_are_refused(path: str, why: str) -> None:
    with pytest.raises(status.InvalidArgument, match=why):
        check_path(path, "target_path")

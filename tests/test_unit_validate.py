"""Validation of values that end up on an LVM command line, and LVM error classification."""

from __future__ import annotations

import pytest

from topolvm.lvm.errors import InvalidInput, LvmError
from topolvm.lvm.validate import lv_name, size_bytes, tag

# --- LV names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "123e4567-e89b-12d3-a456-426614174000",  # LogicalVolume UID, as TopoLVM uses
        "pvc-x_y.z+1",
        "a",
        "_x",
        "+x",
        ".x",
        "x" * 127,
        "my-snapshot",  # "snapshot" is only reserved as a prefix
        "tmeta",  # only "_tmeta" is reserved
    ],
)
def test_lv_name_accepts(name: str) -> None:
    assert lv_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "-rf",
        "--help",
        "-",
        "../x",
        "a/b",
        "/dev/sda",
        "a b",
        " a",
        ".",
        "..",
        "snapshot1",
        "snapshot",
        "pvmove0",
        "x_tmeta",
        "x_tdata",
        "x_rimage_0",
        "lvol0_mlog",
        "x_cdata",
        "x" * 128,
        "a\nb",
        "a\n",
        "a\0b",
        "a\0",
        "a;b",
        "$(x)",
        "a*",
        "é",
    ],
)
def test_lv_name_rejects(name: str) -> None:
    with pytest.raises(InvalidInput):
        lv_name(name)


def test_lv_name_error_says_what_was_checked() -> None:
    with pytest.raises(InvalidInput, match="source volume"):
        lv_name("-x", "source volume")


def test_invalid_input_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        lv_name("")


# --- tags --------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["k=v", "a", "a-b", "x/y:z&#!+.", "t" * 1024, "_-"])
def test_tag_accepts(value: str) -> None:
    assert tag(value) == value


@pytest.mark.parametrize(
    "value", ["-x", "", "a b", "t" * 1025, "a,b", "a\nb", "a\0", "a;b", "@x", "é"]
)
def test_tag_rejects(value: str) -> None:
    with pytest.raises(InvalidInput):
        tag(value)


# --- sizes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 4096, 2**30, 2**63 - 1])
def test_size_bytes_accepts(value: int) -> None:
    assert size_bytes(value) == value


@pytest.mark.parametrize("value", [0, -1, -(2**63), 2**63, 2**64])
def test_size_bytes_rejects(value: int) -> None:
    with pytest.raises(InvalidInput):
        size_bytes(value)


# --- LVM error classification (spec §4.1) ------------------------------------------------------

VG_NOT_FOUND = '  Volume group "vg" not found\n  Cannot process volume group vg\n'
LV_NOT_FOUND = '  Failed to find logical volume "vg/lv"\n'
NO_SPACE = '  Volume group "vg" has insufficient free space (10 extents): 20 required.\n'


def error(returncode: int | None, stderr: str) -> LvmError:
    return LvmError(["lvm", "lvremove", "-f", "vg/lv"], returncode, stderr)


@pytest.mark.parametrize(
    ("returncode", "stderr", "expected"),
    [
        (5, VG_NOT_FOUND, True),
        (5, LV_NOT_FOUND, True),
        (5, 'Volume group "" not found', True),
        (3, VG_NOT_FOUND, False),  # exit code must be 5
        (1, LV_NOT_FOUND, False),
        (None, LV_NOT_FOUND, False),  # killed / timed out
        (5, NO_SPACE, False),
        (5, "  Logical volume vg/lv in use.\n", False),
        (5, "", False),
        (5, "volume group vg not found", False),  # not the LVM wording
    ],
)
def test_not_found(returncode: int | None, stderr: str, expected: bool) -> None:
    assert error(returncode, stderr).not_found is expected


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        (NO_SPACE, True),
        (
            "  Insufficient suitable allocatable extents for logical volume lv: 10 more required\n",
            True,
        ),
        (VG_NOT_FOUND, False),
        (LV_NOT_FOUND, False),
        ("", False),
    ],
)
def test_no_space(stderr: str, expected: bool) -> None:
    assert error(5, stderr).no_space is expected


def test_error_message_keeps_command_and_stderr() -> None:
    err = error(5, LV_NOT_FOUND)
    assert err.returncode == 5
    assert err.argv == ["lvm", "lvremove", "-f", "vg/lv"]
    assert err.stderr == 'Failed to find logical volume "vg/lv"'
    text = str(err)
    assert "lvremove -f vg/lv" in text
    assert "exit status 5" in text
    assert 'Failed to find logical volume "vg/lv"' in text


MISSING_PV = (
    "  WARNING: Couldn't find device with uuid IhvRWr-pziW-G2wL-VURF-bwns-BK5A-aa04vh.\n"
    "  WARNING: VG vg2 is missing PV IhvRWr-pziW-G2wL-VURF-bwns-BK5A-aa04vh.\n"
    "  Cannot change VG vg2 while PVs are missing.\n"
)


def test_a_missing_pv_names_the_way_back() -> None:
    err = error(5, MISSING_PV)
    assert err.missing_pv
    assert "Cannot change VG vg2 while PVs are missing" in str(err)
    assert "pvscan --cache" in str(err)  # stale hints: the failure seen in CI (docs/lvmd.md)
    assert not error(5, NO_SPACE).missing_pv
    assert "pvscan" not in str(error(5, NO_SPACE))


def test_a_long_stderr_keeps_the_failure_at_its_end() -> None:
    """Hundreds of warnings (one per missing PV or LV) must not cut the line LVM failed with."""
    noise = "  WARNING: Couldn't find device with uuid IhvRWr-pziW-G2wL-VURF.\n" * 200
    err = error(5, noise + "  Cannot change VG vg2 while PVs are missing.\n")
    assert "...(truncated)..." in err.stderr and len(err.stderr) < 4100
    assert err.stderr.endswith("Cannot change VG vg2 while PVs are missing.")
    assert err.missing_pv


def test_a_missing_pv_warning_on_another_failure_gets_no_hint() -> None:
    """LVM warns of a missing PV on every command while one is gone; a command that failed for
    another reason must not send the operator after the PV."""
    warnings = "".join(MISSING_PV.splitlines(keepends=True)[:2])
    err = error(5, warnings + "  " + NO_SPACE)
    assert err.no_space and not err.missing_pv
    assert "pvscan" not in str(err)
    refused = "  Refusing activation of partial LV vg2/lv1.  Use '--activationmode partial'.\n"
    partial = warnings + refused
    assert error(5, partial).missing_pv


def test_a_pool_component_active_alone_is_named() -> None:
    stderr = (
        "  Activation of logical volume vg1/pool0 is prohibited while logical volume "
        "vg1/pool0_tmeta is active.\n  Aborting. Failed to locally activate thin pool vg1/pool0.\n"
    )
    assert error(5, stderr).active_component == "vg1/pool0_tmeta"
    assert error(5, stderr).component_active
    unnamed = "  Cannot resize logical volume vg1/t0 with active component LV(s).\n"
    assert error(5, unnamed).component_active and error(5, unnamed).active_component is None
    assert not error(5, NO_SPACE).component_active
    assert error(5, NO_SPACE).active_component is None


def test_a_thin_pool_whose_kernel_transaction_lags_says_how_to_repair_it() -> None:
    """What LVM printed in the crash test after a kill between its two halves of a thin LV's
    creation: the error sends the operator to the repair, not to the pool's free space."""
    refused = (
        "  WARNING: Thin pool vg1/pool0 has unexpected transaction id 23, expecting 25 or lower "
        "by 1.\n  Cannot create new thin volume, free space in thin pool vg1/pool0 reached "
        "threshold.\n"
    )
    err = error(5, refused)
    assert err.pool_transaction_lags and not err.no_space
    assert "transaction id in the kernel differs from LVM's metadata" in str(err)
    assert "docs/lvmd.md#troubleshooting" in str(err)
    # as libdm words it (checked in a UML guest), naming the pool's device
    at_activation = (
        "  Thin pool vg1-pool0-tpool (253:2) transaction_id is 1, while expected 2.\n"
        "  Failed to suspend vg1/pool0 with queued messages.\n"
    )
    assert error(5, at_activation).pool_transaction_lags
    assert not error(5, NO_SPACE).pool_transaction_lags
    assert "transaction id" not in str(error(5, NO_SPACE))

"""lvmd configuration file: keys, defaults and validation rules (spec §3)."""

from __future__ import annotations

import pytest

from topolvm.config.errors import ConfigError
from topolvm.config.lvmd import DeviceClassType, lvmd_config, parse_lvmd_config

GiB = 1 << 30
NSENTER_PREFIX = ("/usr/bin/nsenter", "-m", "-u", "-i", "-n", "-p", "-t", "1", "/sbin/lvm")

# deploy/lvmd-config/lvmd.yaml (spec §3.1)
EXAMPLE = """\
socket-name: /run/topolvm/lvmd.sock
device-classes:
  - name: ssd
    volume-group: myvg1
    default: true
    spare-gb: 10
  - name: ssd-thin
    volume-group: myvg1
    type: thin
    thin-pool:
      name: thinpool
      overprovision-ratio: 10.0
"""


def one_class(extra: str = "", name: str = "dc", vg: str = "myvg1") -> str:
    """A config with a single device class; ``extra`` is indented into the class mapping."""
    lines = [f"  {line}" for line in extra.splitlines()]
    return "\n".join(["device-classes:", f"- name: {name!r}", f"  volume-group: {vg!r}", *lines])


def reject(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_lvmd_config(text, "lvmd.yaml")
    return str(info.value)


# --- valid configurations ----------------------------------------------------------------------


def test_spec_example_parses() -> None:
    config = parse_lvmd_config(EXAMPLE, "lvmd.yaml")
    assert config.socket_name == "/run/topolvm/lvmd.sock"
    assert [dc.name for dc in config.device_classes] == ["ssd", "ssd-thin"]
    ssd, thin = config.device_classes
    assert ssd.volume_group == "myvg1"
    assert ssd.default is True
    assert ssd.spare_gb == 10
    assert ssd.spare_bytes == 10 * GiB
    assert ssd.type is DeviceClassType.THICK
    assert not ssd.is_thin
    assert ssd.target == "myvg1"
    assert thin.volume_group == "myvg1"
    assert thin.default is False
    assert thin.is_thin
    assert thin.pool.name == "thinpool"
    assert thin.pool.overprovision_ratio == 10.0
    assert thin.target == "myvg1/thinpool"


def test_defaults_when_omitted() -> None:
    config = parse_lvmd_config(one_class(), "lvmd.yaml")
    assert config.socket_name == "/run/topolvm/lvmd.sock"
    assert config.lvcreate_option_classes == ()
    assert config.lvm_command_prefix is None
    (dc,) = config.device_classes
    assert dc.spare_gb == 10
    assert dc.spare_bytes == 10 * GiB
    assert dc.type is DeviceClassType.THICK
    assert dc.default is False
    assert dc.stripe is None
    assert dc.stripe_size == ""
    assert dc.lvcreate_options == ()
    assert dc.thin_pool is None


def test_explicit_zero_spare_is_kept() -> None:
    (dc,) = parse_lvmd_config(one_class("spare-gb: 0"), "lvmd.yaml").device_classes
    assert dc.spare_gb == 0
    assert dc.spare_bytes == 0


@pytest.mark.parametrize("value", ["''", "thick"])
def test_empty_type_means_thick(value: str) -> None:
    (dc,) = parse_lvmd_config(one_class(f"type: {value}"), "lvmd.yaml").device_classes
    assert dc.type is DeviceClassType.THICK


@pytest.mark.parametrize("name", ["a", "ssd", "ssd-thin", "A.b_c-9", "x" * 63])
def test_valid_device_class_names(name: str) -> None:
    (dc,) = parse_lvmd_config(one_class(name=name), "lvmd.yaml").device_classes
    assert dc.name == name


@pytest.mark.parametrize("size", ["4k", "64", "1M", "2g", "8S", ""])
def test_valid_stripe_size(size: str) -> None:
    (dc,) = parse_lvmd_config(
        one_class(f"stripe: 2\nstripe-size: {size!r}"), "lvmd.yaml"
    ).device_classes
    assert dc.stripe_size == size


def test_thick_and_thin_share_a_volume_group() -> None:
    text = """\
device-classes:
- name: thick
  volume-group: vg
- name: thin
  volume-group: vg
  type: thin
  thin-pool: {name: pool, overprovision-ratio: 1.0}
"""
    config = parse_lvmd_config(text, "lvmd.yaml")
    assert [dc.target for dc in config.device_classes] == ["vg", "vg/pool"]


def test_two_thin_classes_on_different_pools_of_one_vg() -> None:
    text = """\
device-classes:
- name: t1
  volume-group: vg
  type: thin
  thin-pool: {name: pool1, overprovision-ratio: 2}
- name: t2
  volume-group: vg
  type: thin
  thin-pool: {name: pool2, overprovision-ratio: 2}
"""
    config = parse_lvmd_config(text, "lvmd.yaml")
    assert [dc.target for dc in config.device_classes] == ["vg/pool1", "vg/pool2"]


def test_lvcreate_option_classes() -> None:
    text = one_class() + "\nlvcreate-option-classes:\n- name: raid1\n  options: ['--type=raid1']\n"
    config = parse_lvmd_config(text, "lvmd.yaml")
    oc = config.option_class("raid1")
    assert oc is not None
    assert oc.options == ("--type=raid1",)
    assert config.option_class("other") is None


# --- device class lookup, command prefix, stripe arguments --------------------------------------


def test_device_class_lookup() -> None:
    config = parse_lvmd_config(EXAMPLE, "lvmd.yaml")
    default = config.device_class("")
    assert default is not None
    assert default.name == "ssd"
    thin = config.device_class("ssd-thin")
    assert thin is not None
    assert thin.name == "ssd-thin"
    assert config.device_class("ssd") is default
    assert config.device_class("nvme") is None
    assert config.default_class is default


def test_empty_name_without_default_class_is_not_found() -> None:
    config = parse_lvmd_config(one_class(), "lvmd.yaml")
    assert config.device_class("") is None
    assert config.default_class is None


def test_command_prefix_default_is_nsenter() -> None:
    config = parse_lvmd_config(one_class(), "lvmd.yaml")
    assert config.command_prefix == NSENTER_PREFIX


def test_configured_command_prefix_replaces_default() -> None:
    text = "lvm-command-prefix: [/usr/sbin/lvm]\n" + one_class()
    config = parse_lvmd_config(text, "lvmd.yaml")
    assert config.command_prefix == ("/usr/sbin/lvm",)


def test_stripe_args() -> None:
    config = lvmd_config(
        {
            "device-classes": [
                {"name": "s", "volume-group": "vg1", "stripe": 2, "stripe-size": "64k"},
                {"name": "n", "volume-group": "vg2"},
                {"name": "i", "volume-group": "vg3", "stripe": 3},
            ]
        }
    )
    striped, plain, no_size = config.device_classes
    assert striped.stripe_args() == ["-i", "2", "-I", "64k"]
    assert plain.stripe_args() == []
    assert no_size.stripe_args() == ["-i", "3"]


# --- validation rules (spec §3): each error names the key path and the value --------------------


@pytest.mark.parametrize(
    ("extra", "name", "vg", "path", "value"),
    [
        ("", "", "vg", "device-classes[0].name", "''"),
        ("", "x" * 64, "vg", "device-classes[0].name", "x" * 64),
        ("", "-bad", "vg", "device-classes[0].name", "'-bad'"),
        ("", "bad-", "vg", "device-classes[0].name", "'bad-'"),
        ("", "a b", "vg", "device-classes[0].name", "'a b'"),
        ("", "a/b", "vg", "device-classes[0].name", "'a/b'"),
        ("", "dc", "", "device-classes[0].volume-group", "''"),
        ("spare-gb: -1", "dc", "vg", "device-classes[0].spare-gb", "-1"),
        ("type: thinn", "dc", "vg", "device-classes[0].type", "'thinn'"),
        ("type: THIN", "dc", "vg", "device-classes[0].type", "'THIN'"),
        (
            "type: thin\nthin-pool: {name: '', overprovision-ratio: 2}",
            "dc",
            "vg",
            "device-classes[0].thin-pool.name",
            "''",
        ),
        (
            "type: thin\nthin-pool: {name: pool, overprovision-ratio: 0.99}",
            "dc",
            "vg",
            "device-classes[0].thin-pool.overprovision-ratio",
            "0.99",
        ),
        ("stripe-size: 10x", "dc", "vg", "device-classes[0].stripe-size", "'10x'"),
        ("stripe-size: 4kb", "dc", "vg", "device-classes[0].stripe-size", "'4kb'"),
        ("stripe: -2", "dc", "vg", "device-classes[0].stripe", "-2"),
    ],
)
def test_invalid_scalar_is_rejected_naming_key_and_value(
    extra: str, name: str, vg: str, path: str, value: str
) -> None:
    message = reject(one_class(extra, name=name, vg=vg))
    assert message.startswith("lvmd.yaml: ")
    assert path in message
    assert value in message


def test_thin_without_thin_pool_is_rejected() -> None:
    message = reject(one_class("type: thin"))
    assert "device-classes[0]" in message
    assert "thin-pool" in message


def test_thin_pool_without_ratio_is_rejected() -> None:
    message = reject(one_class("type: thin\nthin-pool: {name: pool}"))
    assert "device-classes[0].thin-pool.overprovision-ratio" in message


def test_missing_device_classes_key_is_rejected() -> None:
    message = reject("socket-name: /tmp/lvmd.sock\n")
    assert "device-classes" in message
    assert "required" in message


@pytest.mark.parametrize("key", ["name", "volume-group"])
def test_missing_required_device_class_key(key: str) -> None:
    entry = {"name": "dc", "volume-group": "vg"}
    del entry[key]
    message = reject("device-classes:\n- " + "\n  ".join(f"{k}: {v}" for k, v in entry.items()))
    assert f"device-classes[0].{key}" in message
    assert "required" in message


def test_no_device_class_is_rejected() -> None:
    message = reject("device-classes: []\n")
    assert "should have at least one device-class" in message


def test_no_device_class_error_names_the_key() -> None:
    assert "device-classes" in reject("device-classes: []\n")


TWO_CLASSES = """\
device-classes:
- name: {n1}
  volume-group: {vg1}
  default: {d1}
- name: {n2}
  volume-group: {vg2}
  default: {d2}
"""


def test_duplicate_name_is_rejected() -> None:
    text = TWO_CLASSES.format(n1="ssd", vg1="vg1", d1="false", n2="ssd", vg2="vg2", d2="false")
    message = reject(text)
    assert "duplicate device-class name" in message
    assert "'ssd'" in message


def test_two_thick_classes_on_one_vg_are_rejected() -> None:
    text = TWO_CLASSES.format(n1="a", vg1="vg1", d1="false", n2="b", vg2="vg1", d2="false")
    message = reject(text)
    assert "'a'" in message
    assert "'b'" in message
    assert "'vg1'" in message


def test_two_thin_classes_on_one_pool_are_rejected() -> None:
    text = """\
device-classes:
- name: t1
  volume-group: vg
  type: thin
  thin-pool: {name: pool, overprovision-ratio: 2}
- name: t2
  volume-group: vg
  type: thin
  thin-pool: {name: pool, overprovision-ratio: 5}
"""
    message = reject(text)
    assert "'t1'" in message
    assert "'t2'" in message
    assert "'vg/pool'" in message


def test_more_than_one_default_is_rejected() -> None:
    text = TWO_CLASSES.format(n1="a", vg1="vg1", d1="true", n2="b", vg2="vg2", d2="true")
    message = reject(text)
    assert "default" in message
    assert "'a'" in message
    assert "'b'" in message


@pytest.mark.parametrize(
    ("n2", "vg2", "d2", "path"),
    [
        ("a", "vg2", "false", "device-classes[1].name"),
        ("b", "vg1", "false", "device-classes[1]"),
        ("b", "vg2", "true", "device-classes[1].default"),
    ],
    ids=["duplicate-name", "duplicate-target", "second-default"],
)
def test_cross_item_errors_name_the_offending_entry(n2: str, vg2: str, d2: str, path: str) -> None:
    text = TWO_CLASSES.format(n1="a", vg1="vg1", d1="true", n2=n2, vg2=vg2, d2=d2)
    assert path in reject(text)


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        (one_class("spare_gb: 3"), "device-classes[0].spare_gb", "3"),
        (one_class("thin_pool: {}"), "device-classes[0].thin_pool", ""),
        ("socket_name: /x\n" + one_class(), "socket_name", "'/x'"),
        (one_class("type: thin\nthin-pool: {name: p, overprovision-ratio: 2, ratio: 3}"),
         "device-classes[0].thin-pool.ratio", "3"),
    ],
)  # fmt: skip
def test_unknown_key_is_rejected_naming_it(text: str, path: str, value: str) -> None:
    message = reject(text)
    assert path in message
    assert "unknown key" in message
    assert value in message


@pytest.mark.parametrize(
    ("text", "kind"),
    [("- a\n- b\n", "list"), ("just a string\n", "str"), ("", "NoneType"), ("42\n", "int")],
)
def test_yaml_that_is_not_a_mapping_is_rejected(text: str, kind: str) -> None:
    message = reject(text)
    assert message.startswith("lvmd.yaml: ")
    assert "mapping" in message
    assert kind in message


@pytest.mark.parametrize("text", ["device-classes: [\n", "a: b: c\n", "\tdevice-classes: []\n"])
def test_invalid_yaml_is_rejected(text: str) -> None:
    message = reject(text)
    assert message.startswith("lvmd.yaml: ")
    assert "YAML" in message


def test_config_is_immutable() -> None:
    config = parse_lvmd_config(EXAMPLE, "lvmd.yaml")
    with pytest.raises(AttributeError, match="immutable"):
        config.device_classes[0].spare_gb = 0  # type: ignore[misc]


# --- divergences from upstream (sigs.k8s.io/yaml + Go validation) -------------------------------


def test_thin_pool_block_is_ignored_for_thick_class() -> None:
    text = one_class("thin-pool: {name: '', overprovision-ratio: 0.5}")
    (dc,) = parse_lvmd_config(text, "lvmd.yaml").device_classes
    assert not dc.is_thin
    assert dc.target == "myvg1"


@pytest.mark.parametrize(
    "extra", ["spare-gb: true", "spare-gb: '10'", "default: 'yes'", "stripe: '2'"]
)
def test_scalar_of_wrong_type_is_rejected(extra: str) -> None:
    message = reject(one_class(extra))
    assert "device-classes[0]." + extra.split(":", maxsplit=1)[0] in message


@pytest.mark.parametrize(("ratio", "value"), [("1.5e1", 15.0), ("1e3", 1000.0), ("'2'", 2.0)])
def test_ratio_in_exponent_form_loads(ratio: str, value: float) -> None:
    # PyYAML reads 1e3 as a string; upstream's YAML parser reads a number (the old pydantic
    # model accepted both too).
    text = one_class(f"type: thin\nthin-pool: {{name: p, overprovision-ratio: {ratio}}}")
    (dc,) = parse_lvmd_config(text, "lvmd.yaml").device_classes
    assert dc.pool.overprovision_ratio == value


@pytest.mark.parametrize("ratio", [".inf", "'inf'", ".nan", "x"])
def test_ratio_that_is_not_a_finite_number_is_rejected(ratio: str) -> None:
    message = reject(one_class(f"type: thin\nthin-pool: {{name: p, overprovision-ratio: {ratio}}}"))
    assert "device-classes[0].thin-pool.overprovision-ratio" in message

"""lvmd configuration file (``lvmd.yaml``), with upstream TopoLVM's keys and validation rules."""

from __future__ import annotations

import contextlib
import enum
import math
import re
from pathlib import Path
from typing import Annotated, Any

import msgspec

from topolvm.config.decode import convert, read_mapping
from topolvm.config.errors import ConfigError, invalid
from topolvm.lvm.command import DEFAULT_PREFIX

GiB = 1 << 30
DEFAULT_SOCKET = "/run/topolvm/lvmd.sock"
DEFAULT_SPARE_GB = 10
_DC_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_STRIPE_SIZE = re.compile(r"(?i)([0-9]*)(k|m|g|t|p|e|b|s)?")
_VG_NAME = re.compile(r"[A-Za-z0-9+_.][A-Za-z0-9+_.-]*")

NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class _Struct(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A mapping of the file: unknown keys are errors, values cannot be reassigned."""


def _lvm_name(key: str, value: str, what: str) -> None:
    if not value:
        raise invalid(key, f"{what} must not be empty")
    if len(value) > 127 or _VG_NAME.fullmatch(value) is None or value in (".", ".."):
        raise invalid(key, f"{what} is not a valid LVM name")


class DeviceClassType(enum.StrEnum):
    THICK = "thick"
    THIN = "thin"


class ThinPoolConfig(_Struct, frozen=True, kw_only=True):
    name: str
    overprovision_ratio: float = msgspec.field(name="overprovision-ratio")

    def __post_init__(self) -> None:
        _lvm_name("name", self.name, "thin pool name")
        if not (self.overprovision_ratio >= 1.0 and math.isfinite(self.overprovision_ratio)):
            raise invalid("overprovision-ratio", "should be a finite number >= 1.0")


class DeviceClass(_Struct, frozen=True, kw_only=True):
    name: str
    volume_group: str = msgspec.field(name="volume-group")
    default: bool = False
    spare_gb: NonNegative = msgspec.field(default=DEFAULT_SPARE_GB, name="spare-gb")
    stripe: Annotated[int, msgspec.Meta(ge=0, lt=2**32)] | None = None
    stripe_size: str = msgspec.field(default="", name="stripe-size")
    lvcreate_options: tuple[str, ...] = msgspec.field(default=(), name="lvcreate-options")
    type: DeviceClassType = DeviceClassType.THICK
    thin_pool: ThinPoolConfig | None = msgspec.field(default=None, name="thin-pool")

    def __post_init__(self) -> None:
        if not self.name:
            raise invalid("name", "device-class name should not be empty")
        if len(self.name) > 63:
            raise invalid("name", "device-class name is too long (max 63 characters)")
        if _DC_NAME.fullmatch(self.name) is None:
            raise invalid(
                "name",
                "device-class name should consist of alphanumerics, '-', '_' or '.', "
                "and should start and end with an alphanumeric",
            )
        _lvm_name("volume-group", self.volume_group, "volume-group")
        if self.spare_gb >= 2**64:
            raise invalid("spare-gb", "should be below 2^64")
        if _STRIPE_SIZE.fullmatch(self.stripe_size) is None:
            raise invalid("stripe-size", 'stripe-size format is "Size[k|UNIT]"')
        if self.type is DeviceClassType.THIN and self.thin_pool is None:
            raise invalid("thin-pool", f"device-class {self.name!r} has type thin but no thin-pool")

    @property
    def is_thin(self) -> bool:
        return self.type is DeviceClassType.THIN

    @property
    def pool(self) -> ThinPoolConfig:
        if self.thin_pool is None or not self.is_thin:
            raise ValueError(f"device-class {self.name!r} is not thin")
        return self.thin_pool

    @property
    def spare_bytes(self) -> int:
        return self.spare_gb * GiB

    @property
    def target(self) -> str:
        """What the class allocates from: ``<vg>`` (thick) or ``<vg>/<pool>`` (thin)."""
        return f"{self.volume_group}/{self.pool.name}" if self.is_thin else self.volume_group

    def stripe_args(self) -> list[str]:
        if not self.stripe:
            return []
        args = ["-i", str(self.stripe)]
        if self.stripe_size:
            args += ["-I", self.stripe_size]
        return args


class LvcreateOptionClass(_Struct, frozen=True, kw_only=True):
    name: str
    options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise invalid("name", "lvcreate-option-class name should not be empty")


class LvmdConfig(_Struct, frozen=True, kw_only=True):
    socket_name: str = msgspec.field(default=DEFAULT_SOCKET, name="socket-name")
    device_classes: tuple[DeviceClass, ...] = msgspec.field(name="device-classes")
    lvcreate_option_classes: tuple[LvcreateOptionClass, ...] = msgspec.field(
        default=(), name="lvcreate-option-classes"
    )
    lvm_command_prefix: tuple[str, ...] | None = msgspec.field(
        default=None, name="lvm-command-prefix"
    )

    def __post_init__(self) -> None:
        if not self.socket_name:
            raise invalid("socket-name", "socket-name should not be empty")
        prefix = self.lvm_command_prefix
        if prefix is not None and (not prefix or any(not a for a in prefix)):
            raise invalid("lvm-command-prefix", "must be a non-empty list naming the lvm binary")
        # Cross-item rules; each names the key path of the offending entry.
        if not self.device_classes:
            raise invalid("device-classes", "should have at least one device-class")
        names: set[str] = set()
        targets: dict[str, str] = {}
        default: str | None = None
        for i, dc in enumerate(self.device_classes):
            at = f"device-classes[{i}]"
            if dc.name in names:
                raise invalid(f"{at}.name", f"duplicate device-class name {dc.name!r}")
            names.add(dc.name)
            if dc.target in targets:
                raise invalid(
                    at,
                    f"device-classes {targets[dc.target]!r} and {dc.name!r} use the same "
                    f"target {dc.target!r} (thick: volume-group, thin: volume-group/thin-pool)",
                )
            targets[dc.target] = dc.name
            if dc.default:
                if default is not None:
                    raise invalid(
                        f"{at}.default",
                        f"only one default device-class is allowed, but "
                        f"{default!r} and {dc.name!r} are both default",
                    )
                default = dc.name
        seen: set[str] = set()
        for i, oc in enumerate(self.lvcreate_option_classes):
            if oc.name in seen:
                raise invalid(
                    f"lvcreate-option-classes[{i}].name",
                    f"duplicate lvcreate-option-class name {oc.name!r}",
                )
            seen.add(oc.name)

    @property
    def command_prefix(self) -> tuple[str, ...]:
        return self.lvm_command_prefix or DEFAULT_PREFIX

    def device_class(self, name: str) -> DeviceClass | None:
        """Resolve a request's device class: "" means the default class."""
        for dc in self.device_classes:
            if (name == "" and dc.default) or (name != "" and dc.name == name):
                return dc
        return None

    @property
    def default_class(self) -> DeviceClass | None:
        return next((dc for dc in self.device_classes if dc.default), None)

    def option_class(self, name: str) -> LvcreateOptionClass | None:
        return next((oc for oc in self.lvcreate_option_classes if oc.name == name), None)


def _prepare(data: dict[Any, Any], source: str) -> dict[Any, Any]:
    """Upstream's leniencies, applied before the types are checked: an empty ``type`` is thick,
    and a thick class's ``thin-pool`` block is ignored (not validated)."""
    classes = data.get("device-classes")
    if not isinstance(classes, list):
        return data
    return {**data, "device-classes": [_lenient(dc, f"{source}: device-classes[{i}]")
                                       for i, dc in enumerate(classes)]}  # fmt: skip


def _lenient(dc: Any, at: str) -> Any:
    if not isinstance(dc, dict):
        return dc
    pool = dc.get("thin-pool")
    if isinstance(pool, dict) and isinstance(ratio := pool.get("overprovision-ratio"), str):
        # YAML 1.1 (PyYAML) reads 1e3 and 1.5e1 as strings; upstream's parser reads numbers.
        with contextlib.suppress(ValueError):  # if not a number, msgspec names key and value
            dc = {**dc, "thin-pool": {**pool, "overprovision-ratio": float(ratio)}}
    kind = dc.get("type")
    if kind in (None, "", "thick"):
        return {**{k: v for k, v in dc.items() if k != "thin-pool"}, "type": "thick"}
    if kind != "thin":
        raise ConfigError(f"{at}.type: type should be 'thick' or 'thin' (value {kind!r})")
    return dc


def lvmd_config(data: dict[Any, Any], source: str = "lvmd config") -> LvmdConfig:
    """An lvmd configuration from the file's decoded mapping."""
    return convert(_prepare(data, source), LvmdConfig, source)


def parse_lvmd_config(text: str, source: str = "lvmd config") -> LvmdConfig:
    return lvmd_config(read_mapping(text, source), source)


def load_lvmd_config(path: str | Path) -> LvmdConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read lvmd config {p}: {e.strerror}") from e
    return parse_lvmd_config(text, str(p))

"""lvmd configuration file (``lvmd.yaml``), with upstream TopoLVM's keys and validation rules."""

from __future__ import annotations

import enum
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from topolvm.config.errors import ConfigError, describe
from topolvm.lvm.command import DEFAULT_PREFIX

GiB = 1 << 30
DEFAULT_SOCKET = "/run/topolvm/lvmd.sock"
DEFAULT_SPARE_GB = 10
_DC_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_STRIPE_SIZE = re.compile(r"(?i)([0-9]*)(k|m|g|t|p|e|b|s)?")
_VG_NAME = re.compile(r"[A-Za-z0-9+_.][A-Za-z0-9+_.-]*")


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", validate_by_name=False, validate_by_alias=True, frozen=True
    )


def _lvm_name(value: str, what: str) -> str:
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > 127 or _VG_NAME.fullmatch(value) is None or value in (".", ".."):
        raise ValueError(f"{what} is not a valid LVM name")
    return value


class DeviceClassType(enum.StrEnum):
    THICK = "thick"
    THIN = "thin"


class ThinPoolConfig(_Model):
    name: str
    overprovision_ratio: float = Field(alias="overprovision-ratio")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _lvm_name(v, "thin pool name")

    @field_validator("overprovision_ratio")
    @classmethod
    def _ratio(cls, v: float) -> float:
        if not v >= 1.0:
            raise ValueError("overprovision-ratio should be >= 1.0")
        return v


class DeviceClass(_Model):
    name: str
    volume_group: str = Field(alias="volume-group")
    default: StrictBool = False
    spare_gb: Annotated[StrictInt, Field(ge=0, lt=2**64)] = Field(
        DEFAULT_SPARE_GB, alias="spare-gb"
    )
    stripe: Annotated[StrictInt, Field(ge=0, lt=2**32)] | None = None
    stripe_size: str = Field("", alias="stripe-size")
    lvcreate_options: tuple[str, ...] = Field((), alias="lvcreate-options")
    type: DeviceClassType = DeviceClassType.THICK
    thin_pool: ThinPoolConfig | None = Field(None, alias="thin-pool")

    @model_validator(mode="before")
    @classmethod
    def _ignore_thin_pool_of_thick(cls, data: Any) -> Any:
        # Upstream ignores thin-pool on thick classes; so do we (it is not validated).
        if isinstance(data, dict) and data.get("type") in (None, "", "thick"):
            data = {k: v for k, v in data.items() if k != "thin-pool"}
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v:
            raise ValueError("device-class name should not be empty")
        if len(v) > 63:
            raise ValueError("device-class name is too long (max 63 characters)")
        if _DC_NAME.fullmatch(v) is None:
            raise ValueError(
                "device-class name should consist of alphanumerics, '-', '_' or '.', "
                "and should start and end with an alphanumeric"
            )
        return v

    @field_validator("volume_group")
    @classmethod
    def _vg(cls, v: str) -> str:
        return _lvm_name(v, "volume-group")

    @field_validator("stripe_size")
    @classmethod
    def _stripe_size(cls, v: str) -> str:
        if _STRIPE_SIZE.fullmatch(v) is None:
            raise ValueError('stripe-size format is "Size[k|UNIT]"')
        return v

    @field_validator("type", mode="before")
    @classmethod
    def _type(cls, v: Any) -> Any:
        if v in ("", None):
            return DeviceClassType.THICK
        if v not in ("thick", "thin"):
            raise ValueError("type should be 'thick' or 'thin'")
        return v

    @model_validator(mode="after")
    def _thin(self) -> DeviceClass:
        if self.type is DeviceClassType.THIN and self.thin_pool is None:
            raise ValueError(f"device-class {self.name!r} has type thin but no thin-pool")
        return self

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


class LvcreateOptionClass(_Model):
    name: str
    options: tuple[str, ...] = ()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v:
            raise ValueError("lvcreate-option-class name should not be empty")
        return v


class LvmdConfig(_Model):
    socket_name: str = Field(DEFAULT_SOCKET, alias="socket-name")
    device_classes: tuple[DeviceClass, ...] = Field(alias="device-classes")
    lvcreate_option_classes: tuple[LvcreateOptionClass, ...] = Field(
        (), alias="lvcreate-option-classes"
    )
    lvm_command_prefix: tuple[str, ...] | None = Field(None, alias="lvm-command-prefix")

    @field_validator("socket_name")
    @classmethod
    def _socket(cls, v: str) -> str:
        if not v:
            raise ValueError("socket-name should not be empty")
        return v

    @field_validator("lvm_command_prefix")
    @classmethod
    def _prefix(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is not None and (not v or any(not a for a in v)):
            raise ValueError("lvm-command-prefix must be a non-empty list naming the lvm binary")
        return v

    @model_validator(mode="after")
    def _classes(self) -> LvmdConfig:
        # Cross-item rules; messages start with the key path of the offending entry.
        if not self.device_classes:
            raise ValueError("device-classes: should have at least one device-class")
        names: set[str] = set()
        targets: dict[str, str] = {}
        default: str | None = None
        for i, dc in enumerate(self.device_classes):
            at = f"device-classes[{i}]"
            if dc.name in names:
                raise ValueError(f"{at}.name: duplicate device-class name {dc.name!r}")
            names.add(dc.name)
            if dc.target in targets:
                raise ValueError(
                    f"{at}: device-classes {targets[dc.target]!r} and {dc.name!r} use the same "
                    f"target {dc.target!r} (thick: volume-group, thin: volume-group/thin-pool)"
                )
            targets[dc.target] = dc.name
            if dc.default:
                if default is not None:
                    raise ValueError(
                        f"{at}.default: only one default device-class is allowed, but "
                        f"{default!r} and {dc.name!r} are both default"
                    )
                default = dc.name
        seen: set[str] = set()
        for i, oc in enumerate(self.lvcreate_option_classes):
            if oc.name in seen:
                raise ValueError(
                    f"lvcreate-option-classes[{i}].name: duplicate lvcreate-option-class "
                    f"name {oc.name!r}"
                )
            seen.add(oc.name)
        return self

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


def parse_lvmd_config(text: str, source: str = "lvmd config") -> LvmdConfig:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys, got {type(data).__name__}")
    try:
        return LvmdConfig.model_validate(data)
    except ValidationError as e:
        raise describe(e, source) from e


def load_lvmd_config(path: str | Path) -> LvmdConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read lvmd config {p}: {e.strerror}") from e
    return parse_lvmd_config(text, str(p))

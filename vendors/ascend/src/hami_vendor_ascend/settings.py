"""The `ascend` section of the configuration: HAMi's `vnpus` device config plus the node side's options.

Owns the names, defaults and validation of every Ascend option:

* cluster-wide (scheduler, webhook): ``hamiVnpuMode``, the mode of pods without the ``huawei.com/vnpu-mode``
  annotation, and ``chips``, per common word the chip's whole-card memory, AI cores and vNPU templates
  (`hami_vendor_ascend.chips`; an entry given replaces the built-in one), and ``runtimeClassName``;
* node side (the node daemon): ``hamiVnpuCore`` (this node serves soft-split pods: it registers its cores as
  percentages and publishes the node annotation ``hami-vnpu-core: "true"``), ``deviceCoreScaling`` (the soft-split
  compute budget, 100 × the scaling, as HAMi's device plugin registers it), ``deviceSplitCount`` (how many
  containers may share a chip; HAMi's rule by default), the DCMI library and ``npu-smi`` to discover with, and the
  host paths of the soft split (``hookPath``, ``libraryDir``, ``driverMounts``) and the isolation library's
  options (``libvnpuLogLevel``, ``disableCoreLimit``).

Read as every vendor's section is (core's `hami.vendorstate.VendorSettings`): HAMi's camelCase or the field's name,
a misspelled key refused with its name. (HAMi's request defaults, ``defaultMem``/``defaultCores``, are not Ascend
options: a chip's request is a template.) The node side's state (the DCMI session and the chips found) is kept with
the settings object (`hami_vendor_ascend.node.runtime_for`), never validated.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import Field, field_validator

from hami.vendorstate import VendorSettings
from hami_vendor_ascend.chips import COMMON_WORDS, DEFAULT_CHIPS, AscendChip

__all__ = ["SOFT_SPLIT", "TEMPLATE", "AscendSettings", "VnpuMode"]

VnpuMode = Literal["template", "hami-core"]
SOFT_SPLIT: Final = "hami-core"
TEMPLATE: Final = "template"

HAMI_DRIVER_MOUNTS = (
    "/usr/local/bin/npu-smi",
    "/etc/ascend_install.info",
    "/usr/local/Ascend/driver/lib64/driver",
    "/usr/local/Ascend/driver/version.info",
)
"""What HAMi's device plugin mounts read-only into soft-split containers."""


class AscendSettings(VendorSettings):
    """The `ascend` section of the configuration (HAMi's `vnpus:` device config and device-plugin options)."""

    # ---------------------------------------------------------------------------------- cluster
    default_vnpu_mode: VnpuMode = Field(
        default=TEMPLATE,
        validation_alias="hamiVnpuMode",
        description="the mode of pods without the `huawei.com/vnpu-mode` annotation",
    )
    chips: Mapping[str, AscendChip] = Field(
        default_factory=lambda: dict(DEFAULT_CHIPS),
        description="common word → chip; entries given replace the built-in entry of that chip",
    )
    runtime_class_name: str = Field(
        default="",
        description="runtimeClassName set at admission on pods asking for Ascend devices (and naming none)",
    )

    # ---------------------------------------------------------------------------------- node side
    hami_vnpu_core: bool = Field(
        default=False,
        description="this node serves soft-split pods (registers cores as percent, publishes hami-vnpu-core: true)",
    )
    device_core_scaling: float = Field(
        default=1.0,
        ge=1.0,
        le=100.0,
        description="soft split: each chip registers round(100 × this) cores (compute oversold above 1)",
    )
    device_split_count: int | None = Field(
        default=None,
        ge=1,
        description="containers that may share a chip; default HAMi's: whole-card memory / smallest template",
    )
    dcmi_library: Path | None = Field(
        default=None,
        description="libdcmi.so to load; default: found by the dynamic loader, then in the driver's directory",
    )
    npu_smi: str = Field(
        default="npu-smi",
        min_length=1,
        description="npu-smi command (name on PATH, or a path): discovery's fallback when DCMI is absent",
    )
    hook_path: Path = Field(
        default=Path("/usr/local/hami-vnpu-core"),
        description="HAMi's HOOK_PATH for Ascend: per-container accounting directories live in <hookPath>/containers",
    )
    library_dir: Path | None = Field(
        default=None,
        description="host directory of an operator-managed libvnpu.so and ld.so.preload, mounted instead of the "
        "library the node daemon installed (default: the installed one; without one, <hookPath>)",
    )
    driver_mounts: tuple[str, ...] = Field(
        default=HAMI_DRIVER_MOUNTS,
        description="host paths mounted read-only at the same path into soft-split containers (HAMi's list)",
    )
    libvnpu_log_level: Literal["", "0", "1", "2", "3", "4"] = Field(default="")
    disable_core_limit: bool = False

    @field_validator("chips", mode="before")
    @classmethod
    def _known_chips(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(COMMON_WORDS))
            if unknown:
                raise ValueError(f"unknown Ascend chip {', '.join(unknown)}: the chips are {', '.join(COMMON_WORDS)}")
        return value

    @field_validator("chips", mode="after")
    @classmethod
    def _over_builtin(cls, value: Mapping[str, AscendChip]) -> Mapping[str, AscendChip]:
        return {**DEFAULT_CHIPS, **value}

    @field_validator("driver_mounts")
    @classmethod
    def _absolute(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            if not path.startswith("/"):
                raise ValueError(f"driver mount {path!r} is not an absolute host path")
        return value

    def split_count(self, common_word: str) -> int:
        """How many containers may share one chip of `common_word`: ``deviceSplitCount``, else HAMi's rule (the
        whole-card memory over the smallest template's, 1 for a chip without templates)."""
        if self.device_split_count is not None:
            return self.device_split_count
        chip = self.chips[common_word]
        if not chip.templates:
            return 1
        return max(1, chip.memory_allocatable // chip.templates[0].memory)

    def registered_cores(self, common_word: str) -> int:
        """The cores a chip registers: its AI cores, or in soft split the percent budget (100 × scaling)."""
        if self.hami_vnpu_core:
            return round(100 * self.device_core_scaling)
        return self.chips[common_word].ai_core

    @property
    def containers_dir(self) -> Path:
        """``<hookPath>/containers``: one accounting directory per soft-split container."""
        return self.hook_path / "containers"

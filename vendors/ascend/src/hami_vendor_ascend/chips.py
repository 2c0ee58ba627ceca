"""Ascend chips as HAMi's device config (`vnpus:`) describes them: whole-card memory, AI cores, vNPU templates.

Data for the plugin's settings (`hami_vendor_ascend.settings`, where a cluster replaces any chip's entry), and the
two questions the rest of the vendor asks of a chip: which template a memory size rounds up to (the smallest
that holds it; none above the largest, where HAMi gives the whole card), and which template a recorded grant
is. Values are HAMi v2.10's chart (charts/hami/templates/scheduler/device-configmap.yaml) unless a comment says
otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["COMMON_WORDS", "DEFAULT_CHIPS", "AscendChip", "VnpuTemplate"]

COMMON_WORDS = ("Ascend910A", "Ascend910B2", "Ascend910B3", "Ascend910B4", "Ascend910B4-1", "Ascend310P", "Ascend910C")
"""HAMi v2.10's common words, one device kind each."""


class VnpuTemplate(BaseModel):
    """One vNPU template the driver can cut a chip into (`npu-smi info -t template-info`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(min_length=1, description="the driver's template name, e.g. `vir05_1c_16g`")
    memory: int = Field(gt=0, description="MiB the template gives")
    ai_core: int = Field(gt=0, alias="aiCore", description="AI cores the template gives")
    ai_cpu: int | None = Field(default=None, ge=0, alias="aiCPU", description="AI CPUs, None where HAMi lists none")


class AscendChip(BaseModel):
    """One chip's entry of HAMi's `vnpus` device config: its whole-card memory and cores, and its templates."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    chip_name: str = Field(min_length=1, alias="chipName", description="the chip name DCMI reports, e.g. `910B3`")
    memory_allocatable: int = Field(gt=0, alias="memoryAllocatable", description="MiB a whole card gives a pod")
    memory_capacity: int = Field(gt=0, alias="memoryCapacity", description="MiB the card has")
    ai_core: int = Field(gt=0, alias="aiCore")
    ai_cpu: int | None = Field(default=None, ge=0, alias="aiCPU")
    templates: tuple[VnpuTemplate, ...] = Field(default=(), description="sorted smallest memory first")
    super_pod: bool = Field(
        default=False,
        alias="superPod",
        description="whole cards come in modules of two dies (Atlas A3 super pods): one becomes two, odd counts "
        "are refused, and several are placed as whole modules",
    )

    @field_validator("templates", mode="after")
    @classmethod
    def _smallest_first(cls, value: tuple[VnpuTemplate, ...]) -> tuple[VnpuTemplate, ...]:
        return tuple(sorted(value, key=lambda t: t.memory))

    @model_validator(mode="after")
    def _consistent(self) -> AscendChip:
        if self.memory_allocatable > self.memory_capacity:
            raise ValueError(
                f"memoryAllocatable {self.memory_allocatable} is more than memoryCapacity {self.memory_capacity}"
            )
        names = [t.name for t in self.templates]
        if len(set(names)) != len(names):
            raise ValueError(f"template names repeat: {names}")
        for t in self.templates:
            if t.memory > self.memory_capacity or t.ai_core > self.ai_core:
                raise ValueError(
                    f"template {t.name} ({t.memory} MiB, {t.ai_core} AI cores) is bigger than the chip "
                    f"({self.memory_capacity} MiB, {self.ai_core} AI cores)"
                )
        return self

    def template_for(self, memory: int) -> VnpuTemplate | None:
        """The smallest template holding `memory` MiB; None when none does (the whole card serves it)."""
        for template in self.templates:
            if memory <= template.memory:
                return template
        return None

    def template_named(self, name: str) -> VnpuTemplate | None:
        for template in self.templates:
            if template.name == name:
                return template
        return None


def _chip(
    name: str,
    allocatable: int,
    capacity: int,
    ai_core: int,
    ai_cpu: int | None,
    *templates: VnpuTemplate,
    super_pod: bool = False,
) -> AscendChip:
    return AscendChip(
        chip_name=name,
        memory_allocatable=allocatable,
        memory_capacity=capacity,
        ai_core=ai_core,
        ai_cpu=ai_cpu,
        templates=templates,
        super_pod=super_pod,
    )


def _t(name: str, memory: int, ai_core: int, ai_cpu: int | None = None) -> VnpuTemplate:
    return VnpuTemplate(name=name, memory=memory, ai_core=ai_core, ai_cpu=ai_cpu)


DEFAULT_CHIPS: Mapping[str, AscendChip] = {
    "Ascend910A": _chip(
        "910A",
        32768,
        32768,
        30,
        None,
        _t("vir02", 2184, 2),
        _t("vir04", 4369, 4),
        _t("vir08", 8738, 8),
        _t("vir16", 17476, 16),
    ),
    "Ascend910B2": _chip(
        "910B2",
        65536,
        65536,
        24,
        6,
        _t("vir03_1c_8g", 8192, 3, 1),
        _t("vir06_1c_16g", 16384, 6, 1),
        _t("vir12_3c_32g", 32768, 12, 3),
    ),
    "Ascend910B3": _chip(
        "910B3", 65536, 65536, 20, 7, _t("vir05_1c_16g", 16384, 5, 1), _t("vir10_3c_32g", 32768, 10, 3)
    ),
    "Ascend910B4": _chip("910B4", 32768, 32768, 20, 7, _t("vir05_1c_8g", 8192, 5, 1), _t("vir10_3c_16g", 16384, 10, 3)),
    # HAMi's sources disagree on 910B4-1's templates (8g/16g in one version, 16g/32g in another): none until
    # checked on a card (`npu-smi info -t template-info`); whole cards are unaffected.
    "Ascend910B4-1": _chip("910B4-1", 65536, 65536, 20, 7),
    "Ascend310P": _chip(
        "310P3", 21527, 24576, 8, 7, _t("vir01", 3072, 1, 1), _t("vir02", 6144, 2, 2), _t("vir04", 12288, 4, 4)
    ),
    # HAMi's chart lists no 910C templates. These are the Atlas A3 inference card's (the name spells the
    # cores, AI CPUs and GiB); A3 training cards have vir06_1c_16g / vir12_3c_32g instead: set them here.
    # Its two dies pair into modules on super pods (HAMi's `superPod`).
    "Ascend910C": _chip(
        "Ascend910",
        65536,
        65536,
        20,
        7,
        _t("vir05_1c_16g", 16384, 5, 1),
        _t("vir10_3c_32g", 32768, 10, 3),
        super_pod=True,
    ),
}

"""The Ascend vendor plugin: HAMi v2.10's `huawei.com/<chip>` resources and per-chip `hami.io/…-<chip>` annotations.

Owns one device kind per Ascend chip (HAMi's common words `Ascend910A` … `Ascend910C`), their settings (the
default vNPU mode and each chip's memory, AI cores and vNPU templates, as HAMi's device config lists them),
and reading container requests, including the two Ascend rules:

- `huawei.com/<chip>-core` is honoured only in soft-split mode (pod annotation `huawei.com/vnpu-mode:
  hami-core`, or `hamiVnpuMode: hami-core` in the settings); in template mode the template fixes the cores.
- several devices in one container are whole cards only: memory or a partial core share with a count
  above 1 is refused. The one exception is memory equal to a whole card, which HAMi's own webhook writes
  into every container it admits; such a request is read as whole cards.

The templates are data for the fitting that comes later (it rounds memory up to the smallest template
that holds it). Discovery through DCMI, fitting, container edits and the hami-vnpu-core library are not
built yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hami import hookimpl
from hami.errors import RequestError
from hami.model import (
    AnnotationKeys,
    Container,
    ContainerRequest,
    DeviceKind,
    Pod,
    RegisterFormat,
    ResourceNames,
    VendorInfo,
)
from hami.requests import read_share_request

COMMON_WORDS = ("Ascend910A", "Ascend910B2", "Ascend910B3", "Ascend910B4", "Ascend910B4-1", "Ascend310P", "Ascend910C")

VNPU_MODE_ANNOTATION = "huawei.com/vnpu-mode"
SOFT_SPLIT = "hami-core"
TEMPLATE = "template"
VnpuMode = Literal["template", "hami-core"]


def _kind(word: str) -> DeviceKind:
    return DeviceKind(
        common_word=word,
        resources=ResourceNames(
            count=f"huawei.com/{word}", memory=f"huawei.com/{word}-memory", cores=f"huawei.com/{word}-core"
        ),
        annotations=AnnotationKeys(
            node_register=f"hami.io/node-register-{word}",
            node_handshake=f"hami.io/node-handshake-{word}",
            to_allocate=f"hami.io/{word}-devices-to-allocate",
            allocated=f"hami.io/{word}-devices-allocated",
            use_uuid=f"hami.io/use-{word}-uuid",
            nouse_uuid=f"hami.io/no-use-{word}-uuid",
        ),
        register_format=RegisterFormat.JSON,
    )


INFO = VendorInfo(name="ascend", display_name="Huawei Ascend", kinds=tuple(_kind(w) for w in COMMON_WORDS))


# --------------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------------


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


def _chip(name: str, allocatable: int, capacity: int, ai_core: int, ai_cpu: int | None, *templates: VnpuTemplate) -> AscendChip:
    return AscendChip(
        chip_name=name,
        memory_allocatable=allocatable,
        memory_capacity=capacity,
        ai_core=ai_core,
        ai_cpu=ai_cpu,
        templates=templates,
    )


def _t(name: str, memory: int, ai_core: int, ai_cpu: int | None = None) -> VnpuTemplate:
    return VnpuTemplate(name=name, memory=memory, ai_core=ai_core, ai_cpu=ai_cpu)


DEFAULT_CHIPS: Mapping[str, AscendChip] = {
    # HAMi chart device-configmap.yaml (vnpus), v2.10.
    "Ascend910A": _chip(
        "910A", 32768, 32768, 30, None, _t("vir02", 2184, 2), _t("vir04", 4369, 4), _t("vir08", 8738, 8), _t("vir16", 17476, 16)
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
    "Ascend910B3": _chip("910B3", 65536, 65536, 20, 7, _t("vir05_1c_16g", 16384, 5, 1), _t("vir10_3c_32g", 32768, 10, 3)),
    "Ascend910B4": _chip("910B4", 32768, 32768, 20, 7, _t("vir05_1c_8g", 8192, 5, 1), _t("vir10_3c_16g", 16384, 10, 3)),
    # HAMi's sources disagree on 910B4-1's templates (8g/16g in one version, 16g/32g in another): none until
    # checked on a card (`npu-smi info -t template-info`); whole cards are unaffected.
    "Ascend910B4-1": _chip("910B4-1", 65536, 65536, 20, 7),
    "Ascend310P": _chip(
        "310P3", 21527, 24576, 8, 7, _t("vir01", 3072, 1, 1), _t("vir02", 6144, 2, 2), _t("vir04", 12288, 4, 4)
    ),
    # HAMi's chart lists no 910C templates. These are the Atlas A3 inference card's (the name spells the
    # cores, AI CPUs and GiB); A3 training cards have vir06_1c_16g / vir12_3c_32g instead: set them here.
    "Ascend910C": _chip("Ascend910", 65536, 65536, 20, 7, _t("vir05_1c_16g", 16384, 5, 1), _t("vir10_3c_32g", 32768, 10, 3)),
}


class AscendSettings(BaseModel):
    """The `ascend` section of the configuration (HAMi's `vnpus:` device config)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    default_vnpu_mode: VnpuMode = Field(
        default=TEMPLATE,
        alias="hamiVnpuMode",
        description=f"the mode of pods without the `{VNPU_MODE_ANNOTATION}` annotation",
    )
    chips: Mapping[str, AscendChip] = Field(
        default_factory=lambda: dict(DEFAULT_CHIPS),
        description="common word → chip; entries given replace the built-in entry of that chip",
    )

    @field_validator("chips", mode="after")
    @classmethod
    def _known_chips(cls, value: Mapping[str, AscendChip]) -> Mapping[str, AscendChip]:
        unknown = sorted(set(value) - set(COMMON_WORDS))
        if unknown:
            raise ValueError(f"unknown Ascend chip {', '.join(unknown)}: the chips are {', '.join(COMMON_WORDS)}")
        return {**DEFAULT_CHIPS, **value}


# --------------------------------------------------------------------------------------------------------
# Hooks
# --------------------------------------------------------------------------------------------------------


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> AscendSettings:
    return AscendSettings.model_validate(raw)


def vnpu_mode(pod: Pod, settings: AscendSettings) -> VnpuMode:
    """The pod's vNPU mode: its `huawei.com/vnpu-mode` annotation, else the configured default."""
    value = pod.annotations.get(VNPU_MODE_ANNOTATION)
    if value is None:
        return settings.default_vnpu_mode
    if value == SOFT_SPLIT:
        return SOFT_SPLIT
    if value == TEMPLATE:
        return TEMPLATE
    raise RequestError(VNPU_MODE_ANNOTATION, value, f"is not a vNPU mode: write {SOFT_SPLIT} (soft split) or {TEMPLATE}")


@hookimpl
def hami_container_request(kind: DeviceKind, container: Container, pod: Pod, settings: AscendSettings) -> ContainerRequest | None:
    cores_name = f"{kind.resources.count}-core"
    raw_cores = container.resource(cores_name)
    if raw_cores is not None and vnpu_mode(pod, settings) != SOFT_SPLIT:
        raise RequestError(
            cores_name,
            raw_cores,
            f"is honoured only in soft-split mode: add the pod annotation {VNPU_MODE_ANNOTATION}: {SOFT_SPLIT}, "
            "or remove it (in template mode the vNPU template sets the cores)",
        )
    request = read_share_request(kind, container)
    if request is None or request.count == 1:
        return request
    return _whole_cards(kind, container, request, settings.chips[kind.common_word])


def _whole_cards(kind: DeviceKind, container: Container, request: ContainerRequest, chip: AscendChip) -> ContainerRequest:
    """A request for several devices: whole cards, or a refusal naming the partial share."""
    partial = None
    if request.memory and not chip.memory_allocatable <= request.memory <= chip.memory_capacity:
        partial = f"{kind.resources.count}-memory"
    elif request.cores not in (0, 100):
        partial = f"{kind.resources.count}-core"
    if partial:
        raise RequestError(
            partial,
            container.resource(partial) or "",
            f"asks for part of a card, but {request.count} {kind.common_word} devices are whole cards only: "
            f"leave out {partial}, or ask for 1 device",
        )
    return ContainerRequest(kind=kind.common_word, count=request.count, memory_percentage=100, cores=100)

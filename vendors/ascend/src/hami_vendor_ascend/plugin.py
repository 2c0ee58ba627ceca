"""The Ascend vendor plugin: HAMi v2.10's `huawei.com/<chip>` resources and per-chip `hami.io/…-<chip>` annotations.

Owns one device kind per Ascend chip (HAMi's common words `Ascend910A` … `Ascend910C`), their settings (the
default vNPU mode and each chip's memory, AI cores and vNPU templates, as HAMi's device config lists them),
and reading container requests, including the two Ascend rules:

- `huawei.com/<chip>-core` is honoured only in soft-split mode (pod annotation `huawei.com/vnpu-mode:
  hami-core`, or `hamiVnpuMode: hami-core` in the settings); in template mode the template fixes the cores.
- several devices in one container are whole cards only: memory or a partial core share with a count
  above 1 is refused. The one exception is memory equal to a whole card, which HAMi's own webhook writes
  into every container it admits; such a request is read as whole cards.

The chip data lives in `hami_vendor_ascend.chips`; the templates are for the fitting that comes later (it
rounds memory up to the smallest template that holds it). Discovery through DCMI, fitting, container edits
and the hami-vnpu-core library are not built yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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
from hami_vendor_ascend.chips import DEFAULT_CHIPS, AscendChip

COMMON_WORDS = ("Ascend910A", "Ascend910B2", "Ascend910B3", "Ascend910B4", "Ascend910B4-1", "Ascend310P", "Ascend910C")

VNPU_MODE_ANNOTATION = "huawei.com/vnpu-mode"
VnpuMode = Literal["template", "hami-core"]
SOFT_SPLIT: Final = "hami-core"
TEMPLATE: Final = "template"


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
    raise RequestError(
        VNPU_MODE_ANNOTATION, value, f"is not a vNPU mode: write {SOFT_SPLIT} (soft split) or {TEMPLATE}"
    )


@hookimpl
def hami_container_request(
    kind: DeviceKind, container: Container, pod: Pod, settings: AscendSettings
) -> ContainerRequest | None:
    mode = vnpu_mode(pod, settings)
    cores_name = f"{kind.resources.count}-core"
    raw_cores = container.resource(cores_name)
    if raw_cores is not None and mode != SOFT_SPLIT:
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


def _whole_cards(
    kind: DeviceKind, container: Container, request: ContainerRequest, chip: AscendChip
) -> ContainerRequest:
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

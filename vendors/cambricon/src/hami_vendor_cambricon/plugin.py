"""The Cambricon vendor plugin: HAMi v2.10's `cambricon.com/*` resources and `hami.io/cambricon-mlu-*` annotations.

Owns the MLU device kind's metadata, its settings, and reading container requests. Memory is asked in units
of 256 MiB (`cambricon.com/mlu.smlu.vmemory: 4` is 1024 MiB). As in HAMi, a container that names memory but
not `cambricon.com/mlu.smlu.vcore` gets the whole compute of its MLU (`defaultCores`, 100), since Cambricon's
dynamic sMLU needs a compute share for every slice.

HAMi publishes no register annotation for MLUs: the scheduler derives the devices from the node's capacity.
Discovery, fitting, the `CAMBRICON_DSMLU_*` pod annotations and container edits are not built yet; sharing
is enforced by Cambricon's own device plugin (dynamic sMLU), so there is no isolation library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from hami import hookimpl
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
from hami.requests import ShareDefaults, read_share_request

KIND = DeviceKind(
    common_word="MLU",
    resources=ResourceNames(
        count="cambricon.com/vmlu",
        memory="cambricon.com/mlu.smlu.vmemory",
        cores="cambricon.com/mlu.smlu.vcore",
        memory_unit_mib=256,
    ),
    annotations=AnnotationKeys(
        to_allocate="hami.io/cambricon-mlu-devices-to-allocate",
        allocated="hami.io/cambricon-mlu-devices-allocated",
        use_uuid="cambricon.com/use-gpuuuid",
        nouse_uuid="cambricon.com/nouse-gpuuuid",
        use_type="cambricon.com/use-mlutype",
        nouse_type="cambricon.com/nouse-mlutype",
    ),
    register_format=RegisterFormat.CAPACITY,
)

INFO = VendorInfo(name="cambricon", display_name="Cambricon", kinds=(KIND,))


class CambriconSettings(ShareDefaults):
    """The `cambricon` section of the configuration."""

    default_cores: int = Field(
        default=100, ge=0, le=100, alias="defaultCores", description="percent when memory is given without cores"
    )


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> CambriconSettings:
    return CambriconSettings.model_validate(raw)


@hookimpl
def hami_container_request(
    kind: DeviceKind, container: Container, pod: Pod, settings: CambriconSettings
) -> ContainerRequest | None:
    return read_share_request(kind, container, defaults=settings)

"""The Moore Threads vendor plugin: HAMi v2.10's `mthreads.com/*` resources and `hami.io/mthreads-vgpu-*` annotations.

Owns the `Mthreads` device kind's metadata, its settings, and reading container requests with the sGPU rules
of Moore Threads' MT CloudNative Toolkit, which enforces the share:

- memory (`mthreads.com/sgpu-memory`) comes in units of 512 MiB and only in the sizes 2, 4, 8, 16, 32, 64
  and 96 units; any other value is refused with the legal ones listed.
- cores (`mthreads.com/sgpu-core`) are in the GPU's own units, not percent: a whole GPU has 16, so values
  above 16 are refused, and a whole-GPU request carries cores 16.
- several GPUs in one container are whole GPUs: with a count above 1, memory and cores are read as whole
  GPUs whatever they say (HAMi's webhook rewrites them to 96 × count and 16 × count; their values must
  still be numbers).

HAMi publishes no register annotation for these GPUs: the scheduler derives them from the node's capacity.
Discovery, fitting, the `mthreads.com/*` pod annotations and container edits are not built yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

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
from hami.requests import read_count, read_share_request

COUNT = "mthreads.com/vgpu"
MEMORY = "mthreads.com/sgpu-memory"
CORES = "mthreads.com/sgpu-core"
MEMORY_UNIT_MIB = 512
LEGAL_MEMORY_UNITS = (2, 4, 8, 16, 32, 64, 96)
CORES_PER_GPU = 16
CORE_UNIT = "sixteenths of a GPU"

KIND = DeviceKind(
    common_word="Mthreads",
    resources=ResourceNames(
        count=COUNT,
        memory=MEMORY,
        cores=CORES,
        memory_unit_mib=MEMORY_UNIT_MIB,
    ),
    annotations=AnnotationKeys(
        to_allocate="hami.io/mthreads-vgpu-devices-to-allocate",
        allocated="hami.io/mthreads-vgpu-devices-allocated",
        use_uuid="mthreads.ai/use-gpuuuid",
        nouse_uuid="mthreads.ai/nouse-gpuuuid",
    ),
    register_format=RegisterFormat.CAPACITY,
)

INFO = VendorInfo(name="mthreads", display_name="Moore Threads", kinds=(KIND,))


class MthreadsSettings(BaseModel):
    """The `mthreads` section of the configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    default_cores: int = Field(
        default=0,
        ge=0,
        le=CORES_PER_GPU,
        alias="defaultCores",
        description=f"cores ({CORE_UNIT}) when memory is given without cores",
    )


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> MthreadsSettings:
    return MthreadsSettings.model_validate(raw)


@hookimpl
def hami_container_request(
    kind: DeviceKind, container: Container, pod: Pod, settings: MthreadsSettings
) -> ContainerRequest | None:
    count = read_count(container, COUNT, unit="devices", limit=1024)
    if count is not None and count > 1:
        read_count(container, MEMORY, unit=f"{MEMORY_UNIT_MIB} MiB")
        read_count(container, CORES, unit=CORE_UNIT)
        return whole_gpus(count)
    cores = read_count(container, CORES, unit=CORE_UNIT, limit=CORES_PER_GPU)
    request = read_share_request(kind, container, default_cores=settings.default_cores)
    if request is None:
        return None
    memory_units = read_count(container, MEMORY, unit=f"{MEMORY_UNIT_MIB} MiB")
    if memory_units is None:
        return request if cores is not None else whole_gpus(request.count)
    if memory_units not in LEGAL_MEMORY_UNITS:
        raise RequestError(
            MEMORY,
            container.resource(MEMORY) or "",
            f"is not an sGPU memory size: write one of {', '.join(map(str, LEGAL_MEMORY_UNITS))} "
            f"(units of {MEMORY_UNIT_MIB} MiB)",
        )
    return request


def whole_gpus(count: int) -> ContainerRequest:
    """`count` whole GPUs: all their memory and all 16 of their cores."""
    return ContainerRequest(kind=KIND.common_word, count=count, memory_percentage=100, cores=CORES_PER_GPU)

"""The NVIDIA vendor plugin: HAMi v2.10's `nvidia.com/*` resources and `hami.io/vgpu-*` annotations.

Owns the NVIDIA device kind's metadata, its settings (defaults for memory and cores), and reading container
requests, and fitting shared GPUs with core's `ShareFitter` (selectors, cordon, exclusivity, binpack, spread,
mutex, NUMA). Discovery through NVML, topology-aware and MIG placement, container edits and the isolation
library are not built yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hami import hookimpl
from hami.fitting import ShareFitter
from hami.model import (
    AnnotationKeys,
    Container,
    ContainerRequest,
    DeviceKind,
    NodeFit,
    NodeView,
    Pod,
    ResourceNames,
    SchedulingPolicy,
    VendorInfo,
)
from hami.requests import read_share_request

KIND = DeviceKind(
    common_word="NVIDIA",
    resources=ResourceNames(
        count="nvidia.com/gpu",
        memory="nvidia.com/gpumem",
        memory_percentage="nvidia.com/gpumem-percentage",
        cores="nvidia.com/gpucores",
        priority="nvidia.com/priority",
    ),
    annotations=AnnotationKeys(
        node_register="hami.io/node-nvidia-register",
        node_handshake="hami.io/node-handshake",
        to_allocate="hami.io/vgpu-devices-to-allocate",
        allocated="hami.io/vgpu-devices-allocated",
        use_uuid="nvidia.com/use-gpuuuid",
        nouse_uuid="nvidia.com/nouse-gpuuuid",
        use_type="nvidia.com/use-gputype",
        nouse_type="nvidia.com/nouse-gputype",
    ),
)

INFO = VendorInfo(name="nvidia", display_name="NVIDIA", kinds=(KIND,))


class NvidiaSettings(BaseModel):
    """The `nvidia` section of the configuration (HAMi's `nvidia:` scheduler and device-plugin options)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    default_memory: int = Field(default=0, ge=0, alias="defaultMem", description="MiB when a count comes alone")
    default_cores: int = Field(default=0, ge=0, le=100, alias="defaultCores")
    device_split_count: int = Field(default=10, ge=1, alias="deviceSplitCount")
    device_memory_scaling: float = Field(default=1.0, gt=0, alias="deviceMemoryScaling")
    device_core_scaling: float = Field(default=1.0, gt=0, alias="deviceCoreScaling")


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> NvidiaSettings:
    return NvidiaSettings.model_validate(raw)


@hookimpl
def hami_container_request(
    kind: DeviceKind, container: Container, pod: Pod, settings: NvidiaSettings
) -> ContainerRequest | None:
    return read_share_request(
        kind, container, default_memory=settings.default_memory, default_cores=settings.default_cores
    )


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
) -> list[NodeFit]:
    return ShareFitter(kind).fit_nodes(pod, requests, nodes, policy)

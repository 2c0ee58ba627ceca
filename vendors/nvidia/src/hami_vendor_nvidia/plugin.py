"""The NVIDIA vendor plugin: HAMi v2.10's `nvidia.com/*` resources and `hami.io/vgpu-*` annotations.

Every hook implementation of the vendor, in the order a pod meets them; each is a thin call into the module
that owns the rule:

* metadata and settings here (`KIND`, `INFO`; `hami_vendor_nvidia.settings`);
* discovery through NVML (`hami_vendor_nvidia.discovery`, the driver binding in `hami_vendor_nvidia.nvml`);
* requests and admission defaults (`hami_vendor_nvidia.admission`);
* fitting: shared GPUs on core's building blocks, MIG instances, NUMA binding, topology
  (`hami_vendor_nvidia.fit`, `hami_vendor_nvidia.mig`, `hami.topology`);
* allocation and release of MIG instances and accounting directories (`hami_vendor_nvidia.allocation`);
* container edits for the kubelet (`hami_vendor_nvidia.edits`).

It must stay free of rules of its own, so that the plugin guide can show each hook as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami import hookimpl
from hami.findings import Finding
from hami.isolation.grant import Grant
from hami.model import (
    AdmissionEdit,
    Allocation,
    AnnotationKeys,
    Container,
    ContainerEdits,
    ContainerPlacement,
    ContainerRequest,
    Device,
    DeviceKind,
    DeviceProcess,
    DeviceReading,
    DraDevice,
    IsolationLibrary,
    NodeFit,
    NodeInventory,
    NodeView,
    Pod,
    ResourceNames,
    SchedulingPolicy,
    VendorInfo,
)
from hami_vendor_nvidia import admission, allocation, discovery, doctor, edits, node
from hami_vendor_nvidia.fit import NvidiaFitter, nvlink_islands
from hami_vendor_nvidia.settings import NvidiaSettings

__all__ = [
    "INFO",
    "KIND",
    "NvidiaSettings",
    "hami_admission_defaults",
    "hami_allocate",
    "hami_container_edits",
    "hami_container_request",
    "hami_device_processes",
    "hami_discover_devices",
    "hami_doctor_checks",
    "hami_dra_device",
    "hami_fit_nodes",
    "hami_host_environment",
    "hami_release",
    "hami_vendor_info",
    "hami_vendor_settings",
]

# --------------------------------------------------------------------------------------------------------
# Metadata
# --------------------------------------------------------------------------------------------------------

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
    reusable_fits=True,  # a fit reads the pod's annotations, the policy and the node's view, nothing of the moment
)

INFO = VendorInfo(name="nvidia", display_name="NVIDIA", kinds=(KIND,), isolation_library=edits.LIBRARY_FILE)


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> NvidiaSettings:
    return NvidiaSettings.model_validate(raw)


# --------------------------------------------------------------------------------------------------------
# Discovery (node daemon)
# --------------------------------------------------------------------------------------------------------


@hookimpl
def hami_discover_devices(settings: NvidiaSettings) -> list[NodeInventory]:
    return discovery.discover(settings)


# --------------------------------------------------------------------------------------------------------
# Requests and admission (webhook and scheduler)
# --------------------------------------------------------------------------------------------------------


@hookimpl
def hami_container_request(kind: DeviceKind, container: Container, settings: NvidiaSettings) -> ContainerRequest | None:
    return admission.container_request(kind, container, settings)


@hookimpl
def hami_admission_defaults(
    kind: DeviceKind, container: Container, pod: Pod, settings: NvidiaSettings
) -> AdmissionEdit | None:
    return admission.admission_defaults(kind, container, pod, settings)


# --------------------------------------------------------------------------------------------------------
# Fitting (scheduler extender and simulator): all candidate nodes in one call
# --------------------------------------------------------------------------------------------------------


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
) -> list[NodeFit]:
    return NvidiaFitter(kind, pod, policy).fit_nodes(requests, nodes)


@hookimpl
def hami_device_islands(node: NodeView) -> dict[str, str]:
    return nvlink_islands(node)


# --------------------------------------------------------------------------------------------------------
# Allocation (node daemon, inside the kubelet's Allocate) and release
# --------------------------------------------------------------------------------------------------------


@hookimpl
def hami_allocate(
    pod: Pod, container_index: int, devices: ContainerPlacement, settings: NvidiaSettings
) -> Allocation | None:
    return allocation.allocate(settings, pod, container_index, devices)


@hookimpl
def hami_release(pod: Pod, placements: Sequence[ContainerPlacement], settings: NvidiaSettings) -> None:
    allocation.release(settings, pod, placements)


# --------------------------------------------------------------------------------------------------------
# Container edits (node daemon, the answer to the kubelet)
# --------------------------------------------------------------------------------------------------------


@hookimpl
def hami_container_edits(
    pod: Pod,
    container_index: int,
    devices: ContainerPlacement,
    settings: NvidiaSettings,
    library: IsolationLibrary | None,
) -> ContainerEdits:
    return edits.container_edits(settings, pod, container_index, devices, library)


@hookimpl
def hami_dra_device(device: Device) -> DraDevice | None:
    """A GPU in MIG mode stays out of the ResourceSlice: its MIG partitions are not published yet, and the whole
    GPU is not a device a claim can share (its memory is the instances'). Others: core's defaults."""
    return DraDevice(published=False) if device.mode == "mig" else None


@hookimpl
def hami_device_processes(settings: NvidiaSettings) -> list[DeviceProcess] | None:
    return node.device_processes(settings)


@hookimpl
def hami_device_readings(settings: NvidiaSettings) -> list[DeviceReading] | None:
    return node.device_readings(settings)


@hookimpl
def hami_host_environment(devices: ContainerPlacement) -> dict[str, str]:
    """A host process (`hami run`) sees the placement's GPUs, in order, through CUDA's own selector (UUIDs)."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(d.uuid for d in devices)}


@hookimpl
def hami_doctor_checks(settings: NvidiaSettings, grant: Grant | None) -> list[Finding]:
    return doctor.checks(settings, grant)

"""The Moore Threads vendor plugin: HAMi v2.10's `mthreads.com/*` resources and `hami.io/mthreads-vgpu-*` annotations.

Every hook of the vendor, each a thin call into the module that owns the rule:

* metadata here (`INFO`: the ``Mthreads`` kind, registered as HAMi reads it, from the node's capacity, 16 cores
  per GPU) and settings (`hami_vendor_mthreads.settings`);
* discovery through MTML, or ``mthreads-gmi`` without it (`hami_vendor_mthreads.discovery`, the binding in
  `hami_vendor_mthreads.mtml`, the tool in `hami_vendor_mthreads.gmi`), and each GPU's memory in use, busy share,
  power and temperature for the node monitor (`hami_device_readings`, from MTML);
* requests and admission defaults: HAMi's sGPU rules (`hami_vendor_mthreads.requests`);
* fitting: core's share and topology fitter with HAMi's one-GPU-per-pod rule and pod annotations
  (`hami_vendor_mthreads.fit`);
* allocation and release: the soft mode's accounting directories (`hami_vendor_mthreads.allocation`);
* container edits: the device nodes and environment of Moore Threads' device plugin, and in ``hami-core`` mode the
  isolation library ``libvmusa.so`` (`hami_vendor_mthreads.edits`);
* the kernel's DRM client statistics of the GPUs (``drm-driver`` ``mtgpu``, ``drm-pdev`` → the GPU), which the node
  daemon's backstop reads where the operator turned them on (``drmFdinfo``): MTML has no per-process memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami import hookimpl
from hami.findings import Finding
from hami.isolation.grant import Grant
from hami.model import (
    AdmissionEdit,
    AnnotationKeys,
    Container,
    ContainerEdits,
    ContainerPlacement,
    ContainerRequest,
    DeviceKind,
    DeviceReading,
    DrmUsageSource,
    IsolationLibrary,
    NodeFit,
    NodeInventory,
    NodeView,
    Pod,
    RegisterFormat,
    ResourceNames,
    SchedulingPolicy,
    VendorInfo,
)
from hami_vendor_mthreads import allocation, discovery, edits, requests
from hami_vendor_mthreads.doctor import checks as doctor_checks
from hami_vendor_mthreads.fit import MthreadsFitter
from hami_vendor_mthreads.requests import LEGAL_MEMORY_UNITS, MEMORY_UNIT_MIB
from hami_vendor_mthreads.settings import CORES_PER_GPU, MthreadsSettings

__all__ = ["CORES_PER_GPU", "INFO", "KIND", "LEGAL_MEMORY_UNITS", "MEMORY_UNIT_MIB", "MthreadsSettings"]

KIND = DeviceKind(
    common_word="Mthreads",
    resources=ResourceNames(
        count="mthreads.com/vgpu",
        memory="mthreads.com/sgpu-memory",
        cores="mthreads.com/sgpu-core",
        memory_unit_mib=MEMORY_UNIT_MIB,
    ),
    annotations=AnnotationKeys(
        node_register=discovery.REGISTER_ANNOTATION,
        to_allocate="hami.io/mthreads-vgpu-devices-to-allocate",
        allocated="hami.io/mthreads-vgpu-devices-allocated",
        use_uuid="mthreads.ai/use-gpuuuid",
        nouse_uuid="mthreads.ai/nouse-gpuuuid",
    ),
    register_format=RegisterFormat.CAPACITY,
    capacity_by_cores=discovery.CAPACITY_NAME,
    capacity_cores_per_device=CORES_PER_GPU,
)

INFO = VendorInfo(name="mthreads", display_name="Moore Threads", kinds=(KIND,), isolation_library=edits.LIBRARY_FILE)


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> MthreadsSettings:
    return MthreadsSettings.model_validate(raw)


@hookimpl
def hami_discover_devices(settings: MthreadsSettings) -> list[NodeInventory]:
    return discovery.discover(settings)


@hookimpl
def hami_device_readings(settings: MthreadsSettings) -> list[DeviceReading] | None:
    return discovery.runtime_for(settings).readings()


@hookimpl
def hami_container_request(
    kind: DeviceKind, container: Container, settings: MthreadsSettings
) -> ContainerRequest | None:
    return requests.container_request(kind, container, settings)


@hookimpl
def hami_admission_defaults(kind: DeviceKind, container: Container, pod: Pod) -> AdmissionEdit | None:
    return requests.admission_defaults(kind, container, pod)


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
) -> list[NodeFit]:
    return MthreadsFitter(kind).fit_nodes(pod, requests, nodes, policy)


@hookimpl
def hami_allocate(pod: Pod, container_index: int, devices: ContainerPlacement, settings: MthreadsSettings) -> None:
    allocation.allocate(settings, pod, container_index, devices)


@hookimpl
def hami_release(pod: Pod, placements: Sequence[ContainerPlacement], settings: MthreadsSettings) -> None:
    allocation.release(settings, pod, placements)


@hookimpl
def hami_container_edits(
    pod: Pod,
    container_index: int,
    devices: ContainerPlacement,
    settings: MthreadsSettings,
    library: IsolationLibrary | None,
) -> ContainerEdits:
    return edits.container_edits(settings, devices, pod, container_index, library)


@hookimpl
def hami_drm_usage_source(settings: MthreadsSettings) -> DrmUsageSource | None:
    if not settings.drm_fdinfo.enabled:
        return None  # not even MTML is asked
    gpus = discovery.runtime_for(settings).gpus
    return settings.drm_fdinfo.source(("mtgpu",), {g.bdf: g.uuid for g in gpus if g.bdf})


@hookimpl
def hami_host_environment(indices: Sequence[int]) -> dict[str, str]:
    """A host process (`hami run`) sees the placement's GPUs, in order, through MUSA's own selector
    (``MUSA_VISIBLE_DEVICES``: the host's indices, as discovery reports them). A container's edits set it to the
    container's own ordinals ``0,…,n-1`` (its runtime shows only the granted GPUs); on the host those ordinals
    would name the host's first GPUs, so this answer replaces them."""
    return {"MUSA_VISIBLE_DEVICES": ",".join(str(i) for i in indices)}


@hookimpl
def hami_doctor_checks(settings: MthreadsSettings, grant: Grant | None) -> list[Finding]:
    return doctor_checks(settings, grant)

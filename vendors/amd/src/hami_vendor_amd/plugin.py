"""The AMD vendor plugin: HAMi v2.10's `amd.com/gpu*` resources and `hami.io/amd-*` annotations.

Every hook of the vendor, each a thin call into the module that owns the rule:

* metadata here: one kind, common word ``AMD``, registered in HAMi's JSON form under ``hami.io/node-amd-register``
  (HAMi has no AMD handshake), selectors ``amd.com/use-gputype`` / ``amd.com/nouse-gputype`` (case-insensitive
  substrings of the model, as HAMi's ``checkAMDType``) and ``amd.com/use-gpu-uuid`` / ``amd.com/nouse-gpu-uuid``;
  settings (`hami_vendor_amd.settings`);
* discovery through AMD SMI and sysfs (`hami_vendor_amd.node`, the binding in `hami_vendor_amd.amdsmi`), and each
  GPU's VRAM in use, busy share, power and temperature for the node monitor (`hami_device_readings`);
* requests as HAMi's ``GenerateResourceRequests``: only a container with ``amd.com/gpu`` asks for GPUs;
  ``amd.com/gpumem`` in MiB (absent or 0: the whole GPU's memory); ``amd.com/gpucores`` a percentage from 1 to 100
  (absent: 100), anything else refused at admission as HAMi's ``MutateAdmission`` refuses it;
* fitting: core's share fitter with the kind's compute units (`DeviceKind.core_units`: a GPU's ``devcore`` is its
  CU count and a grant's ``usedcores`` is ``floor(percent × CUs / 100)`` units, at least 1, as HAMi's ``Fit``), and
  each placed device's type the GPU's model, as HAMi writes it into ``hami.io/amd-devices-allocated``;
* allocation, release and container edits (`hami_vendor_amd.edits`, the CU masks in `hami_vendor_amd.cumask`);
* the kernel's DRM client statistics of the GPUs (amdgpu's ``drm-pdev`` → the GPU), which the node daemon's backstop
  reads for the containers' memory (``drmFdinfo``, `hami_vendor_amd.settings`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami import hookimpl
from hami.errors import RequestError
from hami.fitting import ShareFitter
from hami.model import (
    Allocation,
    AnnotationKeys,
    Container,
    ContainerEdits,
    ContainerPlacement,
    ContainerRequest,
    Device,
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
from hami.requests import read_count
from hami_vendor_amd import edits
from hami_vendor_amd.node import inventory, runtime_for, simulated_gpus
from hami_vendor_amd.settings import AmdSettings

__all__ = ["INFO", "KIND", "AmdSettings"]

KIND = DeviceKind(
    common_word="AMD",
    resources=ResourceNames(count="amd.com/gpu", memory="amd.com/gpumem", cores="amd.com/gpucores"),
    annotations=AnnotationKeys(
        node_register="hami.io/node-amd-register",
        to_allocate="hami.io/amd-devices-to-allocate",
        allocated="hami.io/amd-devices-allocated",
        use_uuid="amd.com/use-gpu-uuid",
        nouse_uuid="amd.com/nouse-gpu-uuid",
        use_type="amd.com/use-gputype",
        nouse_type="amd.com/nouse-gputype",
    ),
    register_format=RegisterFormat.JSON,
    reusable_fits=True,  # `ShareFitter` and the node's own device models: nothing of the moment
    core_units=True,
)

INFO = VendorInfo(name="amd", display_name="AMD", kinds=(KIND,), isolation_library=edits.LIBRARY_FILE)


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> AmdSettings:
    return AmdSettings.model_validate(raw)


@hookimpl
def hami_discover_devices(settings: AmdSettings) -> list[NodeInventory]:
    return inventory(runtime_for(settings).read(), settings)


@hookimpl
def hami_container_request(kind: DeviceKind, container: Container) -> ContainerRequest | None:
    names = kind.resources
    count = read_count(container, names.count, unit="devices", limit=1024)
    if not count:
        return None
    memory = read_count(container, names.memory or "", unit="MiB", limit=2**31 - 1) or 0
    cores = read_count(container, names.cores or "", unit="percent")
    if cores is not None and not 1 <= cores <= 100:
        raise RequestError(names.cores or "", str(cores), "must be an integer percentage between 1 and 100")
    percent = None if memory else 100
    return ContainerRequest(kind=kind.common_word, count=count, memory=memory, memory_percentage=percent,
                            cores=100 if cores is None else cores)  # fmt: skip


def _with_models(fits: list[NodeFit], nodes: Sequence[NodeView]) -> list[NodeFit]:
    """HAMi writes each AMD device's registered model as its type in the pod's device strings."""
    models = {n.name: {u.device.id: u.device.type for u in n.devices} for n in nodes}
    out = []
    for fit in fits:
        if fit.placement is not None:
            model = models.get(fit.node, {})
            placement = tuple(
                tuple(d.model_copy(update={"type": model.get(d.uuid) or d.type}) for d in container)
                for container in fit.placement
            )
            fit = fit.model_copy(update={"placement": placement})
        out.append(fit)
    return out


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
) -> list[NodeFit]:
    return _with_models(ShareFitter(kind).fit_nodes(pod, requests, nodes, policy), nodes)


@hookimpl
def hami_allocate(
    pod: Pod, container_index: int, devices: ContainerPlacement, settings: AmdSettings
) -> Allocation | None:
    return edits.allocate(settings, pod, container_index, devices)


@hookimpl
def hami_release(pod: Pod, settings: AmdSettings) -> None:
    edits.release(settings, pod)


@hookimpl
def hami_reconcile(pods: Sequence[Pod], settings: AmdSettings) -> None:
    edits.reconcile(settings, list(pods))


@hookimpl
def hami_device_readings(settings: AmdSettings) -> list[DeviceReading] | None:
    return runtime_for(settings).readings()


@hookimpl
def hami_simulated_devices(
    devices: Sequence[Device], driver: Mapping[str, Mapping[str, Any]], settings: AmdSettings
) -> None:
    runtime_for(settings).simulate(simulated_gpus(devices, driver))


@hookimpl
def hami_container_edits(
    pod: Pod, container_index: int, devices: ContainerPlacement, settings: AmdSettings, library: IsolationLibrary | None
) -> ContainerEdits:
    return edits.container_edits(settings, pod, container_index, devices, library)


@hookimpl
def hami_drm_usage_source(settings: AmdSettings) -> DrmUsageSource | None:
    gpus = runtime_for(settings).gpus
    return settings.drm_fdinfo.source(("amdgpu",), {g.bdf: g.uuid for g in gpus if g.bdf})


@hookimpl
def hami_host_environment(devices: ContainerPlacement, settings: AmdSettings) -> dict[str, str]:
    """A host process (`hami run`) sees the placement's GPUs, in order, as a container does: through ROCr's
    ``ROCR_VISIBLE_DEVICES`` naming their ROCr UUIDs (HIP then numbers them 0, 1, … in that order)."""
    gpus = runtime_for(settings).by_uuid([d.uuid for d in devices])
    return {"ROCR_VISIBLE_DEVICES": ",".join(g.rocr_uuid for g in gpus)}

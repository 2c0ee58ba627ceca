"""The Cambricon vendor plugin: HAMi v2.10's `cambricon.com/*` resources and `hami.io/cambricon-mlu-*` annotations.

Every hook implementation of the vendor, in the order a pod meets them; each is a thin call into the module that
owns the rule:

* metadata here (`INFO`), settings (`hami_vendor_cambricon.settings`);
* discovery through CNDev (`hami_vendor_cambricon.discovery`, the binding in `hami_vendor_cambricon.cndev`), and
  each card's processes for the node-side backstop (`hami_device_processes`, ``cndevGetProcessInfo``), and its
  memory in use, busy share, power and temperature for the node monitor (`hami_device_readings`);
* requests: memory in units of 256 MiB (`cambricon.com/mlu.smlu.vmemory: 4` is 1024 MiB); as in HAMi, a
  container that names memory but not `cambricon.com/mlu.smlu.vcore` gets the whole compute of its MLU
  (`defaultCores`, 100), since Cambricon's dynamic sMLU needs a compute share for every slice;
* fitting on core's share fitter with the dynamic-sMLU profile rules (`hami_vendor_cambricon.fit`);
* allocation and container edits as Cambricon's device plugin gives them (`hami_vendor_cambricon.allocation`,
  the sMLU instance in `hami_vendor_cambricon.smlu`), or, on a node in the soft mode (``mluMode: hami-core``), the
  isolation library ``libvmlu.so`` (`hami_vendor_cambricon.soft`).

HAMi publishes no register annotation for MLUs: its scheduler derives them from the node's cores and memory
capacity (`DeviceKind.capacity_by_cores`); this daemon serves that capacity and also publishes a per-card register
(`hami_vendor_cambricon.discovery`). It must stay free of rules of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami import hookimpl
from hami.findings import Finding
from hami.isolation.grant import Grant
from hami.model import (
    Allocation,
    AnnotationKeys,
    Container,
    ContainerEdits,
    ContainerPlacement,
    ContainerRequest,
    DeviceKind,
    DeviceProcess,
    DeviceReading,
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
from hami.requests import read_share_request
from hami_vendor_cambricon import allocation, discovery, fit, soft
from hami_vendor_cambricon.doctor import checks as doctor_checks
from hami_vendor_cambricon.settings import CambriconSettings

__all__ = [
    "INFO",
    "KIND",
    "CambriconSettings",
    "hami_allocate",
    "hami_container_edits",
    "hami_container_request",
    "hami_device_processes",
    "hami_device_readings",
    "hami_discover_devices",
    "hami_doctor_checks",
    "hami_fit_nodes",
    "hami_host_environment",
    "hami_reconcile",
    "hami_release",
    "hami_vendor_info",
    "hami_vendor_settings",
]

KIND = DeviceKind(
    common_word="MLU",
    resources=ResourceNames(
        count="cambricon.com/vmlu",
        memory="cambricon.com/mlu.smlu.vmemory",
        cores="cambricon.com/mlu.smlu.vcore",
        memory_unit_mib=256,
    ),
    annotations=AnnotationKeys(
        node_register=discovery.REGISTER_ANNOTATION,
        to_allocate="hami.io/cambricon-mlu-devices-to-allocate",
        allocated="hami.io/cambricon-mlu-devices-allocated",
        use_uuid="cambricon.com/use-gpuuuid",
        nouse_uuid="cambricon.com/nouse-gpuuuid",
        use_type="cambricon.com/use-mlutype",
        nouse_type="cambricon.com/nouse-mlutype",
    ),
    register_format=RegisterFormat.CAPACITY,
    capacity_by_cores=discovery.CAPACITY_NAME,
    node_lock=allocation.LOCK_ANNOTATION,  # taken at bind as HAMi's scheduler takes it, released at Allocate
    reusable_fits=True,  # a fit reads the pod, the policy and the node's view, nothing of the moment
)

INFO = VendorInfo(name="cambricon", display_name="Cambricon", kinds=(KIND,), isolation_library=soft.LIBRARY_FILE)


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
    if container.resource(kind.resources.count) is None:
        return None  # as HAMi v2.10: without cambricon.com/vmlu a container asks for no MLU
    return read_share_request(kind, container, defaults=settings)


@hookimpl
def hami_discover_devices(settings: CambriconSettings) -> list[NodeInventory]:
    return discovery.discover(settings)


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
    settings: CambriconSettings,
) -> list[NodeFit]:
    return fit.fit_nodes(kind, pod, requests, nodes, policy)


@hookimpl
def hami_allocate(
    kind: DeviceKind, pod: Pod, container_index: int, devices: ContainerPlacement, settings: CambriconSettings
) -> Allocation:
    return allocation.allocate(settings, pod, container_index, devices)


@hookimpl
def hami_release(pod: Pod, placements: Sequence[ContainerPlacement], settings: CambriconSettings) -> None:
    allocation.release(settings, pod)


@hookimpl
def hami_device_processes(settings: CambriconSettings) -> list[DeviceProcess] | None:
    return discovery.device_processes(settings)


@hookimpl
def hami_device_readings(settings: CambriconSettings) -> list[DeviceReading] | None:
    return discovery.device_readings(settings)


@hookimpl
def hami_reconcile(pods: Sequence[Pod], settings: CambriconSettings) -> None:
    allocation.reconcile(settings, pods)


@hookimpl
def hami_container_edits(
    kind: DeviceKind,
    pod: Pod,
    container_index: int,
    devices: ContainerPlacement,
    settings: CambriconSettings,
    library: IsolationLibrary | None,
) -> ContainerEdits:
    return allocation.container_edits(settings, pod, container_index, devices, library)


@hookimpl
def hami_host_environment(indices: Sequence[int]) -> dict[str, str]:
    """A host process (`hami run`) sees the placement's MLUs, in order, through CNRT's own selector
    (``MLU_VISIBLE_DEVICES``: card indices, as discovery reports them). In a container the device nodes of the
    granted cards alone are given (``CAMBRICON_VISIBLE_DEVICES`` is the device plugin's record of them)."""
    return {"MLU_VISIBLE_DEVICES": ",".join(str(i) for i in indices)}


@hookimpl
def hami_doctor_checks(settings: CambriconSettings, grant: Grant | None) -> list[Finding]:
    return doctor_checks(settings, grant)

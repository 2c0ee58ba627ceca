"""The Hygon vendor plugin: HAMi v2.10's `hygon.com/dcu*` resources and `hami.io/dcu-*` annotations.

Every hook of the vendor, each a thin call into the module that owns the rule:

* metadata here (the DCU kind, registered in HAMi's legacy string format under ``hami.io/node-dcu-register``)
  and settings (`hami_vendor_hygon.settings`);
* discovery through ROCm SMI and DMI, or ``hy-smi`` without them (`hami_vendor_hygon.discovery`, the binding in
  `hami_vendor_hygon.dtk`);
* the node-side backstop's view: the compute processes ROCm SMI reports and their VRAM on each DCU
  (`hami_device_processes`, `hami_vendor_hygon.node`), and each DCU's VRAM in use, busy share, power and
  temperature for the node monitor (`hami_device_readings`, from ROCm SMI);
* requests: HAMi's shared rules (memory in MiB, cores in percent of one DCU), `hami.requests`;
* fitting: core's share fitter with HAMi's selectors (``hygon.com/use-dcutype`` … matched as HAMi does, by
  case-insensitive substring of the model);
* allocation and release: the vDCU (`hami_vendor_hygon.vdcu`) or the soft mode's accounting directory
  (`hami_vendor_hygon.allocation`); after a daemon restart, the vDCUs of pods no longer on the node removed
  (`hami_reconcile`);
* container edits: HAMi's device nodes and vdev mounts, or the isolation library ``libvdcu.so``
  (`hami_vendor_hygon.edits`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami import hookimpl
from hami.findings import Finding
from hami.fitting import ShareFitter
from hami.isolation.grant import Grant
from hami.model import (
    AnnotationKeys,
    Container,
    ContainerEdits,
    ContainerPlacement,
    ContainerRequest,
    Device,
    DeviceKind,
    DeviceProcess,
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
from hami.requests import read_share_request
from hami_vendor_hygon import allocation, discovery, edits
from hami_vendor_hygon.doctor import checks as doctor_checks
from hami_vendor_hygon.node import runtime_for
from hami_vendor_hygon.settings import HygonSettings

__all__ = ["INFO", "KIND", "HygonSettings"]

KIND = DeviceKind(
    common_word="DCU",
    resources=ResourceNames(count="hygon.com/dcunum", memory="hygon.com/dcumem", cores="hygon.com/dcucores"),
    annotations=AnnotationKeys(
        node_register="hami.io/node-dcu-register",
        node_handshake="hami.io/node-handshake-dcu",
        to_allocate="hami.io/dcu-devices-to-allocate",
        allocated="hami.io/dcu-devices-allocated",
        use_uuid="hygon.com/use-gpuuuid",
        nouse_uuid="hygon.com/nouse-gpuuuid",
        use_type="hygon.com/use-dcutype",
        nouse_type="hygon.com/nouse-dcutype",
    ),
    register_format=RegisterFormat.LEGACY,
    reusable_fits=True,  # `ShareFitter` alone: a fit reads nothing but the pod, the policy and the node's view
)

INFO = VendorInfo(name="hygon", display_name="Hygon", kinds=(KIND,), isolation_library=edits.LIBRARY_FILE)


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> HygonSettings:
    return HygonSettings.model_validate(raw)


@hookimpl
def hami_discover_devices(settings: HygonSettings) -> list[NodeInventory]:
    return discovery.discover(settings)


@hookimpl
def hami_container_request(
    kind: DeviceKind, container: Container, pod: Pod, settings: HygonSettings
) -> ContainerRequest | None:
    return read_share_request(kind, container, defaults=settings)


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
    settings: HygonSettings,
) -> list[NodeFit]:
    return ShareFitter(kind).fit_nodes(pod, requests, nodes, policy)


@hookimpl
def hami_allocate(pod: Pod, container_index: int, devices: ContainerPlacement, settings: HygonSettings) -> None:
    allocation.allocate(settings, pod, container_index, devices)


@hookimpl
def hami_release(pod: Pod, placements: Sequence[ContainerPlacement], settings: HygonSettings) -> None:
    allocation.release(settings, pod, placements)


@hookimpl
def hami_reconcile(pods: Sequence[Pod], settings: HygonSettings) -> None:
    allocation.reconcile(settings, pods)


@hookimpl
def hami_device_processes(settings: HygonSettings) -> list[DeviceProcess] | None:
    return runtime_for(settings).processes()


@hookimpl
def hami_drm_usage_source(settings: HygonSettings) -> DrmUsageSource | None:
    if not settings.drm_fdinfo.enabled:
        return None
    return settings.drm_fdinfo.source((), {d.bdf: d.uuid for d in runtime_for(settings).devices if d.bdf})


@hookimpl
def hami_device_readings(settings: HygonSettings) -> list[DeviceReading] | None:
    return runtime_for(settings).readings()


@hookimpl
def hami_simulated_devices(
    devices: Sequence[Device], driver: Mapping[str, Mapping[str, Any]], settings: HygonSettings
) -> None:
    discovery.simulate(settings, devices, driver)


@hookimpl
def hami_container_edits(
    pod: Pod,
    container_index: int,
    devices: ContainerPlacement,
    settings: HygonSettings,
    library: IsolationLibrary | None,
) -> ContainerEdits:
    return edits.container_edits(settings, pod, container_index, devices, library)


@hookimpl
def hami_host_environment(indices: Sequence[int]) -> dict[str, str]:
    """A host process (`hami run`) sees the placement's DCUs, in order, through HIP's own selector
    (``HIP_VISIBLE_DEVICES``: device indices, as discovery reports them)."""
    return {"HIP_VISIBLE_DEVICES": ",".join(str(i) for i in indices)}


@hookimpl
def hami_doctor_checks(settings: HygonSettings, grant: Grant | None) -> list[Finding]:
    return doctor_checks(settings, grant)

"""The Ascend vendor plugin: HAMi v2.10's `huawei.com/<chip>` resources and per-chip `hami.io/…-<chip>` annotations.

Every hook implementation of the vendor, in the order a pod meets them; each is a thin call into the module that
owns the rule:

* metadata and settings here (`INFO`, one device kind per chip, HAMi's common words `Ascend910A` … `Ascend910C`;
  `hami_vendor_ascend.settings`, `hami_vendor_ascend.chips`);
* discovery through DCMI, with ``npu-smi info`` where DCMI is absent (`hami_vendor_ascend.discovery`, the driver
  binding in `hami_vendor_ascend.dcmi`), and the node-side backstop's view of each chip's processes
  (`hami_device_processes`, DCMI's ``dcmi_get_device_resource_info``) and of each chip's memory in use, AI-core
  busy share, power and temperature for the node monitor (`hami_device_readings`);
* requests and admission defaults: templates or soft split, whole cards for several devices, super-pod modules
  (`hami_vendor_ascend.admission`);
* fitting on core's share fitter: template rounding, node modes, modules, NetworkID topology
  (`hami_vendor_ascend.fit`);
* allocation and release of the soft split's accounting directories (`hami_vendor_ascend.allocation`);
* container edits for the kubelet: Ascend's container runtime env, the isolation library ``libvnpu.so``
  (`hami_vendor_ascend.edits`).

It must stay free of rules of its own.
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
    RegisterFormat,
    ResourceNames,
    SchedulingPolicy,
    VendorInfo,
)
from hami_vendor_ascend import admission, allocation, discovery, edits, fit
from hami_vendor_ascend.admission import VNPU_MODE_ANNOTATION, vnpu_mode
from hami_vendor_ascend.chips import COMMON_WORDS
from hami_vendor_ascend.doctor import checks as doctor_checks
from hami_vendor_ascend.settings import SOFT_SPLIT, TEMPLATE, AscendSettings, VnpuMode

__all__ = [
    "COMMON_WORDS",
    "INFO",
    "SOFT_SPLIT",
    "TEMPLATE",
    "VNPU_MODE_ANNOTATION",
    "AscendSettings",
    "VnpuMode",
    "hami_admission_defaults",
    "hami_allocate",
    "hami_container_edits",
    "hami_container_request",
    "hami_device_processes",
    "hami_device_readings",
    "hami_discover_devices",
    "hami_doctor_checks",
    "hami_fit_nodes",
    "hami_host_environment",
    "hami_release",
    "hami_simulated_devices",
    "hami_vendor_info",
    "hami_vendor_settings",
    "vnpu_mode",
    "hami_dra_device",
]

# --------------------------------------------------------------------------------------------------------
# Metadata
# --------------------------------------------------------------------------------------------------------


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


INFO = VendorInfo(
    name="ascend",
    display_name="Huawei Ascend",
    kinds=tuple(_kind(w) for w in COMMON_WORDS),
    isolation_library=edits.LIBRARY_FILE,
)


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> AscendSettings:
    return AscendSettings.model_validate(raw)


# --------------------------------------------------------------------------------------------------------
# Discovery (node daemon)
# --------------------------------------------------------------------------------------------------------


@hookimpl
def hami_discover_devices(settings: AscendSettings) -> list[NodeInventory]:
    return discovery.discover(settings)


# --------------------------------------------------------------------------------------------------------
# Requests and admission (webhook and scheduler)
# --------------------------------------------------------------------------------------------------------


@hookimpl
def hami_container_request(
    kind: DeviceKind, container: Container, pod: Pod, settings: AscendSettings
) -> ContainerRequest | None:
    return admission.container_request(kind, container, pod, settings)


@hookimpl
def hami_admission_defaults(
    kind: DeviceKind, container: Container, pod: Pod, settings: AscendSettings
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
    settings: AscendSettings,
) -> list[NodeFit]:
    return fit.fit_nodes(kind, pod, requests, nodes, policy, settings)


@hookimpl
def hami_device_islands(kind: DeviceKind, node: NodeView) -> dict[str, str] | None:
    return fit.hccs_islands(kind, node)


# --------------------------------------------------------------------------------------------------------
# Allocation (node daemon, inside the kubelet's Allocate) and release
# --------------------------------------------------------------------------------------------------------


@hookimpl
def hami_allocate(pod: Pod, container_index: int, devices: ContainerPlacement, settings: AscendSettings) -> None:
    allocation.allocate(settings, pod, container_index, devices)


@hookimpl
def hami_release(pod: Pod, placements: Sequence[ContainerPlacement], settings: AscendSettings) -> None:
    allocation.release(settings, pod, placements)


# --------------------------------------------------------------------------------------------------------
# Dynamic Resource Allocation (node daemon, hami.dra)
# --------------------------------------------------------------------------------------------------------


@hookimpl
def hami_dra_device(kind: DeviceKind, device: Device, settings: AscendSettings) -> DraDevice:
    """A chip's DRA facts: its chip name and AI cores as attributes, its HCCS group (HAMi's topology hint
    ``NetworkID``, 910 series) as ``networkID`` so a claim can keep several NPUs in one group (`matchAttribute`)
    and, when claims are served in template mode (the default mode: a claim has no pod annotation to choose
    another), the templates' memory sizes and the whole card as the only memory a share may take: a request is
    rounded up to the next template, as the fitting does for a pod."""
    chip = settings.chips[kind.common_word]
    attributes: dict[str, str | int | bool] = {"chip": chip.chip_name, "aiCore": chip.ai_core}
    network = device.custom.get(discovery.NETWORK_ID)
    if isinstance(network, int) and not isinstance(network, bool):
        attributes["networkID"] = network
    if settings.default_vnpu_mode != TEMPLATE or not chip.templates:
        return DraDevice(attributes=attributes)
    sizes = sorted({t.memory for t in chip.templates if t.memory < device.devmem})[:9]
    return DraDevice(attributes=attributes, memory_values_mib=(*sizes, device.devmem))


# --------------------------------------------------------------------------------------------------------
# Container edits (node daemon, the answer to the kubelet)
# --------------------------------------------------------------------------------------------------------


@hookimpl
def hami_device_processes(kind: DeviceKind, settings: AscendSettings) -> list[DeviceProcess] | None:
    return discovery.device_processes(settings, kind.common_word)


@hookimpl
def hami_device_readings(kind: DeviceKind, settings: AscendSettings) -> list[DeviceReading] | None:
    return discovery.device_readings(settings, kind.common_word)


@hookimpl
def hami_simulated_devices(
    kind: DeviceKind, devices: Sequence[Device], driver: Mapping[str, Mapping[str, Any]], settings: AscendSettings
) -> None:
    discovery.simulate(settings, kind, devices, driver)


@hookimpl
def hami_container_edits(
    kind: DeviceKind,
    pod: Pod,
    container_index: int,
    devices: ContainerPlacement,
    settings: AscendSettings,
    library: IsolationLibrary | None,
) -> ContainerEdits:
    return edits.container_edits(settings, kind, pod, container_index, devices, library)


@hookimpl
def hami_host_environment(indices: Sequence[int]) -> dict[str, str]:
    """A host process (`hami run`) sees the placement's NPUs, in order, through the ACL runtime's own selector
    (``ASCEND_RT_VISIBLE_DEVICES``: the logical device ids, which discovery reports as the devices' indices)."""
    return {"ASCEND_RT_VISIBLE_DEVICES": ",".join(str(i) for i in indices)}


@hookimpl
def hami_doctor_checks(settings: AscendSettings, grant: Grant | None) -> list[Finding]:
    return doctor_checks(settings, grant)

"""The MetaX vendor plugin: HAMi v2.10's `metax-tech.com/*` resources and annotations, both of HAMi's MetaX kinds.

Every hook of the vendor, each a thin call into the module that owns the rule:

* metadata here: ``Metax-GPU``, whole cards (``metax-tech.com/gpu``; HAMi counts them from the node's capacity,
  naming them ``<node>-metax-<i>``, and this daemon also registers the real cards for this scheduler), and
  ``Metax-SGPU``, shares of cards (``metax-tech.com/sgpu``, ``metax-tech.com/vmemory`` in GiB,
  ``metax-tech.com/vcore`` in percent; registered as MetaX's sGPU plugin does, in
  ``metax-tech.com/node-gpu-devices``); settings in `hami_vendor_metax.settings`;
* discovery through MXSML, or ``mx-smi`` without it (`hami_vendor_metax.discovery`, the binding in
  `hami_vendor_metax.mxsml`), and the scheduler's reading of ``metax-tech.com/node-gpu-devices``;
* the node-side backstop's view, for the node's kind: each card's processes and the memory MXSML counts for each
  (`hami_device_processes`, ``mxSmlGetSingleGpuProcess``; `hami_vendor_metax.node`), and each card's VRAM in use,
  busy share, power and temperature for the node monitor (`hami_device_readings`, from MXSML);
* requests: whole cards by count; shares by HAMi's shared rules with memory in GiB and, as in HAMi, a container
  naming memory but not ``vcore`` gets the whole compute of its card (``defaultCores``, 100). The pod's
  ``metax-tech.com/sgpu-qos-policy`` must be ``best-effort`` (the default, written at admission when absent),
  ``fixed-share`` or ``burst-share``, and its ``metax-tech.com/sgpu-app-class``, when given, ``online`` or
  ``offline`` with a single device; other values are refused with the legal ones listed. HAMi ignores the QoS
  policy of online pods, and so does this plugin;
* fitting and scoring: `hami_vendor_metax.fit` (MetaXLink topology, QoS, app classes);
* allocation, release and container edits: `hami_vendor_metax.allocation`. MetaX's own sGPU components enforce a
  share, as in HAMi (``sgpuMode: metax``, the default); ``sgpuMode: hami-core`` gives shares the isolation library
  ``libvmaca.so`` (hami-core's CUDA-runtime-shaped hook layer with MACA's names, ``isolation/``) instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami import hookimpl
from hami.errors import RequestError
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
from hami_vendor_metax import allocation, discovery, fit
from hami_vendor_metax.doctor import checks as doctor_checks
from hami_vendor_metax.node import CAPACITY_NAME, runtime_for
from hami_vendor_metax.settings import MetaxSettings

__all__ = ["GPU", "INFO", "SGPU", "MetaxSettings"]

QOS_ANNOTATION = fit.QOS_ANNOTATION
QOS_POLICIES = ("best-effort", "fixed-share", "burst-share")
APP_CLASS_ANNOTATION = fit.APP_CLASS_ANNOTATION
APP_CLASSES = ("online", "offline")

_SELECTORS = {"use_uuid": "metax-tech.com/use-gpuuuid", "nouse_uuid": "metax-tech.com/nouse-gpuuuid"}

GPU = DeviceKind(
    common_word="Metax-GPU",
    resources=ResourceNames(count="metax-tech.com/gpu"),
    annotations=AnnotationKeys(
        node_register=discovery.GPU_REGISTER,
        to_allocate="hami.io/metax-gpu-devices-to-allocate",
        allocated="hami.io/metax-gpu-devices-allocated",
        **_SELECTORS,
    ),
    register_format=RegisterFormat.CAPACITY,
    capacity_name=CAPACITY_NAME,
)

SGPU = DeviceKind(
    common_word="Metax-SGPU",
    resources=ResourceNames(
        count="metax-tech.com/sgpu", memory="metax-tech.com/vmemory", cores="metax-tech.com/vcore", memory_unit_mib=1024
    ),
    annotations=AnnotationKeys(
        node_register=discovery.SGPU_ANNOTATION,
        to_allocate="hami.io/metax-sgpu-devices-to-allocate",
        allocated="hami.io/metax-sgpu-devices-allocated",
        **_SELECTORS,
    ),
)

INFO = VendorInfo(name="metax", display_name="MetaX", kinds=(GPU, SGPU), isolation_library=allocation.LIBRARY_FILE)


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> MetaxSettings:
    return MetaxSettings.model_validate(raw)


@hookimpl
def hami_discover_devices(settings: MetaxSettings) -> list[NodeInventory]:
    return discovery.discover(settings)


@hookimpl
def hami_node_devices(kind: DeviceKind, annotations: Mapping[str, str]) -> list[Device] | None:
    if kind.common_word == SGPU.common_word:
        return discovery.read_sgpu_devices(annotations)
    return None


@hookimpl
def hami_dra_device(device: Device) -> DraDevice | None:
    """An sGPU card's MetaXLink group (``linkZone`` of MetaX's registration, 0 for an unlinked card) as the DRA
    attribute ``linkZone``, so a claim can keep several cards in one group (`matchAttribute`); core's defaults
    otherwise."""
    zone = device.custom.get("LinkZone")
    if isinstance(zone, int) and not isinstance(zone, bool) and zone > 0:
        return DraDevice(attributes={"linkZone": zone})
    return None


@hookimpl
def hami_container_request(
    kind: DeviceKind, container: Container, pod: Pod, settings: MetaxSettings
) -> ContainerRequest | None:
    if kind.common_word == GPU.common_word:
        return read_share_request(kind, container)
    request = read_share_request(kind, container, defaults=settings)
    if request is not None:
        check_sgpu_annotations(pod, request)
    return request


@hookimpl
def hami_admission_defaults(kind: DeviceKind, pod: Pod) -> AdmissionEdit | None:
    """HAMi's admission: a shared-card pod that is not ``online`` and names no QoS policy gets ``best-effort``."""
    if kind.common_word != SGPU.common_word or pod.annotations.get(APP_CLASS_ANNOTATION) == "online":
        return None
    if QOS_ANNOTATION in pod.annotations:
        return None
    return AdmissionEdit(pod_annotations={QOS_ANNOTATION: QOS_POLICIES[0]})


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
) -> list[NodeFit]:
    if kind.common_word == GPU.common_word:
        return fit.fit_gpu(kind, pod, requests, nodes, policy)
    return fit.fit_sgpu(kind, pod, requests, nodes, policy)


@hookimpl
def hami_device_islands(node: NodeView) -> dict[str, str]:
    return fit.metaxlink_islands(node)


@hookimpl
def hami_score_nodes(
    kind: DeviceKind,
    pod: Pod,
    fits: Sequence[NodeFit],
    nodes: Mapping[str, NodeView],
    policy: SchedulingPolicy,
    settings: MetaxSettings,
) -> Mapping[str, float] | None:
    if kind.common_word == GPU.common_word:
        return fit.score_gpu(fits, nodes, policy)
    return fit.score_sgpu(pod, fits, nodes, policy, settings.sgpu_topology_aware)


@hookimpl
def hami_allocate(
    kind: DeviceKind, pod: Pod, container_index: int, devices: ContainerPlacement, settings: MetaxSettings
) -> Allocation:
    return allocation.allocate(settings, kind.common_word, pod, container_index, devices)


def _served_here(kind: DeviceKind, settings: MetaxSettings) -> bool:
    """Whether `kind` is the one this node serves (`nodeKind`): a node serves GPUs or sGPUs, never both."""
    return kind.common_word == (GPU if settings.node_kind == "gpu" else SGPU).common_word


@hookimpl
def hami_device_processes(kind: DeviceKind, settings: MetaxSettings) -> list[DeviceProcess] | None:
    if not _served_here(kind, settings):
        return []  # a node serves one kind: the other has no containers here
    return runtime_for(settings).processes()


@hookimpl
def hami_drm_usage_source(kind: DeviceKind, settings: MetaxSettings) -> DrmUsageSource | None:
    if not settings.drm_fdinfo.enabled or not _served_here(kind, settings):
        return None
    return settings.drm_fdinfo.source((), {c.gpu.bdf: c.uuid for c in runtime_for(settings).cards if c.gpu.bdf})


@hookimpl
def hami_device_readings(kind: DeviceKind, settings: MetaxSettings) -> list[DeviceReading] | None:
    if not _served_here(kind, settings):
        return []  # a node serves one kind: the other has no devices here
    return runtime_for(settings).readings()


@hookimpl
def hami_release(pod: Pod, settings: MetaxSettings) -> None:
    allocation.release(settings, pod)


@hookimpl
def hami_reconcile(pods: Sequence[Pod], settings: MetaxSettings) -> None:
    allocation.reconcile(settings, pods)


@hookimpl
def hami_container_edits(
    kind: DeviceKind,
    pod: Pod,
    container_index: int,
    devices: ContainerPlacement,
    settings: MetaxSettings,
    library: IsolationLibrary | None,
) -> ContainerEdits:
    return allocation.container_edits(settings, kind.common_word, pod, container_index, devices, library)


@hookimpl
def hami_host_environment(indices: Sequence[int]) -> dict[str, str]:
    """A host process (`hami run`) sees the placement's cards, in order, through MACA's own selector
    (``MACA_VISIBLE_DEVICES``: the host's indices, as discovery reports them). A container's edits set it to the
    container's own numbering ``0,1,…`` (its runtime shows only the granted cards); on the host those would name
    the host's first cards, so this answer replaces them."""
    return {"MACA_VISIBLE_DEVICES": ",".join(str(i) for i in indices)}


def check_sgpu_annotations(pod: Pod, request: ContainerRequest) -> None:
    """Refuse a shared-card pod whose app class or QoS policy MetaX's sGPU plugin would not understand."""
    app_class = pod.annotations.get(APP_CLASS_ANNOTATION)
    if app_class is not None:
        if app_class not in APP_CLASSES:
            raise RequestError(
                APP_CLASS_ANNOTATION, app_class, f"is not an app class: write one of {', '.join(APP_CLASSES)}"
            )
        if request.count != 1:
            raise RequestError(
                APP_CLASS_ANNOTATION,
                app_class,
                f"is for single-device containers, and this one asks for {request.count} {SGPU.resources.count}",
            )
    qos = pod.annotations.get(QOS_ANNOTATION)
    if app_class != "online" and qos is not None and qos not in QOS_POLICIES:
        raise RequestError(QOS_ANNOTATION, qos, f"is not a QoS policy: write one of {', '.join(QOS_POLICIES)}")


@hookimpl
def hami_doctor_checks(settings: MetaxSettings, grant: Grant | None) -> list[Finding]:
    return doctor_checks(settings, grant)

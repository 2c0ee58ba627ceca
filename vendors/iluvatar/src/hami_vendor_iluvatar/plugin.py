"""The Iluvatar vendor plugin: HAMi v2.10's `iluvatar.ai/<chip>-vgpu` resources and per-chip annotations.

Every hook of the vendor, each a thin call into the module that owns the rule:

* metadata here: one device kind per Iluvatar chip (`MR-V100`, `MR-V50`, `BI-V150`, `BI-V100`, registered in
  HAMi's legacy string format under ``hami.io/node-<chip>-register`` with ``hami.io/node-handshake-<chip>``),
  selectors ``hami.io/use-<chip>-uuid`` / ``hami.io/no-use-<chip>-uuid``; settings
  (`hami_vendor_iluvatar.settings`);
* discovery through ixML (`hami_vendor_iluvatar.discovery`, the binding in `hami_vendor_iluvatar.ixml`);
* requests: memory (``.vMem``) in units of 256 MiB, cores (``.vCore``) in percent of one GPU. Iluvatar shares only
  single GPUs: ``.vMem`` and ``.vCore`` are honoured with a count of 1; a count above 1 is read as that many whole
  GPUs whatever ``.vMem`` and ``.vCore`` say (their values must still be numbers). This is HAMi's conversion made
  per device: its webhook rewrites ``.vCore`` to 100 × count for such containers, which admission does here too;
* admission: HAMi's ``SOL_CONTINER_NAME`` (sic, the name Iluvatar's gpu-manager reads) = the container's name;
* fitting: core's share fitter (HAMi's Iluvatar rules: exact chip type, UUID selectors, exclusive 100% cores), and
  with the ``topology-aware`` device policy the chips of one board together (core's `hami.topology`, over the
  node's ``hami.io/node-iluvatar-score``);
* the node-side backstop's view: each GPU's compute processes and their memory, as ixML counts them
  (`hami_device_processes`, `hami_vendor_iluvatar.discovery.device_processes`), and its readings for the node
  monitor (`hami_device_readings`: memory in use, busy share, power, temperature);
* allocation, release and container edits (`hami_vendor_iluvatar.edits`): ``IX_VISIBLE_DEVICES``, the device nodes,
  CoreX's mounts; in ``hami-core`` mode the isolation library ``libvcorex.so``, its accounting directory and grant.
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
from hami.requests import read_count, read_share_request
from hami.topology import TopologyFitter, scores_from_annotation
from hami_vendor_iluvatar import discovery, edits
from hami_vendor_iluvatar.doctor import checks as doctor_checks
from hami_vendor_iluvatar.settings import IluvatarSettings

__all__ = ["CHIPS", "INFO", "IluvatarSettings"]

CHIPS = ("MR-V100", "MR-V50", "BI-V150", "BI-V100")
MEMORY_UNIT_MIB = 256
CONTAINER_NAME_ENV = "SOL_CONTINER_NAME"  # sic: HAMi's spelling, kept for Iluvatar's gpu-manager
_LINKS = scores_from_annotation(discovery.LINK_SCORE_ANNOTATION)


def _kind(chip: str) -> DeviceKind:
    return DeviceKind(
        common_word=chip,
        resources=ResourceNames(
            count=f"iluvatar.ai/{chip}-vgpu",
            memory=f"iluvatar.ai/{chip}.vMem",
            cores=f"iluvatar.ai/{chip}.vCore",
            memory_unit_mib=MEMORY_UNIT_MIB,
        ),
        annotations=AnnotationKeys(
            node_register=f"hami.io/node-{chip}-register",
            node_handshake=f"hami.io/node-handshake-{chip}",
            to_allocate=f"hami.io/{chip}-devices-to-allocate",
            allocated=f"hami.io/{chip}-devices-allocated",
            use_uuid=f"hami.io/use-{chip}-uuid",
            nouse_uuid=f"hami.io/no-use-{chip}-uuid",
        ),
        register_format=RegisterFormat.LEGACY,
        reusable_fits=True,  # `TopologyFitter` on the node's own link scores: nothing of the moment
    )


INFO = VendorInfo(
    name="iluvatar",
    display_name="Iluvatar CoreX",
    kinds=tuple(_kind(c) for c in CHIPS),
    isolation_library=edits.LIBRARY_FILE,
)


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> IluvatarSettings:
    return IluvatarSettings.model_validate(raw)


@hookimpl
def hami_discover_devices(settings: IluvatarSettings) -> list[NodeInventory]:
    return discovery.discover(settings, CHIPS)


@hookimpl
def hami_container_request(
    kind: DeviceKind, container: Container, pod: Pod, settings: IluvatarSettings
) -> ContainerRequest | None:
    names = kind.resources
    count = read_count(container, names.count, unit="devices", limit=1024)
    if count is not None and count > 1:
        read_count(container, names.memory or "", unit=f"{MEMORY_UNIT_MIB} MiB")
        read_count(container, names.cores or "", unit="percent")
        return ContainerRequest(kind=kind.common_word, count=count, memory_percentage=100, cores=100)
    return read_share_request(kind, container, defaults=settings)


@hookimpl
def hami_admission_defaults(
    kind: DeviceKind, container: Container, pod: Pod, settings: IluvatarSettings
) -> AdmissionEdit | None:
    names = kind.resources
    if names.count not in container.limits:
        return None
    count = read_count(container, names.count, unit="devices", limit=1024)
    limits = {names.cores: str(100 * count)} if count is not None and count > 1 and names.cores else {}
    named = CONTAINER_NAME_ENV in container.env or not container.name
    env = {} if named else {CONTAINER_NAME_ENV: container.name}
    return AdmissionEdit(limits=limits, env=env) if limits or env else None


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
    settings: IluvatarSettings,
) -> list[NodeFit]:
    return TopologyFitter(kind, links=_LINKS).fit_nodes(pod, requests, nodes, policy)


@hookimpl
def hami_allocate(pod: Pod, container_index: int, devices: ContainerPlacement, settings: IluvatarSettings) -> None:
    edits.allocate(settings, pod, container_index, devices)


@hookimpl
def hami_release(pod: Pod, placements: Sequence[ContainerPlacement], settings: IluvatarSettings) -> None:
    edits.release(settings, pod)


@hookimpl
def hami_device_processes(kind: DeviceKind, settings: IluvatarSettings) -> list[DeviceProcess] | None:
    return discovery.device_processes(settings, kind.common_word, CHIPS)


@hookimpl
def hami_device_readings(kind: DeviceKind, settings: IluvatarSettings) -> list[DeviceReading] | None:
    return discovery.device_readings(settings, kind.common_word, CHIPS)


@hookimpl
def hami_simulated_devices(
    kind: DeviceKind, devices: Sequence[Device], driver: Mapping[str, Mapping[str, Any]], settings: IluvatarSettings
) -> None:
    discovery.simulate(settings, kind, devices, driver)


@hookimpl
def hami_container_edits(
    pod: Pod,
    container_index: int,
    devices: ContainerPlacement,
    settings: IluvatarSettings,
    library: IsolationLibrary | None,
) -> ContainerEdits:
    return edits.container_edits(settings, pod, container_index, devices, library)


@hookimpl
def hami_host_environment(indices: Sequence[int]) -> dict[str, str]:
    """A host process (`hami run`) sees the placement's chips, in order, through CoreX's CUDA-compatible selector
    (``CUDA_VISIBLE_DEVICES``: device indices as ixML numbers them, which discovery reports as the indices). In a
    container the toolkit reads ``IX_VISIBLE_DEVICES`` instead and exposes only those chips' device nodes."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in indices)}


@hookimpl
def hami_doctor_checks(settings: IluvatarSettings, grant: Grant | None) -> list[Finding]:
    return doctor_checks(settings, grant)

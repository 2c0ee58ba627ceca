"""The Enflame vendor plugin: HAMi v2.10's two Enflame kinds, whole GCUs and DRS partitions.

Every hook of the vendor, each a thin call into the module that owns the rule:

* metadata here: ``GCU``, whole cards (``enflame.com/gcu``; HAMi counts them from the node's capacity, names card
  ``i`` ``<node>-GCU-<i>`` with 100 memory and 100 cores, and writes ``hami.io/enflame-gcu-devices-to-allocate`` and
  ``…-allocated``; this daemon also registers the cards themselves in ``hami.io/node-enflame-gcu-register``, which
  this scheduler reads before the capacity), and ``Enflame``, DRS partitions (``enflame.com/drs-gcu``, or
  ``enflame.com/gcu-memory`` and ``enflame.com/gcu-core``; cards read from Enflame's
  ``enflame.com/gcu-drs-capacity``, placements written in ``hami.io/enflame-vgpu-devices-allocated`` only, selectors
  ``enflame.com/use-gpuuuid``/``nouse-gpuuuid``: `hami_vendor_enflame.drs`); settings in
  `hami_vendor_enflame.settings`;
* discovery of whole cards through EFML, or ``efsmi`` without it (`hami_vendor_enflame.discovery`, the binding in
  `hami_vendor_enflame.efml`), and each card's memory in use, busy share, power and temperatures for the node monitor
  (`hami_device_readings`, from EFML);
* requests: a whole-card count (HAMi's 100% memory and cores per card); a DRS ask, checked as HAMi's admission
  checks it (``drs-gcu`` > 0, ``gcu-memory`` > 0, ``gcu-core`` in (0,100]);
* admission: a DRS resource named only in requests is copied to limits, as HAMi's webhook does;
* fitting: whole cards by core's share fitter (HAMi's rule: a card serves one container); DRS by profile
  (`hami_vendor_enflame.drs.fit_nodes`);
* container edits for whole cards (`hami_vendor_enflame.edits`). A DRS instance is created and handed to the
  container by Enflame's DRS device plugin from the pod's annotations, as in HAMi; this daemon does not serve it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami import hookimpl
from hami.fitting import ShareFitter
from hami.model import (
    AdmissionEdit,
    AnnotationKeys,
    Container,
    ContainerEdits,
    ContainerPlacement,
    ContainerRequest,
    Device,
    DeviceKind,
    DeviceReading,
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
from hami_vendor_enflame import discovery, drs, edits
from hami_vendor_enflame.settings import EnflameSettings

__all__ = ["DRS_KIND", "GCU", "INFO", "EnflameSettings"]

GCU = DeviceKind(
    common_word=discovery.GCU_WORD,
    resources=ResourceNames(count="enflame.com/gcu"),
    annotations=AnnotationKeys(
        node_register=discovery.GCU_REGISTER,
        to_allocate="hami.io/enflame-gcu-devices-to-allocate",
        allocated="hami.io/enflame-gcu-devices-allocated",
    ),
    register_format=RegisterFormat.CAPACITY,
    capacity_memory=100,
    reusable_fits=True,  # core's share fitter over the node's view alone
)

DRS_KIND = DeviceKind(
    common_word="Enflame",
    resources=ResourceNames(count=drs.DRS, memory=drs.MEMORY, cores=drs.CORE),
    annotations=AnnotationKeys(
        node_register=drs.CAPACITY_ANNOTATION,
        to_allocate=None,
        allocated="hami.io/enflame-vgpu-devices-allocated",
        use_uuid="enflame.com/use-gpuuuid",
        nouse_uuid="enflame.com/nouse-gpuuuid",
    ),
)

INFO = VendorInfo(name="enflame", display_name="Enflame", kinds=(GCU, DRS_KIND))


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> EnflameSettings:
    return EnflameSettings.model_validate(raw)


@hookimpl
def hami_discover_devices(settings: EnflameSettings) -> list[NodeInventory]:
    return discovery.discover(settings)


@hookimpl
def hami_device_readings(kind: DeviceKind, settings: EnflameSettings) -> list[DeviceReading] | None:
    if kind.common_word != discovery.GCU_WORD:
        return []  # DRS partitions are Enflame's DRS plugin's: this daemon serves whole cards only
    return discovery.runtime_for(settings).readings()


@hookimpl
def hami_node_devices(kind: DeviceKind, annotations: Mapping[str, str], node: str) -> list[Device] | None:
    return drs.node_devices(annotations, node) if kind.common_word == DRS_KIND.common_word else None


@hookimpl
def hami_container_request(kind: DeviceKind, container: Container) -> ContainerRequest | None:
    if kind.common_word == GCU.common_word:
        count = read_count(container, GCU.resources.count, unit="GCUs", limit=1024)
        if not count:
            return None
        return ContainerRequest(kind=GCU.common_word, count=count, memory_percentage=100, cores=100)
    ask = drs.read_ask(container)
    if ask is None:
        return None
    return ContainerRequest(kind=DRS_KIND.common_word, count=1, memory=ask.memory, cores=ask.cores)


@hookimpl
def hami_admission_defaults(kind: DeviceKind, container: Container) -> AdmissionEdit | None:
    if kind.common_word != DRS_KIND.common_word:
        return None
    names = (drs.DRS,) if container.resource(drs.DRS) is not None else (drs.MEMORY, drs.CORE)
    limits = {n: v for n in names if n not in container.limits and (v := container.requests.get(n)) is not None}
    return AdmissionEdit(limits=limits) if limits else None


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
) -> list[NodeFit]:
    if kind.common_word == GCU.common_word:
        return ShareFitter(kind).fit_nodes(pod, requests, nodes, policy)
    return drs.fit_nodes(kind, pod, requests, nodes, policy)


@hookimpl
def hami_simulated_devices(kind: DeviceKind, devices: Sequence[Device], settings: EnflameSettings) -> None:
    if kind.common_word == GCU.common_word:
        discovery.simulate(settings, devices)


@hookimpl
def hami_container_edits(devices: ContainerPlacement, settings: EnflameSettings) -> ContainerEdits:
    return edits.container_edits(settings, devices)


@hookimpl
def hami_host_environment(kind: DeviceKind, indices: Sequence[int]) -> dict[str, str] | None:
    """A host process (`hami run`) sees the placement's whole GCUs, in order, through the selector Enflame's
    runtime reads (``ENFLAME_VISIBLE_DEVICES``, EFML's indices); a DRS instance cannot be made on the host."""
    if kind.common_word != GCU.common_word:
        return None
    return {edits.VISIBLE_DEVICES: ",".join(str(i) for i in indices)}

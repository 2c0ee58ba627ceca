"""The Biren vendor plugin: HAMi v2.10's ``Biren`` kind (``birentech.com/gpu``), whole cards.

Every hook of the vendor, each a thin call into the module that owns the rule:

* metadata here: the ``Biren`` kind, registered as HAMi's Biren device plugin registers it (HAMi's JSON in
  ``hami.io/node-biren-register``, the handshake ``hami.io/node-handshake-biren``), placements in
  ``hami.io/Biren-devices-to-allocate`` and ``hami.io/Biren-devices-allocated`` (HAMi's capital B), selectors
  ``birentech.com/use-gpuuuid``/``nouse-gpuuuid``; settings in `hami_vendor_biren.settings`;
* the scheduler's reading of the register: HAMi gives every card 100 cores whatever the register says
  (`hami_node_devices`), so a card Biren's plugin registered without cores is still placed;
* requests: a count of cards, each with no memory and no cores counted (HAMi's request: 100 % memory asked, nothing
  recorded), fitted by core's share fitter: a card (count 1) serves one container;
* discovery through BRML and container edits (`hami_vendor_biren.node`, the binding in `hami_vendor_biren.brml`),
  and each card's memory in use, busy share, power and temperatures for the node monitor (`hami_device_readings`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hami import hookimpl
from hami.codec import AnnotationError, decode_node_register
from hami.fitting import ShareFitter
from hami.model import (
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
    ResourceNames,
    SchedulingPolicy,
    VendorInfo,
)
from hami.requests import read_count
from hami_vendor_biren import node
from hami_vendor_biren.settings import BirenSettings

__all__ = ["BIREN", "INFO", "BirenSettings"]

REGISTER = "hami.io/node-biren-register"
log = logging.getLogger("hami_vendor_biren")

BIREN = DeviceKind(
    common_word=node.WORD,
    resources=ResourceNames(count="birentech.com/gpu"),
    annotations=AnnotationKeys(
        node_register=REGISTER,
        node_handshake="hami.io/node-handshake-biren",
        to_allocate="hami.io/Biren-devices-to-allocate",
        allocated="hami.io/Biren-devices-allocated",
        use_uuid="birentech.com/use-gpuuuid",
        nouse_uuid="birentech.com/nouse-gpuuuid",
    ),
    reusable_fits=True,  # core's share fitter over the node's view alone
)

INFO = VendorInfo(name="biren", display_name="Biren", kinds=(BIREN,))


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> BirenSettings:
    return BirenSettings.model_validate(raw)


@hookimpl
def hami_discover_devices(settings: BirenSettings) -> list[NodeInventory]:
    return node.discover(settings)


@hookimpl
def hami_device_readings(settings: BirenSettings) -> list[DeviceReading] | None:
    return node.runtime_for(settings).readings()


@hookimpl
def hami_node_devices(annotations: Mapping[str, str], node: str) -> list[Device] | None:
    raw = annotations.get(REGISTER)
    if raw is None:
        return None
    try:
        devices = decode_node_register(raw, REGISTER)
    except AnnotationError as exc:
        log.warning("node %s: ignoring its Biren cards: %s", node, exc)
        return []
    return [d.model_copy(update={"devcore": 100, "vendor": BIREN.common_word}) for d in devices]


@hookimpl
def hami_container_request(container: Container) -> ContainerRequest | None:
    count = read_count(container, BIREN.resources.count, unit="cards", limit=1024)
    return ContainerRequest(kind=BIREN.common_word, count=count) if count else None


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
) -> list[NodeFit]:
    return ShareFitter(kind).fit_nodes(pod, requests, nodes, policy)


@hookimpl
def hami_simulated_devices(devices: Sequence[Device], settings: BirenSettings) -> None:
    node.simulate(settings, devices)


@hookimpl
def hami_container_edits(devices: ContainerPlacement, settings: BirenSettings) -> ContainerEdits:
    return node.container_edits(settings, devices)

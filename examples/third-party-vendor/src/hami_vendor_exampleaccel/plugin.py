"""The ExampleAccel vendor plugin: every hook implementation, in the order a pod meets them.

This module is what the entry point ``exampleaccel = "hami_vendor_exampleaccel.plugin"`` (group
``hami.vendors``) names. hami-core imports it and registers the functions marked ``@hookimpl``; their names
and parameters must match `hami.hookspecs` (a misspelled hook fails at load time). Each hook may take fewer
parameters than its specification lists, never others.

Everything HAMi's vendors share is a core building block called from here: `hami.vendorstate.VendorSettings`
reads the configuration section, `hami.requests.read_share_request` reads resources, `hami.fitting.ShareFitter`
does slot/memory/core accounting, selectors and device policies.
What is left is what makes this device different: its names, where its devices come from, and what a
container needs to see them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from hami import hookimpl
from hami.errors import HamiError
from hami.fitting import ShareFitter
from hami.model import (
    AnnotationKeys,
    Container,
    ContainerEdits,
    ContainerPlacement,
    ContainerRequest,
    Device,
    DeviceKind,
    DeviceNode,
    NodeFit,
    NodeInventory,
    NodeView,
    Pod,
    ResourceNames,
    SchedulingPolicy,
    VendorInfo,
)
from hami.requests import read_share_request
from hami.vendorstate import VendorSettings
from hami_vendor_exampleaccel.inventory import read_inventory, uuid_index

__all__ = [
    "INFO",
    "KIND",
    "ExampleAccelSettings",
    "hami_container_edits",
    "hami_container_request",
    "hami_discover_devices",
    "hami_fit_nodes",
    "hami_vendor_info",
    "hami_vendor_settings",
]

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------------
# Metadata: the names pods, nodes and the scheduler use for this device
# --------------------------------------------------------------------------------------------------------

KIND = DeviceKind(
    common_word="ExampleAccel",
    resources=ResourceNames(
        count="example.com/accel",
        memory="example.com/accel-memory",
        cores="example.com/accel-cores",
    ),
    annotations=AnnotationKeys(
        node_register="hami.io/node-exampleaccel-register",
        node_handshake="hami.io/node-handshake-exampleaccel",
        to_allocate="hami.io/exampleaccel-devices-to-allocate",
        allocated="hami.io/exampleaccel-devices-allocated",
        use_uuid="example.com/use-accel-uuid",
        nouse_uuid="example.com/nouse-accel-uuid",
    ),
)

INFO = VendorInfo(
    name="exampleaccel",
    display_name="ExampleAccel (Example Devices Inc.)",
    kinds=(KIND,),
    isolation_library=None,  # a made-up device: no library enforces the share inside the container
)

ENV_VISIBLE = "EXAMPLEACCEL_VISIBLE_DEVICES"
ENV_MEMORY_LIMIT = "EXAMPLEACCEL_MEMORY_LIMIT_{}"
ENV_CORE_LIMIT = "EXAMPLEACCEL_CORE_LIMIT"
CDI_KIND = "example.com/accel"


class ExampleAccelSettings(VendorSettings):
    """The ``exampleaccel`` section of the configuration: each key in camelCase (``splitCount``, HAMi's style) or as
    the field's name (``split_count``), a misspelled one refused with its name (core's
    `hami.vendorstate.VendorSettings`: every vendor reads its section this way). A vendor with HAMi's
    ``defaultMem``/``defaultCores`` subclasses `hami.requests.ShareDefaults` instead."""

    split_count: int = Field(default=10, ge=1, le=1024, description="how many containers may share one device")
    default_memory: int = Field(
        default=0, ge=0, description="MiB a container gets when it asks for devices without memory (0: whole device)"
    )
    inventory_file: Path = Field(
        default=Path("/etc/exampleaccel/devices.json"), description="JSON file listing the node's devices"
    )


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> ExampleAccelSettings:
    # A pydantic ValidationError is a ValueError: the core reports it as a configuration error naming the key.
    return ExampleAccelSettings.model_validate(raw)


# --------------------------------------------------------------------------------------------------------
# Discovery (node daemon)
# --------------------------------------------------------------------------------------------------------


@hookimpl
def hami_discover_devices(settings: ExampleAccelSettings) -> list[NodeInventory]:
    path = settings.inventory_file
    try:
        inventory = read_inventory(path)
        devices = tuple(
            Device(
                id=d.uuid,
                index=d.index,
                count=settings.split_count,
                devmem=d.memory,
                devcore=100,
                type=d.model,
                numa=d.numa,
                health=d.healthy,
            )
            for d in inventory.devices
        )
    except FileNotFoundError:
        log.info("no ExampleAccel inventory at %s: this node reports no ExampleAccel devices", path)
        return []
    except (OSError, ValueError) as exc:
        log.error("ExampleAccel inventory %s is unusable, reporting no devices: %s", path, exc)
        return []
    if not devices:
        return []
    return [NodeInventory(kind=KIND.common_word, devices=devices)]


# --------------------------------------------------------------------------------------------------------
# Requests (admission webhook and scheduler)
# --------------------------------------------------------------------------------------------------------


@hookimpl
def hami_container_request(
    kind: DeviceKind, container: Container, settings: ExampleAccelSettings
) -> ContainerRequest | None:
    return read_share_request(kind, container, default_memory=settings.default_memory)


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
    return ShareFitter(kind).fit_nodes(pod, requests, nodes, policy)


# --------------------------------------------------------------------------------------------------------
# Container edits (node daemon, answering the kubelet's Allocate)
# --------------------------------------------------------------------------------------------------------


@hookimpl
def hami_container_edits(devices: ContainerPlacement) -> ContainerEdits:
    if not devices:
        return ContainerEdits()
    try:
        indexes = [uuid_index(d.uuid) for d in devices]
    except ValueError as exc:
        raise HamiError(f"cannot give the container its ExampleAccel devices: {exc}") from None
    env = {ENV_VISIBLE: ",".join(d.uuid for d in devices)}
    for position, device in enumerate(devices):
        env[ENV_MEMORY_LIMIT.format(position)] = f"{device.usedmem}m"
    env[ENV_CORE_LIMIT] = str(devices[0].usedcores)  # the same share on every device of one container
    return ContainerEdits(
        env=env,
        devices=tuple(
            DeviceNode(container_path=f"/dev/exampleaccel{i}", host_path=f"/dev/exampleaccel{i}") for i in indexes
        ),
        cdi_devices=tuple(f"{CDI_KIND}={d.uuid}" for d in devices),
    )

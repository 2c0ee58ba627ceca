"""Discovery: this node's DCUs as HAMi's DCU device plugin registers them under ``hami.io/node-dcu-register``.

Owns turning the devices the driver reports (`hami_vendor_hygon.node`) into the DCU `NodeInventory`, with the
values HAMi's plugin writes in its legacy string form: UUID ``DCU-<serial>``, the driver's index, count
``splitCount`` (4), memory the VRAM total in MiB, cores 100 (percent), the type ``DCU-<model>`` by PCI device id
(`hami_vendor_hygon.models`; HAMi's scheduler counts only types holding ``DCU``), the NUMA node ROCm SMI reports,
healthy. A device with no VRAM (HAMi skips those) or no serial number (it could never be named) is not reported,
with a log line saying why; the node keeps serving the others. The compute units are not registered (HAMi's form
has no field for them): allocation reads them from the node runtime.

On simulated devices (`simulate`, `hami_simulated_devices`) the inventory's devices become the node runtime's DCUs:
UUID ``DCU-<serial>``, the PCI address ``driver.bdf``, the DRM nodes ``driver.drmCard`` and ``driver.drmRender``
(``card1``, ``renderD129``), the compute units ``driver.computeUnits`` or else the model table's for the type.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hami.errors import HamiError
from hami.model import Device, NodeInventory
from hami.vendorstate import driver_fact
from hami_vendor_hygon.dtk import Dcu
from hami_vendor_hygon.models import TYPE_PREFIX, compute_units_of, model_of
from hami_vendor_hygon.node import runtime_for
from hami_vendor_hygon.settings import HygonSettings

__all__ = ["MODE_NODE_ANNOTATION", "discover", "inventory", "model_name", "simulate"]

log = logging.getLogger("hami_vendor_hygon")

MODE_NODE_ANNOTATION = "hami.io/dcu-mode"
"""This project's node annotation: the node's ``dcuMode`` (``vdcu`` or ``hami-core``), for people and tools."""


def model_name(device: Dcu) -> str:
    """The type `device` registers under: ``DCU-<model>`` as HAMi's DCU plugin writes it, ``DCU_<id>`` unknown."""
    model = model_of(device.device_id)
    if model is None:
        log.warning("DCU %d has PCI device id 0x%04x, which no model table entry names", device.index,
                    device.device_id)  # fmt: skip
        return f"DCU_{device.device_id:04x}"
    return TYPE_PREFIX + model


def inventory(devices: list[Dcu], settings: HygonSettings, kind: str = "DCU") -> list[NodeInventory]:
    out = []
    for d in devices:
        if d.memory_total <= 0:
            log.warning("DCU %d (%s) reports no VRAM; it is not reported", d.index, d.bdf)
            continue
        if not d.serial:
            log.error("DCU %d (%s) has no serial number, so no UUID; it is not reported", d.index, d.bdf)
            continue
        out.append(
            Device(
                id=d.uuid,
                index=d.index,
                count=settings.split_count,
                devmem=d.memory_total // (1024 * 1024),
                devcore=100,
                type=model_name(d),
                numa=d.numa,
                health=True,
            )
        )
    if not out:
        return []
    return [NodeInventory(kind=kind, devices=tuple(out), annotations={MODE_NODE_ANNOTATION: settings.dcu_mode})]


def discover(settings: HygonSettings) -> list[NodeInventory]:
    """This node's DCU inventory; ``[]`` without a driver or a DCU."""
    return inventory(runtime_for(settings).read_devices(), settings)


def simulate(settings: HygonSettings, devices: Sequence[Device], driver: Mapping[str, Mapping[str, Any]]) -> None:
    """Stand a simulated inventory's `devices` in for the driver's DCUs (see the module's doc).

    :raises HamiError: a device's id is not ``DCU-<serial>``, or a fact it needs is missing."""
    dcus = []
    for device in devices:
        if not device.id.startswith("DCU-"):
            raise HamiError(f"device {device.id}: a DCU's id is DCU-<serial>, as the Hygon discovery registers it")
        facts = driver.get(device.id, {})
        units = driver_fact(driver, device.id, "computeUnits", int) if "computeUnits" in facts else None
        dcus.append(
            Dcu(
                index=device.index,
                bdf=driver_fact(driver, device.id, "bdf", str),
                serial=device.id.removeprefix("DCU-"),
                device_id=0,
                memory_total=device.devmem * 1024 * 1024,
                memory_used=0,
                numa=device.numa,
                compute_units=units if units is not None else compute_units_of(device.type),
                drm=(driver_fact(driver, device.id, "drmCard", str), driver_fact(driver, device.id, "drmRender", str)),
            )
        )
    runtime_for(settings).simulate(dcus)

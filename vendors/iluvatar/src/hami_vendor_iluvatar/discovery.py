"""Discovery: this node's CoreX GPUs as HAMi registers them, one inventory per chip kind.

Owns turning the GPUs ixML reports (`hami_vendor_iluvatar.node`) into `NodeInventory` entries in HAMi's legacy
string form under ``hami.io/node-<chip>-register``: UUID as ixML gives it (``GPU-…``), ixML's index, count
``splitCount``, memory in MiB, cores 100 (percent), the chip's common word as the type, the NUMA node sysfs shows
for the GPU's PCI address (0 where unknown), and health. A GPU's chip is read from its name (``Iluvatar BI-V150S``
is a ``BI-V150``: the longest chip name the model starts with); a GPU of no known chip, or with no memory, is not
reported, with a log line saying why.

Topology: the chips of one board (a BI-V150 has two) are linked, as ixML's ``nvmlDeviceOnSameBoard`` tells;
published in this project's node annotation ``hami.io/node-iluvatar-score`` in the form of HAMi's NVIDIA link scores
(``[{"uuid": …, "score": {peer: 100}}]``, 100 for a chip on the same board), which the topology-aware device policy
reads (`hami_vendor_iluvatar.plugin`). HAMi has no Iluvatar topology; without this annotation a node is served as
HAMi serves it.

On simulated devices (`simulate`, `hami_simulated_devices`) the inventory's devices become the node runtime's GPUs,
each with the device node minor number its ``driver.minor`` gives (ixML's, ``/dev/iluvatar<minor>``) and the PCI
address ``driver.busId`` when given.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hami.codec import encode_link_scores
from hami.model import Device, DeviceKind, DeviceProcess, DeviceReading, NodeInventory
from hami.vendorstate import driver_fact
from hami_vendor_iluvatar.ixml import Gpu
from hami_vendor_iluvatar.node import runtime_for
from hami_vendor_iluvatar.settings import IluvatarSettings

__all__ = [
    "LINK_SCORE_ANNOTATION",
    "MODE_NODE_ANNOTATION",
    "chip_of",
    "device_processes",
    "discover",
    "inventory",
    "simulate",
]

log = logging.getLogger("hami_vendor_iluvatar")

LINK_SCORE_ANNOTATION = "hami.io/node-iluvatar-score"
SAME_BOARD_SCORE = 100
MODE_NODE_ANNOTATION = "hami.io/iluvatar-mode"
"""This project's node annotation: the node's ``iluvatarMode`` (``gpu-manager`` or ``hami-core``)."""


def chip_of(name: str, chips: tuple[str, ...]) -> str | None:
    """The chip of a GPU named `name` (``Iluvatar BI-V150S`` -> ``BI-V150``), None when no chip matches."""
    model = name.strip()
    if model.lower().startswith("iluvatar"):
        model = model[len("iluvatar") :].strip()
    matches = [c for c in chips if model.upper().startswith(c.upper())]
    return max(matches, key=len) if matches else None


def _numa(settings: IluvatarSettings, gpu: Gpu) -> int:
    try:
        value = int((Path(settings.sysfs_root) / "bus" / "pci" / "devices" / gpu.bus_id / "numa_node").read_text())
    except (OSError, ValueError):
        return 0
    return max(value, 0)


def inventory(
    gpus: list[Gpu],
    settings: IluvatarSettings,
    chips: tuple[str, ...],
    boards: Mapping[str, Mapping[str, bool]] | None = None,
) -> list[NodeInventory]:
    by_chip: dict[str, list[Device]] = {}
    for gpu in gpus:
        chip = chip_of(gpu.name, chips)
        if chip is None:
            log.warning("Iluvatar GPU %d (%s, %r) is no chip HAMi knows (%s); it is not reported", gpu.index,
                        gpu.uuid, gpu.name, ", ".join(chips))  # fmt: skip
            continue
        if gpu.memory_total <= 0 and gpu.healthy:
            log.warning("Iluvatar GPU %d (%s) reports no memory; it is not reported", gpu.index, gpu.uuid)
            continue
        by_chip.setdefault(chip, []).append(
            Device(
                id=gpu.uuid,
                index=gpu.index,
                count=settings.split_count,
                devmem=gpu.memory_total >> 20,
                devcore=100,
                type=chip,
                numa=_numa(settings, gpu),
                health=gpu.healthy,
            )
        )
    annotations: dict[str, str] = {MODE_NODE_ANNOTATION: settings.iluvatar_mode}
    reported = {d.id for devices in by_chip.values() for d in devices}
    scores = {u: {p: SAME_BOARD_SCORE for p, same in peers.items() if same and p in reported}
              for u, peers in (boards or {}).items() if u in reported}  # fmt: skip
    if any(scores.values()):
        annotations[LINK_SCORE_ANNOTATION] = encode_link_scores(scores)
    return [NodeInventory(kind=c, devices=tuple(d), annotations=annotations) for c, d in by_chip.items()]


def discover(settings: IluvatarSettings, chips: tuple[str, ...]) -> list[NodeInventory]:
    """This node's inventory per chip; ``[]`` without ixML or a GPU."""
    runtime = runtime_for(settings)
    gpus = runtime.read_gpus()
    return inventory(gpus, settings, chips, runtime.boards)


def device_processes(settings: IluvatarSettings, chip: str, chips: tuple[str, ...]) -> list[DeviceProcess] | None:
    """The compute processes on this node's GPUs of `chip` (the backstop asks per kind), as ixML counts them."""
    runtime = runtime_for(settings)
    return runtime.processes([g for g in runtime.known_gpus() if chip_of(g.name, chips) == chip])


def device_readings(settings: IluvatarSettings, chip: str, chips: tuple[str, ...]) -> list[DeviceReading] | None:
    """What ixML reads from this node's GPUs of `chip` now (the node monitor asks per kind)."""
    runtime = runtime_for(settings)
    return runtime.readings([g for g in runtime.known_gpus() if chip_of(g.name, chips) == chip])


def simulate(
    settings: IluvatarSettings, kind: DeviceKind, devices: Sequence[Device], driver: Mapping[str, Mapping[str, Any]]
) -> None:
    """Stand a simulated inventory's `devices` of `kind` in for ixML's GPUs (see the module's doc).

    :raises HamiError: a device has no integer ``minor``."""
    gpus = [
        Gpu(
            index=device.index,
            uuid=device.id,
            name=device.type or kind.common_word,
            minor=driver_fact(driver, device.id, "minor", int),
            memory_total=device.devmem << 20,
            bus_id=driver_fact(driver, device.id, "busId", str) if "busId" in driver.get(device.id, {}) else "",
            healthy=device.health,
        )
        for device in devices
    ]
    runtime_for(settings).simulate(kind.common_word, gpus)

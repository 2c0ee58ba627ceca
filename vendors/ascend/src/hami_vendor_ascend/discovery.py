"""Discovery: this node's Ascend NPUs as HAMi's Ascend device plugin registers them.

Owns turning the chips the driver reports (`hami_vendor_ascend.node`: DCMI, or ``npu-smi info`` without it) into
one `NodeInventory` per chip kind, with exactly the values HAMi v2.10's ``hami.io/node-register-<CW>`` carries:

* the kind: the configured chip whose ``chipName`` is the driver's chip name (``910B3``, ``310P3``,
  ``Ascend910``), compared exactly, then ignoring case and an ``Ascend`` prefix (an entry the operator configured
  wins over a built-in one naming the same chip); a chip of a name no entry knows is not reported (said in the
  log, with the names that are configured);
* per NPU: the UUID (the die id), the index (its position among the node's NPUs of that kind, as HAMi numbers
  them), the split count (``deviceSplitCount``, else the whole-card memory over the smallest template: 4 for a
  910B3), the memory (the chip's ``memoryAllocatable``), the cores (its AI cores; in soft split, ``hamiVnpuCore``,
  100 × ``deviceCoreScaling``), the type (the common word), NUMA 0, health (DCMI's code 0);
* for 910-series kinds, HAMi's topology hint ``custominfo.NetworkID``: 0 for the first four NPUs and 1 from the
  fifth on (the two HCCS groups of an eight-NPU server), 0 for every 910C die (all on one super-pod fabric);
* the node annotation ``hami-vnpu-core`` (``"true"``/``"false"``): whether the node serves soft-split pods, which
  the scheduler's fit requires of a node before it places a soft-split share there.

For the node-side backstop, `device_processes`: the processes on the node's chips of one kind and the memory DCMI
counts for each (``dcmi_get_device_resource_info``); for the node monitor, `device_readings`: each chip's memory in
use, AI-core busy share, power and temperature; both nothing (None) where the chips come from npu-smi.

A chip without a UUID (a driver that cannot tell its die id) is not reported: a device the scheduler cannot name
could never be allocated. Nothing here writes to the cluster.

On simulated devices (`simulate`, `hami_simulated_devices`) the inventory's devices become the node runtime's chips,
each with the physical id its ``driver.phyId`` gives (what DCMI would report), so container edits run as on NPUs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from hami.model import Device, DeviceKind, DeviceProcess, DeviceReading, NodeInventory
from hami.vendordriver import per_device
from hami.vendorstate import driver_fact
from hami_vendor_ascend.chips import DEFAULT_CHIPS, AscendChip
from hami_vendor_ascend.dcmi import Dcmi, NpuChip
from hami_vendor_ascend.node import runtime_for
from hami_vendor_ascend.settings import AscendSettings

__all__ = [
    "NETWORK_ID",
    "SOFT_SPLIT_NODE_ANNOTATION",
    "common_word_of",
    "device_processes",
    "device_readings",
    "discover",
    "inventories",
    "network_id",
    "simulate",
]

log = logging.getLogger("hami_vendor_ascend")
T = TypeVar("T")

SOFT_SPLIT_NODE_ANNOTATION = "hami-vnpu-core"
"""Node annotation of HAMi's Ascend device plugin: "true" when the node serves soft-split (hami-core) pods."""
NETWORK_ID = "NetworkID"
"""The `custominfo` key of HAMi's 910-series topology hint."""
_910 = "Ascend910"
_910C = "Ascend910C"


def _plain(name: str) -> str:
    folded = name.strip().lower()
    return folded.removeprefix("ascend")


def common_word_of(chip_name: str, chips: Mapping[str, AscendChip]) -> str | None:
    """The configured kind whose ``chipName`` is `chip_name` (exactly, else ignoring case and ``Ascend``); where
    several name it, an entry the operator configured wins over a built-in one."""
    for same in (lambda c: c.chip_name == chip_name, lambda c: _plain(c.chip_name) == _plain(chip_name)):
        found = [word for word, chip in chips.items() if same(chip)]
        if found:
            configured = [w for w in found if chips[w] != DEFAULT_CHIPS.get(w)]
            return (configured or found)[0]
    return None


def network_id(common_word: str, index: int) -> int | None:
    """HAMi's NetworkID of the NPU at `index` of a kind (None for kinds without one: not 910-series)."""
    if not common_word.startswith(_910):
        return None
    if common_word == _910C:
        return 0
    return 1 if index > 3 else 0


def inventories(chips: Sequence[NpuChip], settings: AscendSettings) -> list[NodeInventory]:
    """The node's inventory per kind from the driver's chips (see the module's docstring)."""
    by_kind: dict[str, list[NpuChip]] = {}
    unknown: set[str] = set()
    for chip in chips:
        word = common_word_of(chip.chip_name, settings.chips)
        if word is None:
            unknown.add(chip.chip_name or "(no name)")
            continue
        if not chip.uuid:
            log.error("Ascend chip %s (card %d, device %d) has no die id; it is not reported",
                      chip.chip_name, chip.card_id, chip.device_id)  # fmt: skip
            continue
        by_kind.setdefault(word, []).append(chip)
    if unknown:
        configured = ", ".join(f"{c.chip_name} ({w})" for w, c in settings.chips.items())
        log.error(
            "Ascend chips named %s match no configured chip, so they are not reported; configured: %s. Add an "
            "entry under ascend.chips with chipName set to the name the driver reports",
            ", ".join(sorted(unknown)),
            configured,
        )
    soft = "true" if settings.hami_vnpu_core else "false"
    out = []
    for word, found in by_kind.items():
        chip_config = settings.chips[word]
        devices = []
        for index, chip in enumerate(sorted(found, key=lambda c: c.logic_id)):
            if chip.ai_cores and chip.ai_cores != chip_config.ai_core and not settings.hami_vnpu_core:
                log.debug("chip %s reports %d AI cores, the configuration %d", chip.uuid, chip.ai_cores,
                          chip_config.ai_core)  # fmt: skip
            network = network_id(word, index)
            assert chip.uuid is not None
            devices.append(
                Device(
                    id=chip.uuid,
                    index=index,
                    count=settings.split_count(word),
                    devmem=chip_config.memory_allocatable,
                    devcore=settings.registered_cores(word),
                    type=word,
                    numa=0,
                    health=chip.health == 0,
                    custom={NETWORK_ID: network} if network is not None else {},
                )
            )
        out.append(NodeInventory(kind=word, devices=tuple(devices), annotations={SOFT_SPLIT_NODE_ANNOTATION: soft}))
    return out


def discover(settings: AscendSettings) -> list[NodeInventory]:
    """This node's Ascend inventory; ``[]`` when there is no driver or no NPU."""
    return inventories(runtime_for(settings).read_chips(), settings)


def device_processes(settings: AscendSettings, common_word: str) -> list[DeviceProcess] | None:
    """The processes on this node's chips of kind `common_word` (the backstop asks per kind) and the memory DCMI
    counts for each; None without DCMI, or when it fails this round (then nothing is checked rather than
    something half-read)."""
    return _per_chip(settings, common_word, "processes", lambda dcmi, chip, uuid: [
        DeviceProcess(device_uuid=uuid, pid=pid, used_bytes=used)
        for pid, used in dcmi.processes(chip.card_id, chip.device_id)])  # fmt: skip


def device_readings(settings: AscendSettings, common_word: str) -> list[DeviceReading] | None:
    """What DCMI reads from this node's chips of kind `common_word` now; None as for `device_processes` (the
    monitor then shows the chips' figures unknown)."""
    return _per_chip(settings, common_word, "figures", lambda dcmi, chip, uuid: [
        dcmi.readings(chip.card_id, chip.device_id, uuid)])  # fmt: skip


def _per_chip(
    settings: AscendSettings, common_word: str, what: str, read: Callable[[Dcmi, NpuChip, str], list[T]]
) -> list[T] | None:
    runtime = runtime_for(settings)
    with runtime.lock:
        if runtime.simulated is not None:
            return None
        chips = runtime.chips if runtime.source == "dcmi" else runtime.read_chips()
        dcmi = runtime.dcmi
        if runtime.source != "dcmi" or dcmi is None:
            return None
        mine = [(c, c.uuid) for c in chips if c.uuid and common_word_of(c.chip_name, settings.chips) == common_word]
        return per_device(log, f"the Ascend chips' {what}", mine, lambda pair: read(dcmi, pair[0], pair[1]))


def simulate(
    settings: AscendSettings, kind: DeviceKind, devices: Sequence[Device], driver: Mapping[str, Mapping[str, Any]]
) -> None:
    """Stand a simulated inventory's `devices` of `kind` in for the driver's chips (``driver.phyId`` each).

    :raises HamiError: a device has no integer ``phyId``."""
    chip_name = settings.chips[kind.common_word].chip_name
    chips = [
        NpuChip(
            card_id=device.index,
            device_id=0,
            logic_id=device.index,
            phy_id=driver_fact(driver, device.id, "phyId", int),
            chip_type="Ascend",
            chip_name=chip_name,
            ai_cores=None,
            health=0 if device.health else 1,
            uuid=device.id,
            memory_mib=device.devmem,
        )
        for device in devices
    ]
    runtime_for(settings).simulate(kind.common_word, chips)

"""Simulated devices: a node's inventory read from a file instead of from the vendors' drivers.

With `simulatedInventory` set (`hami node --simulated-inventory FILE`), the node daemon does not call any
vendor's `hami_discover_devices`: every discovery round reads the file and reports the devices listed there
for its node, grouped by the vendor that owns each device kind. Everything after discovery is unchanged:
the register annotations, the device plugins and their ListAndWatch, Allocate with the vendor's
`hami_allocate` and `hami_container_edits`, the metrics. So any vendor works on simulated devices, and the
scheduler cannot tell them from real ones. What a vendor's Allocate would ask its driver (a physical id, a PCI
address) comes from each device's `driver` facts (`hami_simulated_devices`); what it does on the hardware
(creating a MIG instance, for example) finds no driver, and the vendor answers as it does without one.

This is how `hami demo` runs its nodes (`examples/demo-inventory.yaml`), and how a user tries a hardware
mix of their own. The file is re-read every round, so editing it (a device's `health: false`, a new card)
is seen within `discoveryIntervalSeconds`; a file that became unreadable is reported and the last good
inventory kept.

The format (YAML or JSON); device fields are those of HAMi's register annotation:

    nodes:
      - name: gpu-node                  # the Node's name (`hami node --node-name`)
        labels: {gpu: h100}             # optional: Node labels (used by `hami demo` when it creates the node)
        cpu: "64"                       # optional: allocatable CPU and memory (quantities), likewise
        memory: 512Gi
        annotations:                    # optional: further node annotations a vendor's discovery would publish,
          hami.io/node-nvidia-score: [] #   e.g. link scores; a value that is not a string is written as JSON
        devices:
          - kind: NVIDIA                # the device kind: HAMi's common word (`hami vendors` lists them)
            type: NVIDIA-H100-80GB-HBM3 # the model as the vendor registers it
            id: GPU-h100                # the UUID; with `repeat`, the prefix of `<id>-<index>` for each device
            repeat: 8                   # that many identical devices, indexes from `index` (default 0) up
            devmem: 81920               # memory in MiB
            devcore: 100                # compute in percent of one device (default 100)
            count: 10                   # how many containers may share one device (default 10)
            numa: [0, 0, 0, 0, 1, 1, 1, 1]  # NUMA node: one number, or one per repeated device (default 0)
            health: true                # default true
            mode: hami-core             # sharing mode (`mig` for a MIG-mode GPU, with `migProfiles`)
            migProfiles: []             # the vendor's MIG profiles, as its register annotation writes them
            devicevendor: ""            # HAMi's `devicevendor`, when the kind's register carries it
            custominfo: {}              # vendor-specific extras (`custominfo`)
            driver: {}                  # what the vendor's driver would say beyond the register entry (a
                                        #   physical id, a PCI address): one mapping, or one per repeated device
            reading:                    # what its management library would read now (the node monitor's device
              memoryUsedMiB: 20480      #   figures, `hami_device_readings`): memory in use, busy percent, watts,
              utilization: 35           #   degrees Celsius; a figure left out is unknown. One mapping, or one per
              power: 310                #   repeated device. Nonsense (a negative, more memory than the device)
              temperature: 58           #   is shown as unknown, as from a driver

`driver` facts are not published: each round the node daemon hands every vendor its devices with their facts
(`hami_simulated_devices`), and the vendor keeps them where its discovery keeps what the driver reported, so its
Allocate and container edits run as on hardware. The keys are the vendor's (its README lists them).

With `reading` on a device, the node monitor exports what that device would read (memory in use, busy share,
power, temperature) where a vendor's `hami_device_readings` would answer on hardware: the demo's dashboard shows
usage beside the grants. Containers on simulated devices run no process, so their own usage stays unknown.

It owns reading and validating that file (errors name the file, the node, the device entry and the field)
and turning one node's entries into `NodeInventory` per kind (the node's `annotations` travel with the first
kind a loaded vendor serves) and their `driver` facts for the vendors; it must not know any vendor.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hami.errors import ConfigError, HamiError
from hami.model import Device, DeviceReading, NodeInventory
from hami.plugins import VendorPlugins
from hami.validation import describe_error, nearest

__all__ = [
    "DeviceEntry",
    "InventoryFile",
    "SimulatedNode",
    "SimulatedReading",
    "discover",
    "load_inventory",
    "readings",
]

log = logging.getLogger(__name__)


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class SimulatedReading(_Entry):
    """What a device's management library would read now; a figure left out is unknown."""

    memory_used_mib: float | None = Field(default=None, alias="memoryUsedMiB")
    utilization: float | None = Field(default=None, description="busy percent")
    power: float | None = Field(default=None, description="watts")
    temperature: float | None = Field(default=None, description="degrees Celsius")


class DeviceEntry(_Entry):
    """One device, or `repeat` identical devices, of a simulated node."""

    kind: str = Field(min_length=1, description="the device kind's common word, e.g. NVIDIA or Ascend910B3")
    id: str = Field(min_length=1, description="the device UUID, or with `repeat` the prefix of `<id>-<index>`")
    repeat: int = Field(default=1, ge=1, le=1024)
    index: int = Field(default=0, ge=0, description="the driver's index (of the first device, with `repeat`)")
    type: str = ""
    devmem: int = Field(ge=0, description="memory in MiB")
    devcore: int = Field(default=100, ge=0)
    count: int = Field(default=10, ge=1, description="split count: containers that may share one device")
    numa: int | list[int] = 0
    health: bool = True
    mode: str = ""
    mig_profiles: list[Any] = Field(default_factory=list, alias="migProfiles")
    devicevendor: str = ""
    custominfo: dict[str, Any] = Field(default_factory=dict)
    driver: dict[str, Any] | list[dict[str, Any]] = Field(
        default_factory=dict, description="the vendor driver's facts: one mapping, or one per repeated device"
    )
    reading: SimulatedReading | list[SimulatedReading] | None = Field(
        default=None, description="what the management library would read now: one mapping, or one per device"
    )

    @model_validator(mode="after")
    def _numa_per_device(self) -> DeviceEntry:
        if isinstance(self.numa, list) and len(self.numa) != self.repeat:
            raise ValueError(f"numa lists {len(self.numa)} nodes for {self.repeat} devices: give one per device")
        if isinstance(self.driver, list) and len(self.driver) != self.repeat:
            raise ValueError(f"driver lists {len(self.driver)} entries for {self.repeat} devices: give one per device")
        if isinstance(self.reading, list) and len(self.reading) != self.repeat:
            raise ValueError(
                f"reading lists {len(self.reading)} entries for {self.repeat} devices: give one per device"
            )
        return self

    def readings(self) -> list[DeviceReading]:
        """The `reading` of each device that has one, as the vendors' `hami_device_readings` answer."""
        if self.reading is None:
            return []
        ids = [d.id for d in self.devices()]
        per = self.reading if isinstance(self.reading, list) else [self.reading] * len(ids)
        mib = 1024 * 1024
        return [
            DeviceReading(
                device_uuid=uuid,
                memory_used_bytes=None if r.memory_used_mib is None else int(r.memory_used_mib * mib),
                utilization_percent=r.utilization,
                power_watts=r.power,
                temperature_celsius=r.temperature,
                driver_version="simulated",
            )
            for uuid, r in zip(ids, per, strict=True)
        ]

    def driver_facts(self) -> dict[str, dict[str, Any]]:
        """Device id → the `driver` facts of that device."""
        ids = [d.id for d in self.devices()]
        facts = self.driver if isinstance(self.driver, list) else [self.driver] * len(ids)
        return dict(zip(ids, facts, strict=True))

    def devices(self) -> list[Device]:
        """The devices this entry stands for. :raises ValueError: a field a `Device` refuses."""
        out = []
        for i in range(self.repeat):
            numa = self.numa[i] if isinstance(self.numa, list) else self.numa
            out.append(
                Device(
                    id=self.id if self.repeat == 1 else f"{self.id}-{self.index + i}",
                    index=self.index + i,
                    count=self.count,
                    devmem=self.devmem,
                    devcore=self.devcore,
                    type=self.type,
                    numa=numa,
                    health=self.health,
                    mode=self.mode,
                    mig_profiles=tuple(self.mig_profiles),
                    vendor=self.devicevendor,
                    custom=self.custominfo,
                )
            )
        return out


class SimulatedNode(_Entry):
    """One node of the inventory file."""

    name: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    cpu: str | None = Field(default=None, description="allocatable CPU, a quantity such as 32 or 32000m")
    memory: str | None = Field(default=None, description="allocatable memory, a quantity such as 256Gi")
    annotations: dict[str, Any] = Field(default_factory=dict)
    devices: list[DeviceEntry] = Field(default_factory=list)

    @field_validator("cpu", "memory", mode="before")
    @classmethod
    def _quantity(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _unique_ids(self) -> SimulatedNode:
        seen: set[str] = set()
        for entry in self.devices:
            for device in entry.devices():
                if device.id in seen:
                    raise ValueError(f"device id {device.id} appears twice on node {self.name}")
                seen.add(device.id)
        return self

    def published_annotations(self) -> dict[str, str]:
        """`annotations` as node annotation values: strings as they are, anything else as compact JSON."""
        return {
            key: value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            for key, value in self.annotations.items()
        }

    def driver_facts(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Kind → device id → the `driver` facts of that device."""
        by_kind: dict[str, dict[str, dict[str, Any]]] = {}
        for entry in self.devices:
            by_kind.setdefault(entry.kind, {}).update(entry.driver_facts())
        return by_kind

    def inventories(self) -> dict[str, NodeInventory]:
        """Kind → the node's devices of that kind, in the order the file lists the kinds."""
        by_kind: dict[str, list[Device]] = {}
        for entry in self.devices:
            by_kind.setdefault(entry.kind, []).extend(entry.devices())
        return {kind: NodeInventory(kind=kind, devices=tuple(devices)) for kind, devices in by_kind.items()}


class InventoryFile(_Entry):
    """The whole file: a list of nodes."""

    nodes: list[SimulatedNode] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_nodes(self) -> InventoryFile:
        names = [n.name for n in self.nodes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"node {', '.join(twice)} is listed more than once")
        return self

    def node(self, name: str, source: str = "the inventory") -> SimulatedNode:
        """The node called `name`. :raises ConfigError: the file lists no such node."""
        for node in self.nodes:
            if node.name == name:
                return node
        listed = ", ".join(n.name for n in self.nodes)
        raise ConfigError(f"{source} lists no node {name!r} (it lists {listed}): add it, or fix --node-name")


def load_inventory(path: str | Path) -> InventoryFile:
    """Read and validate an inventory file. :raises ConfigError: unreadable, not YAML, or not the format."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the simulated inventory {path}: {exc.strerror}") from None
    try:
        import yaml

        data = yaml.safe_load(text)
    except Exception as exc:
        raise ConfigError(f"the simulated inventory {path} is not valid YAML: {exc}") from None
    try:
        return InventoryFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_problems(exc, data)}") from None


def _problems(exc: ValidationError, data: Any) -> str:
    """The one error format (`hami.validation`), with node names for list positions: `nodes[gpu-node].…`."""

    def label(position: int, index: Any) -> str | None:
        if position != 1 or not isinstance(data, Mapping):
            return None
        try:
            node = data["nodes"][index]
        except (TypeError, KeyError, IndexError):
            return None
        name = node.get("name") if isinstance(node, Mapping) else None
        return str(name) if name else None

    return "; ".join(describe_error(error, InventoryFile, label) for error in exc.errors())


def discover(path: str | Path, node: str, plugins: VendorPlugins) -> dict[str, list[NodeInventory]]:
    """What `VendorPlugins.discover` would answer on `node`, from the inventory file: vendor → inventories.

    Each serving vendor is first handed its devices and their `driver` facts (`VendorPlugins.simulated_devices`);
    a vendor refusing them is logged, and its devices still reported. Kinds no loaded vendor serves are left
    out, with a warning. :raises ConfigError: the file is unusable or does not list the node."""
    entry = load_inventory(path).node(node, str(path))
    facts = entry.driver_facts()
    found: dict[str, list[NodeInventory]] = {vendor.name: [] for vendor in plugins.vendors}
    extra = entry.published_annotations()  # published with the first kind that is served
    for kind, inventory in entry.inventories().items():
        try:
            vendor = plugins.owner(kind).name
        except KeyError:
            served = [k.common_word for k in plugins.kinds]
            near = nearest(kind, served)
            log.warning(
                "%s lists %s devices on node %s, but no loaded vendor serves that kind%s; served kinds: %s "
                "(see `hami vendors`)",
                path, kind, node, f" (did you mean {near!r}?)" if near else "", ", ".join(served) or "none",
            )  # fmt: skip
            continue
        try:
            plugins.simulated_devices(kind, inventory.devices, facts.get(kind, {}))
        except HamiError as exc:
            log.error("%s, node %s, the %s devices' driver facts: %s", path, node, kind, exc)
        found[vendor].append(inventory.model_copy(update={"annotations": extra}) if extra else inventory)
        extra = {}
    return found


def readings(path: str | Path, node: str) -> list[DeviceReading]:
    """What the inventory says the node's devices read now (`reading`), for the node monitor; [] when the file
    cannot be used this round (discovery logs why)."""
    try:
        entry = load_inventory(path).node(node, str(path))
    except ConfigError:
        return []
    return [r for device in entry.devices for r in device.readings()]

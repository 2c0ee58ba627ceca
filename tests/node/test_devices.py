"""What the kubelet is told: advertised device IDs per register format, and preferred allocations."""

from __future__ import annotations

from scripted_vendor import CAPACITY, LEGACY, SCRIPTED

from hami.model import Device
from hami.node.devices import ResourceRole, advertised_devices, preferred_ids, resources_of

DEVICES = (
    Device(id="B", index=1, count=2, devmem=3072, numa=1, health=False),
    Device(id="A", index=0, count=3, devmem=2048),
)


def test_shared_kinds_advertise_one_id_per_share_in_device_order() -> None:
    for kind in (SCRIPTED, LEGACY):
        advertised = advertised_devices(kind, ResourceRole.COUNT, DEVICES)
        assert [(d.id, d.device, d.healthy, d.numa) for d in advertised] == [
            ("A-0", "A", True, 0), ("A-1", "A", True, 0), ("A-2", "A", True, 0),
            ("B-0", "B", False, 1), ("B-1", "B", False, 1),
        ]  # fmt: skip
        assert [r.name for r in resources_of(kind)] == [kind.resources.count]


def test_capacity_kinds_advertise_devices_and_memory_units() -> None:
    assert [r.role for r in resources_of(CAPACITY)] == [ResourceRole.COUNT, ResourceRole.MEMORY]
    assert [d.id for d in advertised_devices(CAPACITY, ResourceRole.COUNT, DEVICES)] == ["A", "B"]
    memory = advertised_devices(CAPACITY, ResourceRole.MEMORY, DEVICES)
    assert [d.id for d in memory] == ["A-mem-0", "A-mem-1", "B-mem-0", "B-mem-1", "B-mem-2"]  # 1024 MiB units


def test_preferred_allocation_spreads_over_cards_and_honours_must_include() -> None:
    physical = {f"{card}-{i}": card for card in "XYZ" for i in range(3)}
    available = sorted(physical)
    assert preferred_ids(available, [], 2, physical) == ["X-0", "Y-0"]
    assert preferred_ids(available, ["Y-2"], 3, physical) == ["Y-2", "X-0", "Z-0"]
    assert preferred_ids(["X-0", "X-1", "Y-0"], [], 3, physical) == ["X-0", "Y-0", "X-1"]

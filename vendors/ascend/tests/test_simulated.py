"""Simulated NPUs (`hami node --simulated-inventory`, `hami demo`): the inventory's ``driver.phyId`` reaches the
container edits through `hami_simulated_devices`, where DCMI's physical ids do on a node, and no driver is asked.

The host is given a DCMI library and an npu-smi that do not exist: any read of the driver would find no chip and
the edits would refuse the placement ("not on this node").
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami.errors import HamiError
from hami.model import Container, ContainerDevice, Pod
from hami.node import simulated
from hami.plugins import VendorPlugins
from hami_vendor_ascend import plugin

POD = Pod(name="p", namespace="ns", uid="uid-1", containers=(Container(name="main"),))


def plugins(tmp_path: Path) -> VendorPlugins:
    config = {"dcmiLibrary": str(tmp_path / "no-libdcmi.so"), "npuSmi": str(tmp_path / "no-npu-smi")}
    return VendorPlugins.from_plugins({"ascend": plugin}, config={"ascend": config})


def inventory(tmp_path: Path, driver: Any) -> Path:
    entry = {"kind": "Ascend910B3", "type": "Ascend910B3", "id": "NPU-sim", "repeat": 2, "index": 4,
             "devmem": 65536, "devcore": 20, "count": 4, "driver": driver}  # fmt: skip
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"name": "n", "devices": [entry]}]}))
    return path


def whole(*uuids: str) -> tuple[ContainerDevice, ...]:
    return tuple(ContainerDevice(uuid=u, type="Ascend910B3", usedmem=65536, usedcores=20) for u in uuids)


def test_the_inventorys_physical_ids_are_what_the_container_sees(tmp_path: Path) -> None:
    h = plugins(tmp_path)
    found = simulated.discover(inventory(tmp_path, [{"phyId": 6}, {"phyId": 7}]), "n", h)
    assert [d.id for d in found["ascend"][0].devices] == ["NPU-sim-4", "NPU-sim-5"]
    edits = h.container_edits("Ascend910B3", POD, 0, whole("NPU-sim-5", "NPU-sim-4"))
    assert edits.env == {"ASCEND_VISIBLE_DEVICES": "7,6"}  # placement order, the inventory's physical ids


def test_a_device_without_a_physical_id_is_logged_by_name_and_refused_at_allocate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = plugins(tmp_path)
    with caplog.at_level(logging.ERROR):
        found = simulated.discover(inventory(tmp_path, {"phyID": 0}), "n", h)
    assert len(found["ascend"][0].devices) == 2  # still published: the scheduler may place them
    assert "device NPU-sim-4 has no driver.phyId (an integer) in the simulated inventory: add it" in caplog.text
    with pytest.raises(HamiError, match="NPU-sim-4 is not on this node"):
        h.container_edits("Ascend910B3", POD, 0, whole("NPU-sim-4"))


def test_a_physical_id_of_another_type_is_named() -> None:
    with pytest.raises(HamiError, match=r"device NPU-x: driver.phyId is '3' in the simulated inventory, not an"):
        VendorPlugins.from_plugins({"ascend": plugin}).simulated_devices(
            "Ascend910B3", simulated.DeviceEntry(kind="Ascend910B3", id="NPU-x", devmem=1).devices(),
            {"NPU-x": {"phyId": "3"}},
        )  # fmt: skip
